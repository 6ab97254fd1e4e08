"""Benchmark: one Run serving concurrent invocations through the gateway (issue #43, item 1).

    .venv/bin/python bench/functions.py                 (about half a minute)
    .venv/bin/python bench/functions.py --seconds 10    (longer measured phases)

A gateway (`python -m kruntimes.workers.gateway`, HTTPS, embedded auth) and a runtime host
(`python -m kruntimes.workers.host`, mutual TLS on every hop, its functions isolated as `krt host`
isolates them by default), each its own process on 127.0.0.1, ports picked at run time. Two Runs
are registered on the host as the control plane registers them (signed assignments):

  sync    a handler sleeping 20 ms (`time.sleep`), mode.function.concurrency 8: 8 warm processes
  async   a handler sleeping 50 ms (`await asyncio.sleep`), concurrency 32: one process

Each is driven by as many clients as its concurrency (this process, uvloop when importable, one
aiohttp session with a connection per client, keep-alive), each invoking in a loop: first a
warm-up (the sync Run's processes started), then the measured phase. Its throughput is set against
the ideal, concurrency / sleep (400/s and 640/s): targets sync ≥ 0.85×, async ≥ 0.8×. Every
answer must be 200 Succeeded; any other is counted and fails the bench. A first diagnostic case,
one client of a Run of concurrency 1 (`one`), says what a single call costs on this machine over
its 20 ms: the concurrent cases cannot do better than its ratio, whatever their concurrency. Each
case prints the CPU per call of the gateway, the host, the function processes and this client,
and how busy the whole machine was (a busy machine delays every wake-up of a sleeping handler).

A last case, `url`, compares one warm invocation through a Function's URL with one through a
Run's URL: a Run and a Function of one replica (a Run whose signed assignment names the Function's
uid, as the control plane signs a replica's), both returning at once, concurrency 1, on the same
host; one client calls them in turn (the order swapped every call) and the p50 of each is set
against the other: target Function ≤ 1.1 × Run (issue #43).

Three more cases run on the whole embedded platform (`krt up --detach` in a new state directory:
Temporal, the worker and its autoscaler, the gateway, two process hosts), through the Functions'
URLs with real HTTPS clients (`--scaling-only` runs them alone, `--zero-only` the zero case alone,
`--no-scaling` leaves them out):

  step    a Function (min 1, max 16, concurrency 1 per replica, targetConcurrency 1, a handler
          sleeping 50 ms), one client for the warm-up, then 16: zero non-200 answers, and the
          throughput from 3 s after the step on, against 16 / 50 ms: target ≥ 0.8×. The
          autoscaler's windows are Knative's defaults unless `--stable-window` says otherwise.
  update  a Function (2 replicas, concurrency 4, a handler sleeping 50 ms that answers its
          revision) under 8 clients, updated: zero non-200 answers and no old answer after the
          rollout is done; the time from the apply to the last old answer and to the rollout done.
  zero    a Function with min 0 left idle until it has no replica, then one invocation: the
          time to its 200 answer against creating a Run, waiting for it to be Ready and invoking
          it once (the same handler, answering at once), seven rounds of each, interleaved
          (the order swapped every round), the medians compared: target ≤ 1.3×, no error answer.

Prints the machine (CPUs, model, load), a table and a final JSON line {"bench": "functions", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import ssl
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import _benchlib as lib
import _history
import aiohttp
from _benchlib import BenchError
from _pki import CONTROL_PLANE, BenchPKI

from kruntimes.api.function import Function
from kruntimes.api.ids import Namespace
from kruntimes.api.run import Run
from kruntimes.contracts.names import function_workflow_id, pool_workflow_id, run_workflow_id
from kruntimes.pki.assignments import SignedAssignment
from kruntimes.pki.local import ensure_tls
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.sdk.client import Client
from kruntimes.sdk.functions import rolled_out

NAMESPACE = "default"
TOKEN = "bench-token-" + uuid.uuid4().hex
HOST_ID = "bench-fn-0"
ROUTE_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0

SYNC_SOURCE = b"import time\n\ndef handle(payload):\n    time.sleep(0.02)\n    return {'ok': True}\n"
ASYNC_SOURCE = (
    b"import asyncio\n\nasync def handle(payload):\n    await asyncio.sleep(0.05)\n    return {'ok': True}\n"
)


QUICK_SOURCE = b"def handle(payload):\n    return {'ok': True}\n"
URL_TARGET = 1.1  # a Function's URL p50 over a Run's


@dataclass(frozen=True)
class Case:
    name: str
    source: bytes
    sleep_s: float
    concurrency: int
    target: float | None  # of the ideal throughput, concurrency / sleep; None: a diagnostic

    @property
    def ideal_rps(self) -> float:
        return self.concurrency / self.sleep_s


CASES = (
    Case("one", SYNC_SOURCE, 0.020, 1, None),  # what one call costs on this machine, nothing at once
    Case("sync", SYNC_SOURCE, 0.020, 8, 0.85),
    Case("async", ASYNC_SOURCE, 0.050, 32, 0.80),
)


def machine() -> dict[str, object]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "model": model or platform.processor(),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def register_request(pki: BenchPKI, case: Case, host_uid: str) -> pb.RegisterFunctionRequest:
    run_uid = str(uuid.uuid4())
    name = f"fn-{case.name}"
    signed = pki.sign(run_uid=run_uid, host_id=HOST_ID, host_uid=host_uid, name=name, namespace=NAMESPACE)
    return pb.RegisterFunctionRequest(
        assignment=signed,
        run=pb.RunRef(run_uid=run_uid, attempt=1, namespace=NAMESPACE, name=name, runtime="python"),
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=case.source)]),
            concurrency=case.concurrency,
        ),
    )


def quick_requests(
    pki: BenchPKI, host_uid: str
) -> tuple[pb.RegisterFunctionRequest, pb.RegisterFunctionRequest, str]:
    """A plain Run and a Function's one replica, both returning at once; and the Function's uid."""
    function_uid = str(uuid.uuid4())
    requests = []
    for replica in (False, True):
        run_uid = str(uuid.uuid4())
        name = f"quick-r1-{run_uid[:5]}" if replica else "quick"
        signed = pki.signer.sign(
            SignedAssignment(
                run_uid=run_uid,
                attempt=1,
                host_id=HOST_ID,
                host_uid=host_uid,
                namespace=NAMESPACE,
                name=name,
                runtime="python",
                function_uid=function_uid if replica else "",
                revision=1 if replica else 0,
            )
        )
        requests.append(
            pb.RegisterFunctionRequest(
                assignment=signed,
                run=pb.RunRef(run_uid=run_uid, attempt=1, namespace=NAMESPACE, name=name, runtime="python"),
                config=pb.FunctionConfig(
                    adapter="python",
                    handler="main:handle",
                    inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=QUICK_SOURCE)]),
                    concurrency=1,
                ),
            )
        )
    return requests[0], requests[1], function_uid


async def alternate(
    session: aiohttp.ClientSession, urls: dict[str, str], calls: int
) -> dict[str, list[float]]:
    """`calls` sequential calls of each URL, in turn (the order swapped every round); the seconds
    of each 200 Succeeded, and BenchError at the first other answer."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    seconds: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for i in range(calls):
        for name in names if i % 2 == 0 else reversed(names):
            started = time.perf_counter()
            async with session.post(urls[name], data=b"{}", headers=headers) as resp:
                body = await resp.read()
            took = time.perf_counter() - started
            if resp.status != 200 or b'"status":"Succeeded"' not in body:
                raise BenchError(f"{name}: {resp.status} {body[:200]!r}")
            seconds[name].append(took)
    return seconds


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Phase:
    calls: int = 0
    seconds: float = 0.0
    refused: Counter[int] | None = None

    @property
    def rps(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


async def drive(session: aiohttp.ClientSession, url: str, clients: int, seconds: float) -> Phase:
    """`clients` callers invoking `url` in a loop for `seconds`; the 200 Succeeded answers counted."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    refused: Counter[int] = Counter()
    done = 0
    stop_at = 0.0

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            async with session.post(url, data=b"{}", headers=headers) as resp:
                body = await resp.read()
            if resp.status == 200 and b'"status":"Succeeded"' in body:
                done += 1
            else:
                refused[resp.status] += 1

    started = time.monotonic()
    stop_at = started + seconds
    await asyncio.gather(*(caller() for _ in range(clients)))
    return Phase(done, time.monotonic() - started, refused)


async def wait_for_route(session: aiohttp.ClientSession, url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + ROUTE_TIMEOUT_S
    while True:
        async with session.post(url, data=b"{}", headers=headers) as resp:
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise BenchError(f"the gateway did not route {url} within {ROUTE_TIMEOUT_S:g} s")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> int:
    code = 0 if args.scaling_only or args.zero_only else await run_gateway_cases(args)
    if not args.no_scaling:
        code = max(code, await scaling(args))
    return code


async def run_gateway_cases(args: argparse.Namespace) -> int:
    servers: list[lib.Server] = []
    with tempfile.TemporaryDirectory(prefix="krt-bench-fn-") as root:
        tmp = Path(root)
        try:
            return await measure(tmp, servers, args)
        finally:
            for server in servers:
                lib.stop_server(server)


async def measure(tmp: Path, servers: list[lib.Server], args: argparse.Namespace) -> int:
    py = sys.executable
    tls = ensure_tls(tmp / "tls")
    pki = BenchPKI(tmp / "pki")
    tokens = tmp / "tokens.csv"
    tokens.write_text(f'{TOKEN},bench,1000,"bench"\n')
    tokens.chmod(0o600)
    bindings = tmp / "role-bindings.yaml"
    bindings.write_text(f"bindings:\n- namespace: {NAMESPACE}\n  users: [bench]\n")
    lib.note("starting the gateway and the host ...")
    gateway = await lib.start_server(
        "gateway",
        [
            py,
            "-m",
            "kruntimes.workers.gateway",
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-listen",
            "127.0.0.1:0",
        ]
        + ["--cert", str(tls.cert), "--key", str(tls.key), "--auth", "embedded"]
        + ["--token-file", str(tokens), "--role-bindings", str(bindings), "--log-level", "warning"]
        + pki.gateway_args(),
        tmp,
        servers,
    )
    (tmp / "host-state").mkdir()
    host = await lib.start_server(
        "host",
        [py, "-m", "kruntimes.workers.host", "--host-id", HOST_ID, "--runtime", "python"]
        + ["--state-dir", str(tmp / "host-state"), "--heartbeat-interval", "1"]
        + ["--gateway", gateway.ready["heartbeatAddress"], "--log-level", "warning"]
        + pki.host_args(HOST_ID),
        tmp,
        servers,
    )
    urls = {}
    async with pki.aio_channel(host.ready["address"], as_=CONTROL_PLANE) as control:
        stub = pb_grpc.FunctionRuntimeStub(control)
        for case in CASES:
            request = register_request(pki, case, host.ready["hostUid"])
            await stub.RegisterFunction(request, timeout=CALL_TIMEOUT_S)
            base = gateway.ready["url"]
            urls[case.name] = (
                f"{base}/v1/namespaces/{NAMESPACE}/runtimes/python/functions/{request.run.run_uid}:invoke"
            )
        run_request, replica_request, function_uid = quick_requests(pki, host.ready["hostUid"])
        for request in (run_request, replica_request):
            await stub.RegisterFunction(request, timeout=CALL_TIMEOUT_S)
        base = gateway.ready["url"]
        run_uid = run_request.run.run_uid
        quick_urls = {
            "run": f"{base}/v1/namespaces/{NAMESPACE}/runtimes/python/functions/{run_uid}:invoke",
            "function": f"{base}/v1/namespaces/{NAMESPACE}/functions/{function_uid}:invoke",
        }

    client_ssl = ssl.create_default_context(cafile=str(tls.ca_cert))
    results: dict[str, dict[str, object]] = {}
    for case in CASES:
        connector = aiohttp.TCPConnector(limit=case.concurrency, ssl=client_ssl, keepalive_timeout=120)
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await wait_for_route(session, urls[case.name])
            lib.note(f"{case.name}: warming up {case.concurrency} clients ...")
            await drive(session, urls[case.name], case.concurrency, args.warmup)
            lib.note(f"{case.name}: measuring {args.seconds:g} s ...")
            procs = {"gateway": [gateway.pid], "host": [host.pid], "functions": lib.function_pids(host.pid)}
            before = {k: sum(lib.cpu_seconds(p) for p in pids) for k, pids in procs.items()}
            client_before, busy_before = time.process_time(), lib.machine_busy_seconds()
            phase = await drive(session, urls[case.name], case.concurrency, args.seconds)
            cpu = {k: sum(lib.cpu_seconds(p) for p in pids) - before[k] for k, pids in procs.items()}
            cpu["client"] = time.process_time() - client_before
            machine_busy = lib.machine_busy_seconds() - busy_before
        ratio = phase.rps / case.ideal_rps
        per_call = {k: round(v / max(phase.calls, 1) * 1e6) for k, v in cpu.items()}
        results[case.name] = {
            "concurrency": case.concurrency,
            "clients": case.concurrency,
            "sleep_ms": case.sleep_s * 1000,
            "calls": phase.calls,
            "seconds": round(phase.seconds, 3),
            "rps": round(phase.rps, 1),
            "ideal_rps": round(case.ideal_rps, 1),
            "ratio": round(ratio, 3),
            "target": case.target,
            "met": (case.target is None or ratio >= case.target) and not phase.refused,
            "non_200": dict(phase.refused or {}),
            "cpu_us_per_call": per_call,
            "machine_busy_share": round(machine_busy / phase.seconds / len(os.sched_getaffinity(0)), 2),
        }

    connector = aiohttp.TCPConnector(limit=1, ssl=client_ssl, keepalive_timeout=120)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    ) as session:
        for url in quick_urls.values():
            await wait_for_route(session, url)
        lib.note(f"url: {args.url_calls} warm calls of a Run's URL and of a Function's, in turn ...")
        await alternate(session, quick_urls, max(10, args.url_calls // 10))
        took = await alternate(session, quick_urls, args.url_calls)
    p50 = {name: quantile(values, 0.5) for name, values in took.items()}
    url_ratio = p50["function"] / p50["run"]
    url_case = {
        "calls": args.url_calls,
        "run_p50_ms": round(p50["run"] * 1000, 3),
        "function_p50_ms": round(p50["function"] * 1000, 3),
        "run_p99_ms": round(quantile(took["run"], 0.99) * 1000, 3),
        "function_p99_ms": round(quantile(took["function"], 0.99) * 1000, 3),
        "ratio": round(url_ratio, 3),
        "target": URL_TARGET,
        "met": url_ratio <= URL_TARGET,
    }

    problems = [line for server in servers for line in server.problems()]
    print(f"machine: {json.dumps(machine())}")
    print(f"{'case':<6} {'conc':>5} {'rps':>8} {'ideal':>8} {'ratio':>6} {'target':>7}  result")
    for name, r in results.items():
        met = ("met" if r["met"] else "NOT met") if r["target"] is not None else "(diagnostic)"
        print(
            f"{name:<6} {r['concurrency']:>5} {r['rps']:>8} {r['ideal_rps']:>8} {r['ratio']:>6} "
            f"{r['target'] or '-':>7}  {met}{'' if not r['non_200'] else ' non-200: ' + str(r['non_200'])}"
        )
        print(f"       CPU µs per call {r['cpu_us_per_call']}, machine busy {r['machine_busy_share']:.0%}")
    print(
        f"url    p50 Function {url_case['function_p50_ms']} ms / Run {url_case['run_p50_ms']} ms"
        f" = {url_case['ratio']}"
        f" (target ≤ {URL_TARGET})  {'met' if url_case['met'] else 'NOT met'};"
        f" p99 {url_case['function_p99_ms']} / {url_case['run_p99_ms']} ms"
    )
    for line in problems[:10]:
        lib.note(f"server log: {line}")
    print(json.dumps({"bench": "functions", "machine": machine(), "cases": results, "url": url_case}))
    return 0 if all(r["met"] for r in results.values()) and url_case["met"] else 1


# --- the step and zero cases: the whole embedded platform ----------------------------------------

SCALING_RUNTIMES = "runtimes:\n  - {name: python, adapter: python, runs: 10, minHosts: 2, maxHosts: 2}\n"
STEP_SOURCE = "import time\n\ndef handle(payload):\n    time.sleep(0.05)\n    return {'ok': True}\n"
ZERO_SOURCE = "def handle(payload):\n    return {'ok': True}\n"
STEP_CLIENTS = 16
STEP_SETTLE_S = 3.0  # the throughput is counted from this long after the step
STEP_TARGET = 0.8
ZERO_TARGET = 1.3
ZERO_ROUNDS = 7
UPDATE_SOURCE = (
    "import os, time\n\n"
    "def handle(payload):\n    time.sleep(0.05)\n    return {'version': os.environ['VERSION']}\n"
)
UPDATE_CLIENTS = 8
UPDATE_BOUND_S = 120.0  # the rollout's bound: past it the case fails


def _spec(source: str, **spec: object) -> dict[str, object]:
    return {
        "runtime": "python",
        "handler": "main:handle",
        "source": {"inline": [{"name": "main.py", "content": source}]},
        "mode": {"function": {"concurrency": 1}},
        **spec,
    }


def _function(name: str, source: str, scale: dict[str, int]) -> Function:
    return Function.from_dict(
        {
            "apiVersion": "kruntimes.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {**_spec(source), "scale": scale},
        }
    )


async def _post(session: aiohttp.ClientSession, url: str, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with session.post(url, data=b"{}", headers=headers) as resp:
        body = await resp.read()
    return resp.status if resp.status != 200 or b'"status":"Succeeded"' in body else 599


async def step_case(
    krt: Client, session: aiohttp.ClientSession, token: str, args: argparse.Namespace
) -> dict[str, object]:
    scale = {"min": 1, "max": STEP_CLIENTS, "targetConcurrency": 1, "stableWindowSeconds": args.stable_window}
    await krt.functions.apply(_function("step", STEP_SOURCE, scale))
    ready = await krt.functions.wait_ready("step", timeout=120)
    assert ready.status.endpoint is not None
    url = ready.status.endpoint.url
    lib.note(f"step: one client for {args.warmup:g} s ...")
    answers: list[float] = []
    refused: Counter[int] = Counter()
    stop_at = time.monotonic() + args.warmup

    async def caller() -> None:
        while time.monotonic() < stop_at:
            status = await _post(session, url, token)
            if status == 200:
                answers.append(time.monotonic())
            else:
                refused[status] += 1

    await caller()
    answers.clear()
    phase_s = STEP_SETTLE_S + args.seconds
    lib.note(f"step: {STEP_CLIENTS} clients for {phase_s:g} s ...")
    step_at = time.monotonic()
    stop_at = step_at + phase_s
    all_ready_after: float | None = None

    async def watch() -> None:
        nonlocal all_ready_after
        while time.monotonic() < stop_at and all_ready_after is None:
            status = await krt.functions.status("step")
            if status.replicas.ready >= STEP_CLIENTS:
                all_ready_after = time.monotonic() - step_at
            await asyncio.sleep(0.25)

    await asyncio.gather(watch(), *(caller() for _ in range(STEP_CLIENTS)))
    counted = [t for t in answers if t >= step_at + STEP_SETTLE_S]
    rps = len(counted) / args.seconds
    ideal = STEP_CLIENTS / 0.05
    last = (await krt.functions.status("step")).lastScale
    await krt.functions.delete("step", timeout=120)
    return {
        "clients": STEP_CLIENTS,
        "stable_window_s": args.stable_window,
        "rps_after_settle": round(rps, 1),
        "ideal_rps": ideal,
        "ratio": round(rps / ideal, 3),
        "target": STEP_TARGET,
        "non_200": dict(refused),
        "all_ready_after_s": None if all_ready_after is None else round(all_ready_after, 2),
        "last_scale": None if last is None else last.message,
        "met": rps / ideal >= STEP_TARGET and not refused,
    }


async def zero_timeline(
    krt: Client, workflow_id: str, *, t0_wall: float, end_wall: float, title: str
) -> list[_history.Step]:
    """Every event of `workflow_id` (a Run, or a Function and the replicas it started), the pool's
    and the client's between the request and its answer, printed (`--zero-timeline`)."""
    client = await krt.temporal()
    lo, hi = t0_wall - 0.001, end_wall + 0.001
    events = await _history.fetch_events(client, workflow_id)
    window = [ev for ev in events if lo <= _history.wall(ev) <= hi]
    who = "function" if workflow_id.startswith("function/") else "run"
    steps = _history.history_steps(window, who)
    for child in _history._child_ids(window, "RunWorkflow"):
        replica = await _history.fetch_events(client, child)
        steps += [st for st in _history.history_steps(replica, "replica") if st.wall <= hi]
    pool = await _history.fetch_chain(client, pool_workflow_id("python"), lo)
    steps += [st for st in _history.history_steps(pool, "pool") if st.wall <= hi]
    steps.append(_history.Step(t0_wall, "client", "request sent"))
    steps.append(_history.Step(end_wall, "client", "200 answered"))
    steps.sort(key=lambda st: st.wall)
    _history.print_timeline(title, steps)
    return steps


async def zero_case(
    krt: Client, session: aiohttp.ClientSession, token: str, *, rounds: int = 3, timeline: bool = False
) -> dict[str, object]:
    """Rounds of the two, interleaved (the order swapped every round), so a machine whose load
    drifts during the bench weighs on both alike: a Run created, Ready and invoked once (the
    reference), and the first answer of the Function idle at no replica. The reference Run is
    deleted only after its round's zero answer, so that no deletion's work runs beside it."""
    lib.note("zero: a Function (min 0); each round a reference Run and the first answer from zero ...")
    run = Run.from_dict(
        {
            "apiVersion": "kruntimes.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": "zero-ref", "namespace": NAMESPACE},
            "spec": _spec(ZERO_SOURCE),
        }
    )
    references: list[float] = []
    statuses: Counter[int] = Counter()
    early: Counter[int] = Counter()
    scale = {"min": 0, "max": 2, "stableWindowSeconds": 6, "scaleDownDelaySeconds": 0}
    await krt.functions.apply(_function("zero", ZERO_SOURCE, scale))
    ready_fn = await krt.functions.wait_ready("zero", timeout=120)
    assert ready_fn.status.endpoint is not None
    function_url = ready_fn.status.endpoint.url
    firsts: list[float] = []

    async def reference(i: int) -> str:
        named = run._replace(metadata=run.metadata._replace(name=f"zero-ref-{i}"))
        started, started_wall = time.monotonic(), time.time()
        await krt.create(named)
        ready = await krt.wait(named.metadata.name, timeout=120)
        assert ready.status.endpoint is not None
        # until the first 200: a Run Ready in Temporal a moment before its route reaches the gateway
        # answers 404 meanwhile (counted apart: the Function's first call must be 200 outright)
        while (status := await _post(session, ready.status.endpoint.url, token)) != 200:
            early[status] += 1
            if time.monotonic() - started > 60:
                raise BenchError(f"the Run's first invocation answered {status} for 60 s")
            await asyncio.sleep(0.01)
        references.append(time.monotonic() - started)
        if timeline:
            await zero_timeline(
                krt,
                run_workflow_id(Namespace(NAMESPACE), named.metadata.name),
                t0_wall=started_wall,
                end_wall=time.time(),
                title=f"reference {i + 1}: create -> first 200",
            )
        return named.metadata.name

    async def from_zero(i: int) -> None:
        started, started_wall = time.monotonic(), time.time()
        statuses[await _post(session, function_url, token)] += 1
        firsts.append(time.monotonic() - started)
        if timeline:
            await zero_timeline(
                krt,
                function_workflow_id(Namespace(NAMESPACE), "zero"),
                t0_wall=started_wall,
                end_wall=time.time(),
                title=f"scale from zero {i + 1}: request -> 200",
            )

    for i in range(rounds):
        lib.note(f"zero: round {i + 1}, waiting for the Function to idle to no replica ...")
        deadline = time.monotonic() + 120
        while (await krt.functions.status("zero")).replicas.total > 0:
            if time.monotonic() > deadline:
                raise BenchError("the Function did not scale to zero within 120 s")
            await asyncio.sleep(0.25)
        if i % 2 == 0:
            name = await reference(i)
            await from_zero(i)
        else:
            await from_zero(i)
            name = await reference(i)
        await krt.delete(name)
    await krt.functions.delete("zero", timeout=120)
    first_s, reference_s = quantile(firsts, 0.5), quantile(references, 0.5)
    ratio = first_s / reference_s
    return {
        "rounds": rounds,
        "first_answer_s": [round(t, 3) for t in firsts],
        "reference_s": [round(t, 3) for t in references],
        "answers": dict(statuses),
        "reference_early_answers": dict(early),
        "ratio_of_medians": round(ratio, 3),
        "target": ZERO_TARGET,
        "met": ratio <= ZERO_TARGET and set(statuses) == {200},
    }


async def update_case(
    krt: Client, session: aiohttp.ClientSession, token: str, args: argparse.Namespace
) -> dict[str, object]:
    """A Function (2 replicas, concurrency 4, a handler sleeping 50 ms that answers its revision's
    VERSION) under UPDATE_CLIENTS callers back to back, updated to a new VERSION: every non-200,
    the time from the apply's return to the last answer of the old revision (all traffic on the new
    one from then on) and to its rollout done."""

    def function(version: str) -> Function:
        spec = _spec(UPDATE_SOURCE, env={"VERSION": version})
        spec["mode"] = {"function": {"concurrency": 4}}
        return Function.from_dict(
            {
                "apiVersion": "kruntimes.io/v1alpha1",
                "kind": "Function",
                "metadata": {"name": "upd", "namespace": NAMESPACE},
                "spec": {**spec, "scale": {"min": 2, "max": 2}},
            }
        )

    await krt.functions.apply(function("1"))
    ready = await krt.functions.wait_ready("upd", timeout=120)
    assert ready.status.endpoint is not None
    url = ready.status.endpoint.url
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answers: list[tuple[float, str]] = []  # (when, the answering revision's VERSION)
    refused: Counter[str] = Counter()
    stop = asyncio.Event()

    async def caller() -> None:
        while not stop.is_set():
            async with session.post(url, data=b"{}", headers=headers) as resp:
                body = await resp.read()
            if resp.status != 200:
                refused[str(resp.status)] += 1
                continue
            answer = json.loads(body)
            if answer.get("status") != "Succeeded":
                refused[f"200 {answer.get('status')}"] += 1
                continue
            answers.append((time.monotonic(), str(answer["outputs"]["version"])))

    callers = [asyncio.create_task(caller()) for _ in range(UPDATE_CLIENTS)]
    try:
        lib.note(f"update: {UPDATE_CLIENTS} clients for {args.warmup:g} s, then the update ...")
        await asyncio.sleep(args.warmup)
        await krt.functions.apply(function("2"))
        applied = time.monotonic()
        status = await krt.functions.rollout_status("upd", timeout=UPDATE_BOUND_S)
        rolled = time.monotonic()
        if not rolled_out(status):
            raise BenchError(f"the update did not roll out within {UPDATE_BOUND_S:g} s: {status}")
        await asyncio.sleep(args.warmup)  # and the load goes on: no old answer after the rollout
    finally:
        stop.set()
        await asyncio.gather(*callers)
    await krt.functions.delete("upd", timeout=120)
    old = [t for t, v in answers if v == "1" and t >= applied]
    last_old = max(old) if old else applied
    late_old = sum(1 for t, v in answers if v == "1" and t > rolled)
    return {
        "clients": UPDATE_CLIENTS,
        "answers": len(answers),
        "non_200": dict(refused),
        "all_traffic_new_after_s": round(last_old - applied, 3),
        "rolled_out_after_s": round(rolled - applied, 3),
        "old_answers_after_rollout": late_old,
        "met": not refused and late_old == 0,
    }


async def scaling(args: argparse.Namespace) -> int:
    lib.note("starting the embedded platform (krt up --detach) ...")
    async with lib.embedded_platform(prefix="krt-bench-fn-scale-", runtimes=SCALING_RUNTIMES) as (_, config):
        token = config.token or ""
        client_ssl = ssl.create_default_context(cafile=config.caFile)
        connector = aiohttp.TCPConnector(limit=STEP_CLIENTS * 2, ssl=client_ssl, keepalive_timeout=120)
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            Client(config) as krt,
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        ):
            step = None if args.zero_only else await step_case(krt, session, token, args)
            update = None if args.zero_only else await update_case(krt, session, token, args)
            zero = await zero_case(krt, session, token, rounds=args.zero_rounds, timeline=args.zero_timeline)
    print(f"machine: {json.dumps(machine())}")
    if step is not None:
        print(
            f"step   {step['clients']} clients: {step['rps_after_settle']} rps from {STEP_SETTLE_S:g} s "
            f"after the step / {step['ideal_rps']} = {step['ratio']} (target ≥ {STEP_TARGET}) "
            f"{'met' if step['met'] else 'NOT met'}; non-200 {step['non_200'] or 0}; "
            f"{STEP_CLIENTS} replicas Ready after {step['all_ready_after_s']} s"
        )
    if update is not None:
        print(
            f"update {update['clients']} clients: non-200 {update['non_200'] or 0}; all traffic on the new "
            f"revision {update['all_traffic_new_after_s']} s after the apply, rolled out after "
            f"{update['rolled_out_after_s']} s; old answers after it {update['old_answers_after_rollout']} "
            f"{'met' if update['met'] else 'NOT met'}"
        )
    print(
        f"zero   first answer {zero['first_answer_s']} s / create+Ready+invoke {zero['reference_s']} s: "
        f"medians {zero['ratio_of_medians']} (target ≤ {ZERO_TARGET}) {'met' if zero['met'] else 'NOT met'};"
        f" answers {zero['answers']}"
    )
    print(
        json.dumps({"bench": "functions", "machine": machine(), "step": step, "update": update, "zero": zero})
    )
    return 0 if (step is None or step["met"]) and (update is None or update["met"]) and zero["met"] else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured phase of each case")
    parser.add_argument("--warmup", type=float, default=2.0, help="the warm-up of each case")
    parser.add_argument("--url-calls", type=int, default=400, help="calls of each URL in the url case")
    parser.add_argument("--no-scaling", action="store_true", help="leave out the step and zero cases")
    parser.add_argument("--scaling-only", action="store_true", help="only the step and zero cases")
    parser.add_argument("--zero-only", action="store_true", help="only the zero case (scale from zero)")
    parser.add_argument("--zero-rounds", type=int, default=ZERO_ROUNDS, help="rounds of the zero case")
    parser.add_argument(
        "--zero-timeline", action="store_true", help="print each zero round's events (Temporal histories)"
    )
    parser.add_argument(
        "--stable-window", type=int, default=60, help="the step case's scale.stableWindowSeconds (6..3600)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
