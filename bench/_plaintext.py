"""The invoke bench's plaintext baseline: `python bench/_plaintext.py gateway|host ARGS...` runs
`python -m gateway ARGS` or `python -m kruntimes.workers.host ARGS` with the gateway → host invoke hop (the
raw invoke port) in plaintext. Everything else — heartbeats, registering — is mutual TLS as always.
Only bench/invoke.py runs it, to measure what TLS costs on that hop; no entry point of the
platform can turn TLS off.
"""

from __future__ import annotations

import sys

import _benchlib  # noqa: F401 - puts the repository root on sys.path


def main() -> None:
    role, argv = sys.argv[1], sys.argv[2:]
    if role == "gateway":
        from kruntimes.workers.gateway import main as serve
    elif role == "host":
        from kruntimes.workers.host import main as serve
    else:
        raise SystemExit(f"usage: {sys.argv[0]} gateway|host ARGS...")
    serve(argv, invoke_tls=False)


if __name__ == "__main__":
    main()
