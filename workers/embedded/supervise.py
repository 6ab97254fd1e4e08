"""Starting, watching and stopping the embedded platform's processes.

`run_foreground` is the platform process itself: it starts the Temporal dev server (SQLite in the
state dir, search attributes registered, UI on) hidden in a network namespace of its own
(hidden_temporal: reachable through Unix sockets of the state dir only), the front before it
(kruntimes.workers.temporal_front: mutual TLS with the owner's client certificate on 127.0.0.1, and
the UI and codec endpoint for the owner's session), the gateway (HTTPS with the platform's own CA,
the token file) and the worker (whose pools start each runtime's minimum hosts) as children, waits
until every runtime has its warm hosts, records what runs in the state dir and watches the
children until SIGINT/SIGTERM; then it stops them all, the hosts included. Every one of them
reaches Temporal through the front, with the owner's client certificate.
The internal hops are mutual TLS with certificates of the platform CA in the state dir
(layout.ensure_pki): the gateway and the worker get theirs from here, renewed while the platform
runs; the worker issues the hosts theirs.

A child that dies is started again, with a backoff (RESTART_MIN_S doubling to RESTART_MAX_S, back
to the minimum once it ran RESTART_RESET_S), on the same ports and files: the dev server on its
SQLite file, the gateway on its HTTPS and heartbeat ports (hosts reconnect to the same address,
and every host's supervision stream names the worker's current gateways), the worker with the
same flags (it takes over the hosts, its pools and reconcilers resume), the front on its ports.
Nothing else stops.
`start_detached` runs it in the background and returns once it is ready; `stop` ends it by the
pid it recorded. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kruntimes.activities.hosts.process import host_running, list_records, stop_all
from kruntimes.cli.components import COMPONENTS, Restarting, alive
from kruntimes.config.runtimes import PlatformConfig, PlatformConfigError, load_config, network_warnings
from kruntimes.pki import DEFAULT_LIFETIME, AuthorityError
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.local import FrontTls, TlsFiles, ensure_front_tls, ensure_tls
from kruntimes.runtime.sandbox.policy import can_switch_uid
from kruntimes.sdk import config as clientconfig
from kruntimes.temporal.devserver import DevServerError
from kruntimes.temporal.settings import TemporalSettings
from kruntimes.temporal.ui_login import CODEC_PATH
from kruntimes.workers.embedded import temporal_cli
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.hidden_temporal import EXPOSED, NETNS, USERNS
from kruntimes.workers.embedded.layout import (
    ADMIN_USER,
    Layout,
    ensure_login_key,
    make_root,
    platform_certificates,
    prepare,
    recheck_ports,
    recorded,
    recorded_components,
    recorded_pid,
    write_up,
)

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0
RESTART_SETTLE_S = 5.0  # a component started again without a ready signal is restarting this long
HEARTBEAT_INTERVAL_S = 2.0
RENEW_CHECK_S = 60.0  # how often the running platform looks for certificates due for renewal
# `krt up --detach` waits this much longer than the platform itself takes to give up starting.
DETACH_EXTRA_S = 30.0
# What `krt up --detach` runs in the background: this package's `up`, in the foreground.
DETACHED_MODULE = "kruntimes.workers.embedded"


def running(layout: Layout) -> int | None:
    """The pid of the platform running from this state dir, or None."""
    pid = recorded_pid(layout)
    return pid or None


def _try_lock(layout: Layout) -> int | None:
    """The state dir's lock, taken (an open descriptor: the lock lasts while it is open, and no
    child inherits it), or None when another process holds it."""
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _stop_command(layout: Layout) -> str:
    return f"KRT_STATE_DIR={shlex.quote(str(layout.root))} krt down"


def refuse_if_running(layout: Layout) -> None:
    """PlatformError with the command that stops it when a platform, or any process of one,
    still runs from this state dir: its supervisor (which holds the lock), or components or hosts
    a supervisor that died left running. A second platform would start a second dev server on
    the same database."""
    fd = _try_lock(layout)
    if fd is None:
        _refuse_held(layout)
    else:
        os.close(fd)
    _refuse_leftovers(layout)


def _refuse_held(layout: Layout) -> None:
    pid = recorded_pid(layout)
    which = f" (pid {pid})" if pid else ""
    raise PlatformError(
        f"the platform already runs from {layout.root}{which}; stop it with `{_stop_command(layout)}`"
    )


def _refuse_leftovers(layout: Layout) -> None:
    """Adopting processes that are not its children would leave the supervisor unable to wait
    for them or know how they ended (docs/operations.md), so it asks for `krt down` instead."""
    running_now = recorded_components(layout)
    left = [f"{name} (pid {running_now[name]})" for name in COMPONENTS if name in running_now]
    left += [f"a dev server on {_database(layout)} (pid {pid})" for pid in unrecorded_dev_servers(layout)]
    if layout.hosts.exists():
        left += [f"host {h.hostId} (pid {h.pid})" for h in list_records(layout.root) if host_running(h)]
    if left:
        raise PlatformError(
            f"the supervisor of the platform in {layout.root} is gone but its {', '.join(left)} still"
            f" run; stop them with `{_stop_command(layout)}`, then `krt up` again (same ports)"
        )


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def _stop_child(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class _Child:
    """One supervised process: how to start it, and when to start it again after it died."""

    name: str
    start: Callable[[], subprocess.Popen[bytes]]
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.monotonic)
    backoff_s: float = 0.0
    restart_at: float | None = None
    restarts: int = 0
    attempt: int = 0  # of the start to come: counted anew once it ran RESTART_RESET_S
    last_error: str = ""
    # whether it serves since it was started again (by default: it kept running RESTART_SETTLE_S)
    ready: Callable[[], bool] | None = None
    settling: bool = False

    def exited(self) -> int | None:
        return self.proc.poll() if self.restart_at is None else None

    def schedule(self, now: float, why: str) -> None:
        ran = now - self.started_at
        fresh = ran >= RESTART_RESET_S or not self.backoff_s
        self.backoff_s = RESTART_MIN_S if fresh else min(self.backoff_s * 2, RESTART_MAX_S)
        self.attempt = 1 if fresh else self.attempt + 1
        self.last_error = f"{why}: {_last_error(self.log)}" if self.log.exists() else why
        self.restart_at = now + self.backoff_s
        _say(f"the {self.name} {why}; starting it again in {self.backoff_s:g}s")

    def restart(self, now: float) -> bool:
        """Start it again if it is time; True when it runs again."""
        if self.restart_at is None or now < self.restart_at:
            return False
        try:
            self.proc = self.start()
        except (DevServerError, OSError) as e:
            self.schedule(time.monotonic(), f"did not start ({e})")
            return False
        self.started_at, self.restart_at = time.monotonic(), None
        self.settling = True
        self.restarts += 1
        _say(f"the {self.name} runs again (pid {self.proc.pid}, restart {self.restarts})")
        return True

    def settled(self, now: float) -> bool:
        """Whether one started again has proven to serve (True once: it is not restarting then)."""
        if not self.settling or self.proc.poll() is not None:
            return False
        if self.ready() if self.ready is not None else now - self.started_at >= RESTART_SETTLE_S:
            self.settling = False
            return True
        return False

    def restarting(self) -> Restarting | None:
        """While it is started again, until it serves: which attempt, and why it died."""
        if self.restart_at is None and not self.settling:
            return None
        return Restarting(self.attempt, self.last_error)


def _say(text: str) -> None:
    """A line of the platform's own log (its stderr: logs/platform.log when detached)."""
    print(f"krt up: {text}", file=sys.stderr, flush=True)


def _supervise(children: list[_Child], layout: Layout, stop: dict[str, bool]) -> None:
    """Until asked to stop: start every child that died again (backoff), record the pids and
    which child is being started again, and renew the platform's certificates before they expire."""
    renew_at = time.monotonic() + RENEW_CHECK_S
    while not stop["requested"]:
        now = time.monotonic()
        if now >= renew_at:
            renew_platform_certificates(layout)
            renew_at = now + RENEW_CHECK_S
        changed = False
        for child in children:
            code = child.exited()
            if code is not None:
                child.schedule(now, f"exited with code {code}")
                changed = True
            changed |= child.restart(now)
            changed |= child.settled(now)
        if changed:
            _record(layout, children)
        time.sleep(0.2)


def _record(layout: Layout, children: list[_Child]) -> None:
    restarting = {c.name: r for c in children if (r := c.restarting()) is not None}
    write_up(
        layout, pid=os.getpid(), components={c.name: c.proc.pid for c in children}, restarting=restarting
    )


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, log: Path) -> dict[str, Any]:
    """The JSON a child writes to `path` once it serves; fails if it exits or times out first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None:
            raise PlatformError(
                f"the {what} exited with code {proc.returncode}: {_last_error(log)} (log: {log})"
            )
        if time.monotonic() > deadline:
            raise PlatformError(f"the {what} did not start within {START_TIMEOUT_S:g}s; see {log}")
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def _wait_min_hosts(
    temporal: TemporalSettings, layout: Layout, deadline: float, *, worker: subprocess.Popen[bytes]
) -> None:
    """Until every runtime's pool has its warm hosts; fails at `deadline`, or as soon as the
    worker that makes them exited (with the last line of its log)."""
    from kruntimes.contracts.names import pool_workflow_id
    from kruntimes.temporal.connect import connect, query_pool

    client = await connect(temporal)
    runtimes = layout.runtimes
    for runtime in load_config(runtimes).runtimes:
        while True:
            with contextlib.suppress(Exception):
                state = await query_pool(client, pool_workflow_id(runtime.name))
                if len(state.hosts) >= runtime.minHosts:
                    break
            if worker.poll() is not None:
                log = layout.log("worker")
                raise PlatformError(
                    f"the worker exited with code {worker.returncode} before runtime {runtime.name!r}"
                    f" got its warm host(s): {_last_line(log)} (log: {log})"
                )
            if time.monotonic() > deadline:
                raise PlatformError(
                    f"runtime {runtime.name!r} did not get its {runtime.minHosts} warm host(s)"
                    f" (logs: {layout.logs})"
                )
            await asyncio.sleep(0.1)


def temporal_settings(layout: Layout, ports: dict[str, int], front: FrontTls) -> TemporalSettings:
    """How the platform's processes reach Temporal: through the front, with the owner's
    client certificate."""
    return TemporalSettings(
        address=f"127.0.0.1:{ports['temporal']}",
        tlsCa=str(front.ca_cert),
        tlsCert=str(front.client_cert),
        tlsKey=str(front.client_key),
        codecKeys=str(layout.codec_keys),
    )


def _temporal_flags(temporal: TemporalSettings) -> list[str]:
    return [
        "--temporal-address",
        temporal.address,
        "--temporal-tls-ca",
        str(temporal.tlsCa),
        "--temporal-tls-cert",
        str(temporal.tlsCert),
        "--temporal-tls-key",
        str(temporal.tlsKey),
    ]


def _hidden_temporal_argv(layout: Layout, *, ports: dict[str, int]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kruntimes.workers.embedded.hidden_temporal",
        "--database-dir",
        str(layout.temporal),
        "--sockets",
        str(layout.sockets),
        "--log-file",
        str(layout.log("temporal")),
        "--ui-codec-endpoint",
        f"https://127.0.0.1:{ports['temporalUi']}{CODEC_PATH}",
        "--ready-file",
        str(layout.temporal_ready),
        "--avoid-port",
        str(ports["temporal"]),
        "--avoid-port",
        str(ports["temporalUi"]),
    ]


def _front_argv(layout: Layout, *, ports: dict[str, int], front: FrontTls) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kruntimes.workers.temporal_front",
        "--listen",
        f"127.0.0.1:{ports['temporal']}",
        "--ui-listen",
        f"127.0.0.1:{ports['temporalUi']}",
        "--frontend-socket",
        str(layout.sockets / "frontend.sock"),
        "--ui-socket",
        str(layout.sockets / "ui.sock"),
        "--cert",
        str(front.cert),
        "--key",
        str(front.key),
        "--client-ca",
        str(front.ca_cert),
        "--login-key-file",
        str(layout.login_key),
        "--codec-keys",
        str(layout.codec_keys),
        "--token-file",
        str(layout.tokens),
        "--ready-file",
        str(layout.front_ready),
        "--log-level",
        "info",
    ]


def _gateway_argv(
    layout: Layout, *, ports: dict[str, int], tls: TlsFiles, temporal: TemporalSettings
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kruntimes.workers.gateway",
        "--listen",
        f"127.0.0.1:{ports['gateway']}",
        "--heartbeat-listen",
        f"127.0.0.1:{ports['heartbeat']}",
        "--cert",
        str(tls.cert),
        "--key",
        str(tls.key),
        "--peer-tls",
        str(layout.gateway_tls),
        "--assignment-public-key",
        str(layout.assignment_public_key),
        "--token-file",
        str(layout.tokens),
        "--role-bindings",
        str(layout.bindings),
        *_temporal_flags(temporal),
        # async invocations: the gateway seals their input and reads their memos as the worker does
        "--codec-keys",
        str(layout.codec_keys),
        # per-request callback URLs: the origins each namespace may name (none at first)
        "--callback-origins",
        str(layout.callback_origins),
        "--ready-file",
        str(layout.gateway_ready),
    ]


def _worker_argv(
    layout: Layout,
    *,
    ports: dict[str, int],
    tls: TlsFiles,
    temporal: TemporalSettings,
    gateway: dict[str, Any],
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kruntimes.workers.worker",
        *_temporal_flags(temporal),
        "--state-dir",
        str(layout.root),
        "--config",
        str(layout.runtimes),
        "--gateway-url",
        gateway["url"],
        "--ca-file",
        str(tls.ca_cert),
        "--gateway-heartbeat",
        gateway["heartbeatAddress"],
        "--heartbeat-interval",
        str(HEARTBEAT_INTERVAL_S),
        "--metrics-address",
        f"127.0.0.1:{ports['workerMetrics']}",
        "--codec-keys",
        str(layout.codec_keys),
        "--isolation",
        default_isolation(),
        # Runs' source.path may point into the directory `krt up` was started from and the
        # user's home (the runtimes file's allowedSourceRoots replaces these); the state dir is
        # refused wherever it lies
        "--allowed-source-root",
        os.getcwd(),
        "--allowed-source-root",
        str(Path.home()),
        "--peer-tls",
        str(layout.worker_tls),
        "--assignment-key",
        str(layout.assignment_key),
        "--platform-ca",
        str(layout.pki),
        "--host-certificate-lifetime",
        str(DEFAULT_LIFETIME.total_seconds()),
    ]


def default_isolation() -> str:
    """uid when this user can give functions their own uid (root), else same-user: said plainly
    at start (`krt up` prints it), never silently."""
    return "uid" if can_switch_uid() else "same-user"


def renew_platform_certificates(
    layout: Layout, *, now: dt.datetime | None = None, lifetime: dt.timedelta = DEFAULT_LIFETIME
) -> int:
    """Move the platform CA's rotation along to `now` (kruntimes.pki.rotation; the rotation's
    clock, the real time unless given), then re-issue the gateway's and the worker's certificates
    that are stale, at the real time; returns how many. `lifetime`: the longest of the
    certificates the CA issues (the hosts' too)."""
    try:
        state, steps = ca_rotation.ensure(layout.pki, max_leaf_lifetime=lifetime, now=now)
    except (AuthorityError, OSError) as e:
        print(f"cannot move the platform CA's rotation along: {e}", file=sys.stderr, flush=True)
        return 0
    for step in steps:
        print(f"platform CA rotation: {ca_rotation.describe(step, state)}", file=sys.stderr, flush=True)
    authority = state.authority()
    renewed = 0
    for directory, _ in platform_certificates(layout):
        try:
            renewed += authority.renew_if_due(directory) is not None
        except AuthorityError as e:
            print(f"cannot renew {directory}: {e}", file=sys.stderr, flush=True)
    return renewed


def run_foreground(layout: Layout, *, on_ready: Callable[[clientconfig.ClientConfig], None]) -> int:
    """Start everything, call `on_ready`, wait for SIGINT/SIGTERM or a child's death, stop everything."""
    make_root(layout)
    lock = _try_lock(layout)
    if lock is None:
        _refuse_held(layout)
    try:
        _refuse_leftovers(layout)
        return _run_locked(layout, on_ready=on_ready)
    finally:
        if lock is not None:
            os.close(lock)


def _run_locked(layout: Layout, *, on_ready: Callable[[clientconfig.ClientConfig], None]) -> int:
    """run_foreground, with the state dir's lock held and nothing of an earlier platform running."""
    ports, token = prepare(layout)
    try:  # a bad runtimes file is said now, before anything starts (the worker would only die of it)
        runtimes = load_config(layout.runtimes)
    except PlatformConfigError as e:
        raise PlatformError(f"{layout.runtimes}: {e}") from None
    for warning in _network_warnings(runtimes):
        _say(warning)
    tls = ensure_tls(layout.tls)
    front = ensure_front_tls(layout.front)
    login_key = ensure_login_key(layout)
    temporal = temporal_settings(layout, ports, front)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stop = {"requested": False}

    def request_stop(*_: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    def start_temporal() -> subprocess.Popen[bytes]:
        layout.temporal_ready.unlink(missing_ok=True)  # written again once it serves
        return _spawn(_hidden_temporal_argv(layout, ports=ports), layout.log("temporal"))

    def start_front() -> subprocess.Popen[bytes]:
        layout.front_ready.unlink(missing_ok=True)
        return _spawn(_front_argv(layout, ports=ports, front=front), layout.log("front"))

    def start_gateway() -> subprocess.Popen[bytes]:
        argv = _gateway_argv(layout, ports=ports, tls=tls, temporal=temporal)
        layout.gateway_ready.unlink(missing_ok=True)  # written again once it serves
        return _spawn(argv, layout.log("gateway"))

    def record_started() -> None:
        # each component is recorded as soon as it runs: `krt down` finds it even if this
        # process dies before the platform is ready
        write_up(layout, pid=os.getpid(), components={name: p.pid for name, p in procs.items()})

    try:
        write_up(layout, pid=os.getpid(), components={})
        # side by side: the front needs the dev server only once a client comes
        procs["temporal"] = start_temporal()
        procs["front"] = start_front()
        record_started()
        hidden = _wait_file(
            layout.temporal_ready, procs["temporal"], "temporal dev server", layout.log("temporal")
        )
        protection = control_plane(hidden, isolation=default_isolation())
        if hidden.get("mode") == EXPOSED:
            _say(f"WARNING: {protection}")
        _wait_file(layout.front_ready, procs["front"], "Temporal front", layout.log("front"))
        # an exposed dev server opened ports of its own: the ones picked for the others may be among them
        ports.update(recheck_ports(layout, ports, ("gateway", "heartbeat", "workerMetrics")))
        procs["gateway"] = start_gateway()
        record_started()
        gateway = _wait_file(layout.gateway_ready, procs["gateway"], "gateway", layout.log("gateway"))

        def start_worker() -> subprocess.Popen[bytes]:
            # only the worker's metrics port may change between its starts (no URL names it)
            ports.update(recheck_ports(layout, ports, ("workerMetrics",)))
            argv = _worker_argv(layout, ports=ports, tls=tls, temporal=temporal, gateway=gateway)
            return _spawn(argv, layout.log("worker"))

        procs["worker"] = start_worker()
        record_started()
        asyncio.run(
            _wait_min_hosts(temporal, layout, time.monotonic() + START_TIMEOUT_S, worker=procs["worker"])
        )
        ui_url = f"https://127.0.0.1:{ports['temporalUi']}"
        config = clientconfig.ClientConfig(
            temporalAddress=temporal.address,
            temporalTlsCa=temporal.tlsCa,
            temporalTlsCert=temporal.tlsCert,
            temporalTlsKey=temporal.tlsKey,
            gatewayUrl=gateway["url"],
            caFile=str(tls.ca_cert),
            token=token,
            uiUrl=ui_url,
            uiLoginKey=login_key,
            codecKeys=str(layout.codec_keys),
            identity=ADMIN_USER,  # the creator of its Runs: the bindings let it use every secret
        )
        clientconfig.write(layout.root, config)
        temporal_cli.write(
            layout.temporal_cli_config, temporal, codec_endpoint=ui_url + CODEC_PATH, token=token
        )
        layout.ready.write_text(
            json.dumps({"temporalUi": ui_url, "gateway": gateway["url"], "controlPlane": protection})
        )
        on_ready(config)
        children = [
            _Child(
                "temporal",
                start_temporal,
                procs["temporal"],
                layout.log("temporal"),
                ready=layout.temporal_ready.exists,
            ),
            _Child(
                "front", start_front, procs["front"], layout.log("front"), ready=layout.front_ready.exists
            ),
            _Child(
                "gateway",
                start_gateway,
                procs["gateway"],
                layout.log("gateway"),
                ready=layout.gateway_ready.exists,
            ),
            _Child("worker", start_worker, procs["worker"], layout.log("worker")),
        ]
        try:
            _supervise(children, layout, stop)
        finally:
            procs.update({c.name: c.proc for c in children})
        return 0
    finally:
        layout.ready.unlink(missing_ok=True)
        _stop_child(procs.get("worker"))
        _stop_child(procs.get("gateway"))
        asyncio.run(stop_all(layout.root))
        _stop_child(procs.get("front"))
        _stop_child(procs.get("temporal"))  # it stops the dev server before it exits
        layout.up.unlink(missing_ok=True)


def control_plane(hidden: dict[str, Any], *, isolation: str) -> str:
    """What protects the control plane, in one line: `krt up` says it at start. `isolation` is
    the functions' (same-user: they run as the owner, and so can read the owner's key)."""
    mode = hidden.get("mode")
    if mode == NETNS:
        where = "in a network namespace of its own"
    elif mode == USERNS:
        where = "in a user and network namespace of its own"
    else:
        return (
            "the Temporal dev server could not be hidden in a network namespace"
            f" ({hidden.get('why') or 'unknown'}): any local user can reach its frontend and UI"
            " on 127.0.0.1 without credentials; the front's TLS protects only those who use it"
        )
    said = f"owner only: the dev server {where}, reached through mutual TLS with your certificate"
    if isolation == "same-user":
        said += "; but functions run as you, can read that certificate and so reach it too"
    return said


def start_detached(layout: Layout) -> None:
    """Run the platform in the background (a new session, its output in logs/platform.log) and
    return once it is ready."""
    make_root(layout)
    refuse_if_running(layout)
    layout.ready.unlink(missing_ok=True)
    log = layout.log("platform")
    env = {**os.environ, "KRT_STATE_DIR": str(layout.root)}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", DETACHED_MODULE, "up"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + START_TIMEOUT_S + DETACH_EXTRA_S
    while not layout.ready.exists():
        if proc.poll() is not None:
            raise PlatformError(f"`krt up` failed: {_last_line(log)} (log: {log})")
        if time.monotonic() > deadline:
            proc.terminate()
            raise PlatformError(f"`krt up` did not become ready; see {log}")
        time.sleep(0.1)
    with contextlib.suppress(PlatformConfigError):  # read as it started (its log has them too)
        for warning in _network_warnings(load_config(layout.runtimes)):
            print(f"krt up: {warning}", file=sys.stderr, flush=True)


def _network_warnings(config: PlatformConfig) -> list[str]:
    """A runtime with `network: host`, or one whose `outbound` its hosts cannot enforce (#48)."""
    return network_warnings(config, default_isolation=default_isolation(), root=os.geteuid() == 0)


def _last_line(log: Path, *, max_bytes: int = 4096) -> str:
    """The last line of a log (appended across runs, so only its end is read)."""
    with log.open("rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - max_bytes, 0))
        tail = f.read().decode(errors="replace").strip().splitlines()[-1:]
    return tail[0] if tail else "(no output)"


def _last_error(log: Path, *, max_bytes: int = 8192) -> str:
    """The line of a log that says why its process ended: the last one, leaving out what the
    interpreter prints while it shuts down ("Exception ignored in: ...") and traceback frames."""
    with log.open("rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - max_bytes, 0))
        lines = f.read().decode(errors="replace").splitlines()
    while ignored := [i for i, ln in enumerate(lines) if ln.startswith("Exception ignored in")]:
        if len(_said(lines[ignored[-1] + 1 :])) > 1:
            break  # the process said more after it: not the shutdown's tail
        del lines[ignored[-1] :]
    said = _said(lines)
    return said[-1] if said else "(no output)"


def _said(lines: list[str]) -> list[str]:
    """The lines a process said itself: no traceback header or frames."""
    return [ln for ln in lines if ln.strip() and not ln[:1].isspace() and not ln.startswith("Traceback (")]


def _signal(pid: int, sig: signal.Signals, *, still: Callable[[int], bool]) -> None:
    """Send `sig` to `pid` if `still(pid)` holds (it is the process the state dir records, by pid
    and start time, or the one found on its database): through a pidfd opened before the check,
    so a pid given to another process between the check and the signal is never reached."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if still(pid):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)


def _recorded_still(layout: Layout) -> Callable[[int], bool]:
    return lambda pid: recorded(layout).same(pid)


def stop(layout: Layout) -> bool:
    """SIGTERM the running platform (it stops the worker, then the gateway, the hosts and the
    dev server), SIGKILL if it outlives the wait.

    Returns False when none runs from this state dir.
    """
    pid = running(layout)
    if pid is None:
        return False
    _stop_pids([pid], still=_recorded_still(layout), wait_s=STOP_TIMEOUT_S * 3)
    return True


def _stop_pids(pids: list[int], *, still: Callable[[int], bool], wait_s: float | None = None) -> None:
    """SIGTERM each, SIGKILL those still running after `wait_s` (STOP_TIMEOUT_S by default)."""
    for pid in pids:
        _signal(pid, signal.SIGTERM, still=still)
    deadline = time.monotonic() + (STOP_TIMEOUT_S if wait_s is None else wait_s)
    while any(still(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        _signal(pid, signal.SIGKILL, still=still)


def stop_leftover_components(layout: Layout) -> int:
    """Stop the components (the worker, the gateway, the dev server) a platform that died, or
    was killed, left running: each started in a session of its own, it outlives its supervisor.
    The worker first, so that it starts no host once the hosts are stopped. Only the processes
    recorded, by pid and start time: a pid given to another process since is never signalled.
    Returns how many were stopped."""
    left = recorded_components(layout)
    still = _recorded_still(layout)
    _stop_pids([pid for name, pid in left.items() if name == "worker"], still=still)
    _stop_pids([pid for name, pid in left.items() if name != "worker"], still=still)
    return len(left)


def _database(layout: Layout) -> Path:
    return layout.temporal / "temporal.db"


def _on_database(database: Path) -> Callable[[int], bool]:
    """Whether a process runs with `database` as an argument (a dev server's --db-filename)."""
    wanted = os.fsencode(database)

    def check(pid: int) -> bool:
        try:
            return wanted in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") and alive(pid)
        except OSError:
            return False

    return check


def unrecorded_dev_servers(layout: Layout) -> list[int]:
    """Dev servers on this state dir's database that its record does not name, itself or by its
    parent (the `temporal` component runs it), found by their command line."""
    known = set(recorded_components(layout).values())
    on_it = _on_database(_database(layout))
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit()
        and int(e.name) not in known
        and on_it(int(e.name))
        and _parent(int(e.name)) not in known
    ]


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def stop_unrecorded_dev_servers(layout: Layout) -> int:
    """Stop the dev servers on this state dir's database the record does not name; how many."""
    pids = unrecorded_dev_servers(layout)
    _stop_pids(pids, still=_on_database(_database(layout)))
    return len(pids)


def stop_leftover_hosts(layout: Layout) -> int:
    """Stop the hosts a platform that died without cleaning up left running; returns how many."""
    return asyncio.run(stop_all(layout.root)) if layout.hosts.exists() else 0


def forget_stopped(layout: Layout) -> None:
    """Remove the record once nothing it names runs: the platform is down, not merely gone."""
    record = recorded(layout)
    if not record.supervisor() and not record.live_components():
        layout.up.unlink(missing_ok=True)
