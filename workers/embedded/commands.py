"""`krt up [--detach]`, `krt down`, `krt status`: the embedded platform's entry points.

Each `main_*` parses its own arguments and returns the exit code: `up` 4 when the platform cannot
start (or a platform, or a process of one, still runs from the state dir), `status` 1 when any
component is not running; everything else 0. The state dir is KRT_STATE_DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from kruntimes.activities.hosts.process import host_running, list_records
from kruntimes.cli import components
from kruntimes.cli import output as cli_output
from kruntimes.sdk import config as clientconfig
from kruntimes.system import logs
from kruntimes.temporal.devserver import DevServerError
from kruntimes.workers.embedded import supervise
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout, recorded

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
        f"  Temporal UI   {config.uiUrl}  (`krt ui` gives you a login link)\n"
        f"  Temporal      {config.temporalAddress}  (mutual TLS; the temporal CLI:"
        f" TEMPORAL_CONFIG_FILE={layout.temporal_cli_config})\n"
        f"  Gateway       {config.gatewayUrl}  (CA {config.caFile})\n"
        f"  client config {layout.client}  (the CLI and SDK read it)\n"
        f"  control plane {control_plane_line(layout)}\n"
        f"  isolation     {isolation_line()}\n"
        f"  try: krt run create hello --runtime python --source examples/hello --handler main:handle --wait"
    )


def control_plane_line(layout: Layout) -> str:
    """Who can reach Temporal, its UI and the codec endpoint, as the running platform said it."""
    try:
        said = json.loads(layout.ready.read_text()).get("controlPlane")
    except (OSError, ValueError, AttributeError):
        said = None
    return str(said) if said else "unknown (the platform did not say)"


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
    """Stop every process of this state dir's platform: the supervisor (which stops the rest), then
    what a supervisor that died (or had to be killed) left: the worker first, so it starts no
    host after the hosts are stopped, then the gateway and the dev server, then the hosts."""
    stopped = supervise.stop(layout)
    parts = supervise.stop_leftover_components(layout)
    parts += supervise.stop_unrecorded_dev_servers(layout)
    hosts = supervise.stop_leftover_hosts(layout)
    supervise.forget_stopped(layout)
    left = [f"{n} {what}" for n, what in ((parts, "component(s)"), (hosts, "host(s)")) if n]
    suffix = f" (stopped {' and '.join(left)} it left running)" if left else ""
    if stopped:
        print(f"kruntimes stopped ({layout.root}){suffix}")
    else:
        print(f"kruntimes is not running from {layout.root}{suffix}")
    return 0


def status_rows(layout: Layout) -> list[dict[str, str | int]]:
    """The supervisor ("platform"), every component (running, restarting, down) and every host:
    {"component", "state", "pid", "attempt", "lastError", "isolation"}."""
    rows: list[dict[str, str | int]] = [
        {
            "component": c.name,
            "state": c.state,
            "pid": c.pid,
            "attempt": c.attempt,
            "lastError": c.lastError,
            "isolation": "-",
        }
        for c in components.states(recorded(layout))
    ]
    if layout.hosts.exists():
        rows += [
            {
                "component": f"host {h.hostId}",
                "state": components.RUNNING if host_running(h) else components.DOWN,
                "pid": h.pid or 0,
                "attempt": 0,
                "lastError": "",
                "isolation": h.isolation or "unknown",
            }
            for h in list_records(layout.root)
        ]
    return rows


def _state_cell(row: dict[str, str | int]) -> str:
    if row["state"] == components.RESTARTING:
        return f"restarting (attempt {row['attempt']}: {row['lastError']})"
    return str(row["state"])


def _advice(layout: Layout, rows: list[dict[str, str | int]]) -> str | None:
    """What to do about what is not running, in one line; None when everything runs."""
    by_name = {str(r["component"]): r for r in rows}
    if by_name[components.SUPERVISOR]["state"] != components.RUNNING:
        left = [n for n, r in by_name.items() if r["state"] == components.RUNNING]
        if left:
            return (
                f"the supervisor is gone but {', '.join(left)} still run: `krt down` stops them,"
                " then `krt up` starts the platform again on the same ports"
            )
        return "the platform is down: `krt up` starts it"
    down = [n for n, r in by_name.items() if r["state"] != components.RUNNING]
    if down:
        return f"not running: {', '.join(down)} (logs: {layout.logs})"
    return None


def status(layout: Layout, *, output: str) -> int:
    """Every component with its state; exit 0 only when each one runs."""
    rows = status_rows(layout)
    config = _config(layout)
    everything = all(row["state"] == components.RUNNING for row in rows)
    if output == "json":
        document = {
            "stateDir": str(layout.root),
            "uiUrl": config.uiUrl,
            "gatewayUrl": config.gatewayUrl,
            "running": everything,
            "components": rows,
        }
        sys.stdout.write(cli_output.render(document, "json"))
    else:
        cells = [
            [str(row["component"]), _state_cell(row), str(row["pid"] or "-"), str(row["isolation"])]
            for row in rows
        ]
        sys.stdout.write(cli_output.table(STATUS_COLUMNS, cells))
        if everything:
            print(f"Temporal UI {config.uiUrl}   gateway {config.gatewayUrl}")
        advice = _advice(layout, rows)
        if advice:
            print(advice, file=sys.stderr)
    return 0 if everything else 1


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
