"""The chaos suite: the embedded platform (`krt up --detach`, real processes) under a steady invoke
load on several functions, and one real fault after another, each a signal to a real process by
pid (or an out-of-band change): SIGKILL a host; SIGSTOP a host past the heartbeat timeout, then
SIGCONT; SIGKILL the worker; SIGKILL the gateway; SIGKILL the Temporal dev server (the platform
starts it again on its SQLite file); unregister a function behind the platform's back; terminate a
Run workflow out of band.

Each function records every invocation id it executes (with its attempt) and each client
records every answer. After each fault: every answer was in the contract (200; 429 or 503 with
Retry-After; 502/504 only with the reasons that mean "after dispatch"; no answer at all only while
the gateway was down), no invocation id ran twice, no Run was served by two hosts at once (a
Run's hosts never interleave), every Run is Ready again (the terminated one gone), reservations
equal the Ready Runs, and no orphan process or workspace remains. At the end every history of the
platform replays against the current workflow code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from temporalio.client import Client as Temporal
from temporalio.worker import Replayer

from kruntimes.activities.hosts.process import list_records, work_root
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import QUERY_POOL, pool_workflow_id
from kruntimes.contracts.pool import PoolState
from kruntimes.pki import PeerTLS, Role
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client
from kruntimes.system import malloc
from kruntimes.temporal.connect import connect
from kruntimes.temporal.devserver import temporal_binary
from kruntimes.workers.embedded.layout import Layout, recorded_components
from tests.replay.registered import WORKFLOWS
from tests.support.krt_cli import krt
from tests.support.procs import alive, frozen, thread_names
from tests.support.waiting import eventually

FUNCTIONS = ("f0", "f1", "f2", "f3")
RECORDING = """\
import os, time, uuid

def handle(payload, context):
    # one file per execution (functions run as their own uids: no file is shared between them)
    name = f"{context.invocation_id}.{uuid.uuid4().hex}"
    with open(os.path.join(os.environ["RECORDS"], name), "x") as out:
        out.write(f"{os.environ['KRT_ATTEMPT']} {time.time()}\\n")
    return {"ok": True}
"""
RUNTIMES = """\
runtimes:
  - {name: python, adapter: python, runs: 10, minHosts: 2, maxHosts: 4, assignmentTimeoutSeconds: 10}
reconcileIntervalSeconds: 3
"""
PAUSE_S = 0.02  # between one client's invocations
SETTLE_S = 90.0  # the bound of every wait for the platform to come back
# The answers that may come after dispatch (the function may have run): never retried.
DISPATCHED = {502: {"OwnerUnreachable", "FunctionProcessExited"}, 504: {"OwnerTimeout", "InvocationTimeout"}}


@dataclass
class Answer:
    function: str
    invocation_id: str
    started: float
    status: int | None  # None: no HTTP answer (the connection failed or broke)
    reason: str = ""
    retry_after: bool = False
    error: str = ""


@dataclass
class Window:
    """When a component was down: requests then may get no answer at all."""

    started: float
    ended: float = float("inf")


@dataclass
class Chaos:
    state: Path
    records: Path
    config: clientconfig.ClientConfig
    client: Client
    temporal: Temporal
    session: aiohttp.ClientSession
    urls: dict[str, str]
    answers: list[Answer] = field(default_factory=list)
    gateway_down: list[Window] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)  # functions whose client stopped
    gone: dict[str, float] = field(default_factory=dict)  # function → when its Run was terminated
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # -- the load ------------------------------------------------------------------------------------

    async def invoke(self, function: str) -> Answer:
        invocation_id = f"{function}-{uuid.uuid4()}"
        started = time.time()
        headers = {"Authorization": f"Bearer {self.config.token}", "X-Kruntime-Invocation-ID": invocation_id}
        try:
            async with self.session.post(
                self.urls[function], data=b"{}", headers=headers, timeout=aiohttp.ClientTimeout(total=60)
            ) as response:
                body = await response.json(content_type=None)
                reason = "" if response.status == 200 else str(body.get("reason", ""))
                return Answer(
                    function,
                    invocation_id,
                    started,
                    response.status,
                    reason,
                    "Retry-After" in response.headers,
                )
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return Answer(function, invocation_id, started, None, error=type(e).__name__)

    async def load(self, function: str) -> None:
        while function not in self.stopped:
            self.answers.append(await self.invoke(function))
            await asyncio.sleep(PAUSE_S)

    def served_since(self, function: str, since: float) -> bool:
        return any(a.function == function and a.status == 200 and a.started > since for a in self.answers)

    # -- the platform ----------------------------------------------------------------------------------

    async def pool(self) -> PoolState:
        state: PoolState = await self.temporal.get_workflow_handle(pool_workflow_id("python")).query(
            QUERY_POOL, result_type=PoolState
        )
        return state

    def components(self) -> dict[str, int]:
        return recorded_components(Layout(self.state))

    def host_pid(self, host_uid: str) -> int:
        record = next(r for r in list_records(self.state) if r.hostUid == host_uid)
        assert record.pid is not None
        return record.pid

    async def busiest_host(self) -> tuple[str, str]:
        """(host id, host uid) of the pool host holding the most Runs."""
        pool = await self.pool()
        load = Counter(r.hostUid for r in pool.reservations)
        uid, _ = load.most_common(1)[0]
        host = next(h for h in pool.hosts if h.hostUid == uid)
        return host.hostId, uid

    async def eventually(
        self, check: Callable[[], Awaitable[bool]], what: str, within: float = SETTLE_S
    ) -> None:
        await eventually(check, within=within, what=what, every=0.1)

    async def alive(self) -> list[str]:
        return [f for f in FUNCTIONS if f not in self.gone]

    async def settled(self, since: float, *, off: str | None = None) -> None:
        """Every live Run Ready (on another host than `off`), answering 200 again since `since`."""

        async def ready() -> bool:
            for name in await self.alive():
                try:
                    status = await self.client.status(name)
                except Exception:  # Temporal may still be coming back
                    return False
                if status.phase is not RunPhase.Ready or (off is not None and status.assignedHostUID == off):
                    return False
            return all(self.served_since(f, since) for f in await self.alive())

        await self.eventually(ready, "every Run Ready and answering 200 again")

    # -- the invariants ----------------------------------------------------------------------------------

    def check_answers(self, since: float) -> None:
        for a in self.answers:
            if a.started < since:
                continue
            where = f"{a.function} {a.invocation_id}: {a.status} {a.reason or a.error}"
            if a.status is None:
                assert any(w.started - 1 <= a.started <= w.ended for w in self.gateway_down), (
                    f"no answer while the gateway was up: {where}"
                )
            elif a.status in (429, 503):
                assert a.retry_after, f"without Retry-After: {where}"
            elif a.status in DISPATCHED:
                assert a.reason in DISPATCHED[a.status], f"not an after-dispatch reason: {where}"
            elif a.status == 404:
                assert a.function in self.gone and a.started > self.gone[a.function] - 1, (
                    f"unexpected 404: {where}"
                )
            else:
                assert a.status == 200, f"outside the contract: {where}"

    def executions(self) -> dict[str, list[tuple[float, str, int | None]]]:
        """function → (time, invocation id, attempt) of every invocation it ran, in time order.
        An execution killed with its host between creating its record and writing it left an
        empty one: it ran (a second run of that invocation would show), its attempt unknown."""
        found: dict[str, list[tuple[float, str, int | None]]] = {f: [] for f in FUNCTIONS}
        for path in self.records.iterdir():
            invocation = path.name.rpartition(".")[0]
            written = path.read_text().split()
            attempt, at = (int(written[0]), float(written[1])) if written else (None, path.stat().st_mtime)
            found[invocation.partition("-")[0]].append((at, invocation, attempt))
        return {function: sorted(rows, key=lambda row: row[:2]) for function, rows in found.items()}

    def check_executions(self) -> None:
        executions = self.executions()
        ran = Counter(inv for rows in executions.values() for _, inv, _ in rows)
        twice = [inv for inv, n in ran.items() if n > 1]
        assert not twice, f"invocations that ran twice: {twice[:5]}"
        answered = {a.invocation_id for a in self.answers if a.status == 200}
        assert answered <= set(ran), "an invocation answered 200 never ran"
        for function, rows in executions.items():
            # An attempt is bound to one host: once a newer attempt served, an older never again.
            attempts = [attempt for _, _, attempt in rows if attempt is not None]
            assert attempts == sorted(attempts), f"{function} served by an older attempt again: {attempts}"

    async def check_slots(self) -> None:
        async def equal() -> bool:
            ready = {
                r.uid for r in await self.client.list(phase=RunPhase.Ready) if r.metadata.name in FUNCTIONS
            }
            pool = await self.pool()
            return {r.runUid for r in pool.reservations} == ready and len(ready) == len(await self.alive())

        await self.eventually(equal, "reservations equal to the Ready Runs")

    async def check_no_orphans(self) -> None:
        async def clean() -> bool:
            pool = await self.pool()
            live = {h.hostUid for h in pool.hosts}
            pids = {r.pid for r in list_records(self.state) if r.hostUid in live}
            root = work_root(self.state)
            spaces = {p.name for p in root.iterdir()} if root.exists() else set()
            if not spaces <= live:
                return False
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                with contextlib.suppress(OSError):
                    cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                    pid = int(entry.name)
                    if (
                        "kruntimes.workers.host" in cmdline
                        and str(self.state) in cmdline
                        and pid not in pids
                        and alive(pid)
                    ):
                        return False
                    cwd = os.readlink(entry / "cwd")
                    if (
                        cwd.startswith(str(root) + "/")
                        and cwd[len(str(root)) + 1 :].split("/")[0] not in live
                    ):
                        return False
            for host in pool.hosts:
                registered = {
                    f"{r.run_uid}.{r.attempt}"
                    for r in _host_info(self.state, host.address or "").registrations
                }
                held = (
                    {p.name for p in (root / host.hostUid).iterdir()}
                    if (root / host.hostUid).exists()
                    else set()
                )
                if held - registered:
                    return False
            return True

        await self.eventually(clean, "no orphan host process, function process or workspace")

    async def check_all(self, since: float) -> None:
        self.check_answers(since)
        self.check_executions()
        await self.check_slots()
        await self.check_no_orphans()


def _host_channel(state: Path, address: str, *, as_gateway: bool = False) -> grpc.Channel:
    """A channel to a host as the platform's control plane, or its gateway (their certificates in
    the state dir)."""
    layout = Layout(state)
    if as_gateway:
        tls = PeerTLS(layout.gateway_tls, role=Role.GATEWAY)
    else:
        tls = PeerTLS(layout.worker_tls, role=Role.CONTROL_PLANE)
    return grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options(Role.HOST))


def _host_info(state: Path, address: str) -> pb.HostInfoResponse:
    with _host_channel(state, address) as channel:
        info: pb.HostInfoResponse = pb_grpc.FunctionRuntimeStub(channel).HostInfo(
            pb.HostInfoRequest(), timeout=10
        )
    return info


@pytest.fixture(scope="module")
async def chaos(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Chaos]:
    root = tmp_path_factory.mktemp("chaos")
    state, records = root / "state", root / "records"
    state.mkdir()
    records.mkdir()
    records.chmod(0o1777)  # the functions write here as their own uids
    # the functions (their own uids, their own mounts) see only what is shared with them
    (state / "runtimes.yaml").write_text(RUNTIMES + f"sharedDirectories: [{records}]\n")
    up = await asyncio.to_thread(krt, state, "up", "--detach")
    assert up.returncode == 0, up.stderr
    try:
        config = clientconfig.load({"KRT_STATE_DIR": str(state)})
        async with Client(config) as client:
            for name in FUNCTIONS:
                await client.create(
                    Run.new(
                        name,
                        runtime="python",
                        handler="main:handle",
                        inline={"main.py": RECORDING},
                        env={"RECORDS": str(records)},
                        uid=str(uuid.uuid4()),
                        mode={"function": {}},
                    )
                )
            urls = {}
            for name in FUNCTIONS:
                ready = await client.wait(name, timeout=90)
                assert ready.status.endpoint is not None
                urls[name] = ready.status.endpoint.url
            temporal = await connect(config.temporal_settings())
            context = ssl.create_default_context(cafile=config.caFile)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
                world = Chaos(state, records, config, client, temporal, session, urls)
                world.tasks = [asyncio.create_task(world.load(f)) for f in FUNCTIONS]
                await world.settled(time.time())
                try:
                    yield world
                finally:
                    world.stopped.update(FUNCTIONS)
                    await asyncio.gather(*world.tasks, return_exceptions=True)
    finally:
        down = await asyncio.to_thread(krt, state, "down")
        assert down.returncode == 0, down.stderr


async def test_a_killed_host_is_fenced_and_its_runs_answer_again_at_the_same_url(chaos: Chaos) -> None:
    since = time.time()
    _, uid = await chaos.busiest_host()
    os.kill(chaos.host_pid(uid), signal.SIGKILL)  # a host the platform started for this test
    await chaos.settled(since, off=uid)
    await chaos.check_all(since)


async def test_a_frozen_host_is_fenced_before_its_runs_move_and_never_serves_again(chaos: Chaos) -> None:
    since = time.time()
    host_id, uid = await chaos.busiest_host()
    pid = chaos.host_pid(uid)
    pool = await chaos.pool()
    address = next(h.address for h in pool.hosts if h.hostUid == uid)
    old = {r.run_uid: r.registration_id for r in _host_info(chaos.state, address or "").registrations}
    with frozen(pid):

        async def moved_after_the_kill() -> bool:
            for name in await chaos.alive():
                status = await chaos.client.status(name)
                if status.phase is not RunPhase.Ready or status.assignedHostUID == uid:
                    return False
                assert not alive(pid), f"{name} Ready on another host while its frozen host still exists"
            return True

        await chaos.eventually(moved_after_the_kill, f"the Runs of frozen host {host_id} Ready elsewhere")
    assert not alive(pid), "fenced: the frozen host was killed"
    # as the gateway (the one role that may invoke): refused only because nothing serves there
    with _host_channel(chaos.state, address or "", as_gateway=True) as channel, pytest.raises(grpc.RpcError):
        registration = next(iter(old.values()))
        pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=registration, payload=b"{}"), timeout=5
        )
    await chaos.settled(since, off=uid)
    await chaos.check_all(since)


async def test_a_killed_worker_is_started_again_and_runs_created_meanwhile_become_ready(chaos: Chaos) -> None:
    since = time.time()
    worker = chaos.components()["worker"]
    os.kill(worker, signal.SIGKILL)  # the platform's worker process
    extra = Run.new(
        "during-outage", runtime="python", handler="main:handle", inline={"main.py": RECORDING},
        env={"RECORDS": str(chaos.records)}, uid=str(uuid.uuid4()), mode={"function": {}},
    )  # fmt: skip
    await chaos.client.create(extra)

    async def restarted() -> bool:
        return chaos.components().get("worker", worker) != worker

    await chaos.eventually(restarted, "the worker started again")
    assert (await chaos.client.wait("during-outage", timeout=SETTLE_S)).status.phase is RunPhase.Ready
    await chaos.client.delete("during-outage")
    await chaos.settled(since)
    await chaos.check_all(since)


async def test_a_killed_gateway_is_started_again_on_its_ports(chaos: Chaos) -> None:
    since = time.time()
    gateway = chaos.components()["gateway"]
    window = Window(time.time())
    chaos.gateway_down.append(window)
    os.kill(gateway, signal.SIGKILL)  # the platform's gateway process

    async def back() -> bool:
        return chaos.components().get("gateway", gateway) != gateway and all(
            chaos.served_since(f, time.time() - 0.5) for f in await chaos.alive()
        )

    await chaos.eventually(back, "the gateway answering 200 again")
    window.ended = time.time()
    await chaos.settled(since)
    await chaos.check_all(since)


@pytest.mark.parametrize("component", ["gateway", "worker"])
async def test_the_platforms_gateway_and_worker_give_back_the_memory_glibc_keeps(
    chaos: Chaos, component: str
) -> None:
    """The gateway and the worker `krt up` runs trim their allocators (kruntimes.system.malloc.Trimmer,
    the thread named so in the system): without it the gateway held 14 MB of freed heap at 10,000
    routes, and a restarted worker 18 MB of a reconcile's listing at 2,000 Runs."""
    assert malloc.THREAD_NAME in thread_names(chaos.components()[component])


async def test_the_dev_server_killed_and_started_again_on_its_sqlite_file_loses_nothing(chaos: Chaos) -> None:
    since = time.time()
    server = chaos.components()["temporal"]
    os.kill(server, signal.SIGKILL)  # the platform's Temporal dev server
    down = time.time()

    async def restarted() -> bool:
        return chaos.components().get("temporal", server) != server

    await chaos.eventually(restarted, "the dev server started again")
    assert all(chaos.served_since(f, down) for f in await chaos.alive()), "invocations go on without Temporal"
    await chaos.settled(since)
    await chaos.check_all(since)


async def test_a_function_unregistered_behind_the_platforms_back_is_registered_again(chaos: Chaos) -> None:
    since = time.time()
    before = await chaos.client.status("f0")
    pool = await chaos.pool()
    address = next(h.address for h in pool.hosts if h.hostUid == before.assignedHostUID) or ""
    registration = next(r for r in _host_info(chaos.state, address).registrations if r.name == "f0")
    with _host_channel(chaos.state, address) as channel:
        pb_grpc.FunctionRuntimeStub(channel).UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=registration.registration_id), timeout=30
        )

    async def again() -> bool:
        found = [r for r in _host_info(chaos.state, address).registrations if r.name == "f0"]
        return bool(found) and found[0].registration_id != registration.registration_id

    await chaos.eventually(again, "f0 registered again on its host")
    after = await chaos.client.status("f0")
    assert (after.attempt, after.assignedHostUID) == (before.attempt, before.assignedHostUID)
    await chaos.settled(since)
    await chaos.check_all(since)


async def test_a_run_terminated_out_of_band_frees_its_slot_and_stops_answering(chaos: Chaos) -> None:
    since = time.time()
    terminated = await asyncio.to_thread(
        subprocess.run,
        [temporal_binary(), "workflow", "terminate", "--workflow-id", "run/default/f3", "--reason", "chaos",
         *chaos.config.temporal_settings().cli_flags()],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert terminated.returncode == 0, terminated.stderr
    chaos.gone["f3"] = time.time()

    async def not_found() -> bool:
        return any(
            a.function == "f3" and a.status == 404 and a.started > chaos.gone["f3"] for a in chaos.answers
        )

    await chaos.eventually(not_found, "f3 answering 404 once its registration is gone")
    chaos.stopped.add("f3")
    await chaos.settled(since)
    await chaos.check_all(since)


async def test_every_history_of_the_platform_still_replays(chaos: Chaos) -> None:
    histories = []
    async for execution in chaos.temporal.list_workflows(""):
        histories.append(
            await chaos.temporal.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        )
    assert {
        h.events[0].workflow_execution_started_event_attributes.workflow_type.name for h in histories
    } >= {
        "RunWorkflow",
        "RuntimePoolWorkflow",
        "ScaleOutWorkflow",
        "CleanupWorkflow",
        "HostWorkflow",
        "ReconcileWorkflow",
    }
    replayer = Replayer(workflows=WORKFLOWS, data_converter=chaos.temporal.data_converter)
    failures = []
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures.append(f"{history.workflow_id}: {result.replay_failure}")
    assert not failures, failures[:3]
