"""The `krt` console script: the process entry points of workers/ and the SDK's command line.

`krt host|install-host|worker|gateway|codec-server|pki|demo|up|down|status` hand their arguments, as
they are, to
the process entry points (of this package, and the gateway's); every other command line goes to
`kruntimes.cli.main` (the SDK's commands, the help and the usage errors). The exit codes are
kruntimes.cli.main's; ^C is 130.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from kruntimes.cli import main as cli
from kruntimes.cli.parser import PASSTHROUGH


def _entry(module: str, function: str = "main") -> Callable[[list[str]], int]:
    """The command that hands its arguments to `function` of `module`, imported only when it runs
    (a process loads what its own command needs); one that returns nothing exits OK."""

    def call(argv: list[str]) -> int:
        return int(getattr(importlib.import_module(module), function)(argv) or cli.OK)

    return call


def _embedded(entry: str) -> Callable[[list[str]], int]:
    def call(argv: list[str]) -> int:
        from kruntimes.workers.embedded import commands

        return int(commands.MAIN[entry](argv) or cli.OK)

    return call


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "host": _entry("kruntimes.workers.host"),
    "install-host": _entry("kruntimes.workers.install_host"),
    "worker": _entry("kruntimes.workers.worker"),
    "demo": _entry("kruntimes.workers.demo"),
    "gateway": _entry("kruntimes.workers.gateway"),
    "codec-server": _entry("kruntimes.workers.codec_server"),
    "pki": _entry("kruntimes.workers.pki"),
    "up": _embedded("up"),
    "down": _embedded("down"),
    "status": _embedded("status"),
    "fn": _entry("kruntimes.workers.fn_runner", "main_fn"),
    "fn-runner": _entry("kruntimes.workers.fn_runner"),
    "mcp": _entry("kruntimes.workers.mcp"),
}
assert set(COMMANDS) == set(PASSTHROUGH)


def run(argv: list[str]) -> int:
    """Run one command line and return its exit code."""
    if argv and argv[0] in COMMANDS:
        try:
            return COMMANDS[argv[0]](argv[1:])
        except KeyboardInterrupt:
            return cli.INTERRUPTED
    return cli.run(argv)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cli.leave(run(args))


if __name__ == "__main__":
    main()
