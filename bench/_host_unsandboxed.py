"""`krt host` without function isolation (HostOptions.sandbox=None), for benches that measure what
isolation costs next to the same host with it, in one run. Not a product path: no flag of
`krt host` turns isolation off."""

from __future__ import annotations

import dataclasses

import _benchlib  # noqa: F401  (puts the repo root on sys.path)

from kruntimes.system import logs
from kruntimes.workers.host import options_from, parse_args, serve


def main() -> None:
    args = parse_args()
    logs.setup(args.log_level)
    serve(dataclasses.replace(options_from(args), sandbox=None), ready_file=args.ready_file)


if __name__ == "__main__":
    main()
