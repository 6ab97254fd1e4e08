"""`krt`: the kruntimes command line.

Subcommands grow with the platform; each delegates to an entry point in workers/ or to the SDK.
Errors are one clear line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = """usage: krt <command> [options]

commands:
  host      run a runtime host (the Runtime Server)   krt host --help
  worker    run the Temporal worker                   krt worker --help
  demo      run the end-to-end demo                   krt demo
"""


def _host(argv: list[str]) -> int:
    from workers import host

    host.main(argv)
    return 0


def _worker(argv: list[str]) -> int:
    from workers import worker

    worker.main(argv)
    return 0


def _demo(argv: list[str]) -> int:
    from workers import demo

    return demo.main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {"host": _host, "worker": _worker, "demo": _demo}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0 if args else 2)
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"krt: unknown command {args[0]!r}; run `krt --help` for the list", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(command(args[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
