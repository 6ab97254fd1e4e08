"""`krt up [--detach]`, `krt down`, `krt status`: the embedded platform's entry points.

Each `main_*` parses its own arguments and returns the exit code: `up` 4 when the platform cannot
start, `status` 1 when it is not running; everything else 0. The state dir is KRT_STATE_DIR.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kruntimes.activities.hosts.process import host_running, list_records
from kruntimes.cli import output as cli_output
from kruntimes.sdk import config as clientconfig
from kruntimes.system import logs
from kruntimes.temporal.devserver import DevServerError
from kruntimes.workers.embedded import supervise
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout, recorded_components

STATUS_COLUMNS = ("COMPONENT", "STATE", "PID", "ISOLATION")


def isolation_line() -> str:
    if supervise.default_isolation() == "uid":
        return "each function its own unprivileged uid, PID and mount namespace"
    return (
        "same-user: not root, so functions run as you and can read what you can "
        "(run `krt up` as root for a uid per function)"
    )


def summary(layout: Layout, config: clientconfig.ClientConfig) -> str:
    return (
        f"kruntimes is up (state in {layout.root})\n"
        f"  Temporal UI   {config.uiUrl}\n"
        f"  Temporal      {config.temporalAddress}\n"
        f"  Gateway       {config.gatewayUrl}  (CA {config.caFile})\n"
        f"  client config {layout.client}  (the CLI and SDK read it)\n"
        f"  isolation     {isolation_line()}\n"
        f"  try: krt run create hello --runtime python --source examples/hello --handler main:handle --wait"
    )


def _config(layout: Layout) -> clientconfig.ClientConfig:
    return clientconfig.load({"KRT_STATE_DIR": str(layout.root)})


def up(layout: Layout, *, detach: bool) -> int:
    """In the foreground until SIGINT/SIGTERM, or (detach) in the background once it is ready."""
    if not detach:
        return supervise.run_foreground(
            layout, on_ready=lambda config: print(summary(layout, config), flush=True)
        )
    supervise.start_detached(layout)
    print(summary(layout, _config(layout)))
    return 0


def down(layout: Layout) -> int:
    stopped = supervise.stop(layout)
    # what a platform that died (or had to be killed) left behind: its components, its hosts
    components = supervise.stop_leftover_components(layout)
    hosts = supervise.stop_leftover_hosts(layout)
    left = [f"{n} {what}" for n, what in ((components, "component(s)"), (hosts, "host(s)")) if n]
    suffix = f" (stopped {' and '.join(left)} it left running)" if left else ""
    if stopped:
        print(f"kruntimes stopped ({layout.root}){suffix}")
    else:
        print(f"kruntimes is not running from {layout.root}{suffix}")
    return 0


def status_rows(layout: Layout, *, pid: int | None) -> list[dict[str, str | int]]:
    """The platform (running as `pid`, or not), its components and its hosts:
    {"component", "state" (up|down), "pid"}."""
    components = recorded_components(layout) if pid is not None else {}
    rows: list[dict[str, str | int]] = [
        {"component": "platform", "state": _state(pid is not None), "pid": pid or 0, "isolation": "-"}
    ]
    rows += [
        {"component": n, "state": _state(supervise.alive(p)), "pid": p, "isolation": "-"}
        for n, p in components.items()
    ]
    if layout.hosts.exists():
        rows += [
            {
                "component": f"host {h.hostId}",
                "state": _state(host_running(h)),
                "pid": h.pid or 0,
                "isolation": h.isolation or "unknown",
            }
            for h in list_records(layout.root)
        ]
    return rows


def _state(up: bool) -> str:
    return "up" if up else "down"


def status(layout: Layout, *, output: str) -> int:
    pid = supervise.running(layout)
    rows = status_rows(layout, pid=pid)
    config = _config(layout)
    if output == "json":
        document = {
            "stateDir": str(layout.root),
            "uiUrl": config.uiUrl,
            "gatewayUrl": config.gatewayUrl,
            "components": rows,
        }
        sys.stdout.write(cli_output.render(document, "json"))
    else:
        cells = [[str(row[column.lower()]) for column in STATUS_COLUMNS] for row in rows]
        sys.stdout.write(cli_output.table(STATUS_COLUMNS, cells))
        if pid:
            print(f"Temporal UI {config.uiUrl}   gateway {config.gatewayUrl}")
    return 0 if pid else 1


def _layout() -> Layout:
    return Layout(clientconfig.state_dir())


def main_up(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="krt up", description="Start the embedded platform on this machine."
    )
    parser.add_argument(
        "-d", "--detach", action="store_true", help="run in the background (stop with krt down)"
    )
    args = parser.parse_args(argv)
    logs.setup("warning")
    try:
        return up(_layout(), detach=args.detach)
    except (PlatformError, DevServerError, OSError) as exc:
        print(f"krt: {exc}", file=sys.stderr)
        return 4


def main_down(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="krt down", description="Stop the embedded platform.").parse_args(argv)
    return down(_layout())


def main_status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="krt status", description="Show the embedded platform's components."
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args(argv)
    return status(_layout(), output=args.output)


MAIN: dict[str, Callable[[list[str]], int]] = {"up": main_up, "down": main_down, "status": main_status}
