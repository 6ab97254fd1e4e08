"""`python -m kruntimes.workers.embedded [up|down|status] ARGS...` (up when no command is given)."""

from __future__ import annotations

import sys

from kruntimes.cli.main import leave
from kruntimes.workers.embedded.commands import MAIN


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("up", [])
    if command not in MAIN:
        print(f"usage: python -m kruntimes.workers.embedded [{'|'.join(MAIN)}] ARGS...", file=sys.stderr)
        return 2
    return MAIN[command](rest)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
