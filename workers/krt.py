"""The `krt` console script: the process entry points of workers/ and the SDK's command line.

`krt host|install-host|worker|gateway|codec-server|pki|demo|up|down|status` hand their arguments, as
they are, to
the process entry points (of this package, and the gateway's); every other command line goes to
`kruntimes.cli` (the SDK's commands, the help and the usage errors). The exit codes are
kruntimes.cli's; ^C is 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from kruntimes import cli
from kruntimes.cli_parser import PASSTHROUGH


def _host(argv: list[str]) -> int:
    from workers import host

    host.main(argv)
    return cli.OK


def _install_host(argv: list[str]) -> int:
    from workers import install_host

    return install_host.main(argv)


def _worker(argv: list[str]) -> int:
    from workers import worker

    worker.main(argv)
    return cli.OK


def _gateway(argv: list[str]) -> int:
    from gateway import __main__ as gateway

    gateway.main(argv)
    return cli.OK


def _codec_server(argv: list[str]) -> int:
    from gateway import codec_server

    codec_server.main(argv)
    return cli.OK


def _pki(argv: list[str]) -> int:
    from kruntimes.pki import command

    return command.main(argv)


def _demo(argv: list[str]) -> int:
    from workers import demo

    return demo.main(argv)


def _embedded(entry: str) -> Callable[[list[str]], int]:
    def call(argv: list[str]) -> int:
        from workers.embedded import commands

        return int(commands.MAIN[entry](argv) or cli.OK)

    return call


def _fn(argv: list[str]) -> int:
    from workers import fn_runner

    return fn_runner.main_fn(argv)


def _fn_runner(argv: list[str]) -> int:
    from workers import fn_runner

    return fn_runner.main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "host": _host,
    "install-host": _install_host,
    "worker": _worker,
    "demo": _demo,
    "gateway": _gateway,
    "codec-server": _codec_server,
    "pki": _pki,
    "up": _embedded("up"),
    "down": _embedded("down"),
    "status": _embedded("status"),
    "fn": _fn,
    "fn-runner": _fn_runner,
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
