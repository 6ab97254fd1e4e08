"""The embedded platform on one machine: `krt up [--detach]`, `krt down`, `krt status`.

`krt up` runs, as child processes: the Temporal dev server (SQLite in the state dir, search
attributes registered, UI on), the gateway (HTTPS with the platform's own CA, a token file with a
generated admin token), and the worker, whose pools start each runtime's minimum hosts. Ports,
certificates and the token are kept in the state dir, so a restart on the same state dir keeps
every Run (a Run whose host went away with the old platform recovers onto a new one). Ctrl-C or
SIGTERM stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.hosts.process import list_records, stop_all
from kruntimes import clientconfig, logs
from kruntimes.devserver import DevServer, DevServerError, free_port
from kruntimes.tls import ensure_tls

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
HEARTBEAT_INTERVAL_S = 2.0
PORT_NAMES = (
    "temporal",
    "temporalUi",
    "temporalHttp",
    "temporalMetrics",
    "gateway",
    "heartbeat",
    "workerMetrics",
)

DEFAULT_RUNTIMES = """\
# Runtimes of the embedded platform. Edit and restart `krt up` to change them.
runtimes:
  - name: python
    adapter: python
    runs: 10        # Runs per host
    minHosts: 1     # warm hosts kept running
    maxHosts: 4
  - name: bash
    adapter: bash
    runs: 10
    minHosts: 1
    maxHosts: 2
"""
DEFAULT_BINDINGS = """\
# Who may invoke which namespace's Runs: users or groups from tokens.csv, namespace or "*".
bindings:
  - namespace: "*"
    groups: [admins]
"""


class PlatformError(Exception):
    pass


@dataclass
class Layout:
    root: Path

    def __getattr__(self, name: str) -> Path:
        files = {
            "ports": "platform.json",
            "up": "up.json",
            "ready": "up.ready",
            "tokens": "tokens.csv",
            "bindings": "rolebindings.yaml",
            "runtimes": "runtimes.yaml",
            "logs": "logs",
            "tls": "tls",
            "temporal": "temporal",
            "gateway_ready": "gateway.ready.json",
        }
        if name not in files:
            raise AttributeError(name)
        return self.root / files[name]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _ports(layout: Layout) -> dict[str, int]:
    """The ports of this state dir: chosen once, kept so URLs (and Run endpoints) stay valid."""
    saved: dict[str, int] = json.loads(layout.ports.read_text()) if layout.ports.exists() else {}
    ports: dict[str, int] = {}
    for name in PORT_NAMES:
        port = saved.get(name)
        if port is None or not _port_free(port):
            port = free_port()
        ports[name] = port
    layout.ports.write_text(json.dumps(ports, indent=2))
    return ports


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_token(layout: Layout) -> str:
    if layout.tokens.exists():
        for line in layout.tokens.read_text().splitlines():
            if line and not line.startswith("#") and ",admin," in line:
                return line.split(",", 1)[0]
    token = "krt_" + secrets.token_urlsafe(32)
    fd = os.open(layout.tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'{token},admin,0,"admins"\n')
    return token


def _prepare(layout: Layout) -> tuple[dict[str, int], str]:
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    layout.logs.mkdir(exist_ok=True)
    ensure_tls(layout.tls)
    token = _admin_token(layout)
    if not layout.bindings.exists():
        layout.bindings.write_text(DEFAULT_BINDINGS)
    if not layout.runtimes.exists():
        layout.runtimes.write_text(DEFAULT_RUNTIMES)
    return _ports(layout), token


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None:
            raise PlatformError(f"the {what} exited with code {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise PlatformError(f"the {what} did not start within {START_TIMEOUT_S:g}s; see {log}")
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def _wait_min_hosts(address: str, runtimes: Path, deadline: float) -> None:
    from kruntimes.config import load_config
    from kruntimes.lifecycle import QUERY_POOL, PoolState, pool_workflow_id
    from kruntimes.temporal import connect

    client = await connect(address, "default")
    for runtime in load_config(runtimes).runtimes:
        handle = client.get_workflow_handle(pool_workflow_id(runtime.name))
        while True:
            with contextlib.suppress(Exception):
                state = await handle.query(QUERY_POOL, result_type=PoolState)
                if len(state.hosts) >= runtime.minHosts:
                    break
            if time.monotonic() > deadline:
                raise PlatformError(
                    f"runtime {runtime.name!r} did not get its {runtime.minHosts} warm host(s)"
                )
            await asyncio.sleep(0.1)


def run_foreground(layout: Layout) -> int:
    """Start everything, wait for Ctrl-C/SIGTERM or a component's death, stop everything."""
    running = _running(layout)
    if running is not None:
        raise PlatformError(f"the platform already runs from {layout.root} (pid {running}); `krt down` first")
    ports, token = _prepare(layout)
    tls = ensure_tls(layout.tls)
    python = sys.executable
    procs: dict[str, subprocess.Popen[bytes]] = {}
    temporal = DevServer(
        state_dir=layout.temporal,
        port=ports["temporal"],
        ui_port=ports["temporalUi"],
        http_port=ports["temporalHttp"],
        metrics_port=ports["temporalMetrics"],
        headless=False,
        persistent=True,
        log_file=layout.logs / "temporal.log",
    )
    stop = {"requested": False}

    def request_stop(*_: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        temporal.start()
        layout.gateway_ready.unlink(missing_ok=True)
        gateway_log = layout.logs / "gateway.log"
        procs["gateway"] = _spawn(
            [python, "-m", "gateway", "--listen", f"127.0.0.1:{ports['gateway']}"]
            + [
                "--heartbeat-listen",
                f"127.0.0.1:{ports['heartbeat']}",
                "--cert",
                str(tls.cert),
                "--key",
                str(tls.key),
            ]
            + ["--token-file", str(layout.tokens), "--role-bindings", str(layout.bindings)]
            + ["--temporal-address", temporal.address, "--ready-file", str(layout.gateway_ready)],
            gateway_log,
        )
        gateway = _wait_file(layout.gateway_ready, procs["gateway"], "gateway", gateway_log)
        procs["worker"] = _spawn(
            [
                python,
                "-m",
                "workers.worker",
                "--temporal-address",
                temporal.address,
                "--state-dir",
                str(layout.root),
            ]
            + [
                "--config",
                str(layout.runtimes),
                "--gateway-url",
                gateway["url"],
                "--ca-file",
                str(tls.ca_cert),
            ]
            + [
                "--gateway-heartbeat",
                gateway["heartbeatAddress"],
                "--heartbeat-interval",
                str(HEARTBEAT_INTERVAL_S),
            ]
            + ["--metrics-address", f"127.0.0.1:{ports['workerMetrics']}"],
            layout.logs / "worker.log",
        )
        asyncio.run(_wait_min_hosts(temporal.address, layout.runtimes, time.monotonic() + START_TIMEOUT_S))
        config = clientconfig.ClientConfig(
            temporalAddress=temporal.address,
            gatewayUrl=gateway["url"],
            caFile=str(tls.ca_cert),
            token=token,
            uiUrl=temporal.ui_url,
        )
        clientconfig.write(layout.root, config)
        pids = {name: p.pid for name, p in procs.items()}
        pids["temporal"] = temporal.process.pid if temporal.process else 0
        layout.up.write_text(json.dumps({"pid": os.getpid(), "components": pids}))
        layout.ready.write_text(json.dumps({"temporalUi": temporal.ui_url, "gateway": gateway["url"]}))
        print(_summary(layout, config), flush=True)
        while not stop["requested"]:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise PlatformError(f"the {name} exited with code {proc.returncode}; see {layout.logs}")
            if temporal.process is not None and temporal.process.poll() is not None:
                raise PlatformError(f"the Temporal dev server exited; see {layout.logs / 'temporal.log'}")
            time.sleep(0.2)
        return 0
    finally:
        layout.ready.unlink(missing_ok=True)
        _stop(procs.get("worker"))
        _stop(procs.get("gateway"))
        asyncio.run(stop_all(layout.root))
        temporal.stop()
        layout.up.unlink(missing_ok=True)


def _summary(layout: Layout, config: clientconfig.ClientConfig) -> str:
    env = "" if os.environ.get("KRT_STATE_DIR") else ""
    return (
        f"kruntimes is up (state in {layout.root}){env}\n"
        f"  Temporal UI   {config.uiUrl}\n"
        f"  Temporal      {config.temporalAddress}\n"
        f"  Gateway       {config.gatewayUrl}  (CA {config.caFile})\n"
        f"  client config {layout.root / clientconfig.CLIENT_FILE}  (the CLI and SDK read it)\n"
        f"  try: krt run create hello --runtime python --source examples/hello --handler main:handle --wait"
    )


def _running(layout: Layout) -> int | None:
    if not layout.up.exists():
        return None
    pid = int(json.loads(layout.up.read_text()).get("pid", 0))
    return pid if pid and _alive(pid) else None


def up(layout: Layout, *, detach: bool) -> int:
    if not detach:
        return run_foreground(layout)
    if _running(layout) is not None:
        raise PlatformError(f"the platform already runs from {layout.root}; `krt down` first")
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (layout.root / "logs").mkdir(exist_ok=True)
    layout.ready.unlink(missing_ok=True)
    log = layout.logs / "platform.log"
    env = {**os.environ, "KRT_STATE_DIR": str(layout.root)}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.platform", "up"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + START_TIMEOUT_S + 30
    while not layout.ready.exists():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise PlatformError(f"`krt up` failed: {tail[0]} (log: {log})")
        if time.monotonic() > deadline:
            proc.terminate()
            raise PlatformError(f"`krt up` did not become ready; see {log}")
        time.sleep(0.1)
    print(_summary(layout, clientconfig.load({"KRT_STATE_DIR": str(layout.root)})))
    return 0


def down(layout: Layout) -> int:
    pid = _running(layout)
    if pid is None:
        leftovers = asyncio.run(stop_all(layout.root)) if (layout.root / "hosts").exists() else 0
        print(
            f"kruntimes is not running from {layout.root}"
            + (f" (stopped {leftovers} host(s))" if leftovers else "")
        )
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S * 3
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    print(f"kruntimes stopped ({layout.root})")
    return 0


def status(layout: Layout, *, output: str) -> int:
    pid = _running(layout)
    components: dict[str, int] = {}
    if pid is not None and layout.up.exists():
        components = json.loads(layout.up.read_text()).get("components", {})
    rows = [{"component": "platform", "state": "up" if pid else "down", "pid": pid or 0}]
    rows += [
        {"component": n, "state": "up" if _alive(p) else "down", "pid": p} for n, p in components.items()
    ]
    rows += (
        [
            {
                "component": f"host {h.hostId}",
                "state": "up" if h.pid and _alive(h.pid) else "down",
                "pid": h.pid or 0,
            }
            for h in list_records(layout.root)
        ]
        if (layout.root / "hosts").exists()
        else []
    )
    config = clientconfig.load({"KRT_STATE_DIR": str(layout.root)})
    if output == "json":
        print(
            json.dumps(
                {
                    "stateDir": str(layout.root),
                    "uiUrl": config.uiUrl,
                    "gatewayUrl": config.gatewayUrl,
                    "components": rows,
                },
                indent=2,
            )
        )
    else:
        for row in rows:
            print(f"{row['component']:<20} {row['state']:<5} {row['pid']}")
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


if __name__ == "__main__":
    command, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("up", [])
    handlers = {"up": main_up, "down": main_down, "status": main_status}
    sys.exit(handlers[command](rest))
