"""Benchmark: a warm invoke through the gateway next to a direct gRPC invoke and a raw chain, in one run.

    .venv/bin/python bench/invoke.py                      (the bench, < 2 min)
    .venv/bin/python bench/invoke.py --profile /tmp/prof  (py-spy the servers under 32-way load)

Paths, every server in its own process on 127.0.0.1 with ports picked at run time:
  gateway   HTTPS POST .../functions/{uid}:invoke to `python -m gateway` (embedded auth, the
            authorization cached after the first call, keep-alive), which calls InvokeFunction on
            the runtime host (`python -m workers.host --gateway ...`), which runs the function
            in its warm function process
  direct    (a) InvokeFunction on the same runtime host over one grpc.aio channel
  chain     (b) the raw chain (bench/_invoke_chain.py): an aiohttp HTTPS server forwarding the
            body over a kept-open grpc.aio channel to a grpc.aio server that writes it to a warm
            child process over a pipe and reads the echo back (bench/_invoke_child.py); asyncio,
            no auth, no validation. This is the reference the targets are set against.
  chain-uv  the same chain with both servers on uvloop (for scale; the gateway runs on uvloop)

The client (this process, uvloop when importable) uses one aiohttp ClientSession (keep-alive,
TCPConnector(limit=64), an SSL context trusting the bench CA) for the HTTPS paths and one
grpc.aio channel for the direct one; payload {"n": 1}. 32 functions are registered on the host
(namespace default); caller i always invokes function i, since a function runs one invocation at a
time, and the sequential phase always function 0. The chain has 32 warm children in a pool.

Per path: 2000 sequential calls (p50/p99) and 32 concurrent callers for ~3 s (calls/s), in
interleaved rounds (each round 1/ROUNDS of every phase of every path, 200 warm-up calls before
each piece) so background load hits all paths alike; server CPU per call from /proc/<pid>/stat
for each server process (gateway, host, function processes; chain: http, grpc, children).

Targets (gateway vs the chain): p50 ≤ 1.2×, p99 ≤ 2 ms (sequential), throughput ≥ 1.0×.
Prints tables, the ratios with target met / not met and a final JSON line {"bench": "invoke", ...}.
On a machine saturated by the 32-way phase, throughput is bounded by CPU per call (servers and
this client share the cores), so a CPU-based estimate of the throughput ratio is printed too.

A/B: --alt-gateway-script / --alt-host-script run a variant (a script taking the same arguments,
e.g. a patched copy) as a second stack measured in the same interleaved rounds (paths gateway-alt,
direct-alt), and print its ratios and CPU deltas against the base.

With --profile DIR it instead runs the 32-way load per path (--profile-paths) for
--profile-seconds while py-spy samples each server process and one function process, writes
collapsed stacks (DIR/<path>-<process>.txt; speedscope and flamegraph tools read them) and prints
the top frames with the process's measured CPU per call spread over them by share of samples.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import ssl
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
for _p in (str(ROOT), str(BENCH)):
    if _p not in sys.path:  # runnable from any directory, also without the editable install
        sys.path.insert(0, _p)

from _benchlib import (  # noqa: E402 - bench/ is the script's own directory
    START_TIMEOUT_S,
    BenchError,
    Server,
    children,
    cmdline,
    context_switches,
    cpu_seconds,
    percentile,
    ratio,
    start_server,
    stop_server,
    table,
    timed_concurrent,
    timed_sequential,
)
from _benchlib import warm_up as bench_warm_up  # noqa: E402
from _invoke_profile import Target, profile_processes  # noqa: E402

from kruntimes.rpc.v1 import runtime_pb2 as pb  # noqa: E402
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc  # noqa: E402
from kruntimes.tls import ensure_tls  # noqa: E402

CHAIN_SCRIPT = BENCH / "_invoke_chain.py"
INVOKE_METHOD = "/kruntimes.rpc.v1.FunctionRuntime/InvokeFunction"
NAMESPACE = "default"
TOKEN = "bench-token-" + uuid.uuid4().hex

PAYLOAD = b'{"n": 1}'
HANDLER_SOURCE = b"def handle(payload):\n    return payload\n"
SUCCEEDED = b'"status":"Succeeded"'
FUNCTIONS = 32
WARMUP_CALLS = 200
SEQ_CALLS = 2000
CONCURRENCY = 32
LOAD_SECONDS = 3.0
ROUNDS = 5  # SEQ_CALLS and LOAD_SECONDS are split over the rounds
SEQ_CHUNK_MAX_SECONDS = 6.0
LOAD_MAX_CALLS_PER_CALLER = 100_000
CALL_TIMEOUT_S = 10.0
ROUTE_TIMEOUT_S = 20.0
ROUNDS_BUDGET_S = 80.0  # no new round starts after this many seconds of the bench
BENCH_DEADLINE_S = 115.0
TARGET_P50_RATIO = 1.2
TARGET_P99_MS = 2.0
TARGET_RPS_RATIO = 1.0

Call = Callable[[int], Awaitable[None]]


class HttpStatusError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


# -- /proc helpers ---------------------------------------------------------------------------


def function_pids(host_pid: int) -> list[int]:
    """The function processes: the children of the host's zygote."""
    kids = children(host_pid)
    zygote = next((p for p in kids if "runtime.zygote" in cmdline(p)), kids[0] if len(kids) == 1 else None)
    return children(zygote) if zygote is not None else []


# -- server processes ------------------------------------------------------------------------


# -- measurement -----------------------------------------------------------------------------


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    if isinstance(exc, HttpStatusError):
        return f"HTTP{exc.status}"
    return type(exc).__name__


@dataclass
class Subject:
    """One measured path and everything measured on it, summed over the rounds."""

    key: str
    name: str
    call: Call
    procs: dict[str, list[int]]  # server process label -> pids (CPU summed per label)
    seq_ms: list[float] = field(default_factory=list)
    seq_cpu_s: Counter[str] = field(default_factory=Counter)
    load_ms: list[float] = field(default_factory=list)
    load_s: float = 0.0
    load_cpu_s: Counter[str] = field(default_factory=Counter)
    load_switches: Counter[str] = field(default_factory=Counter)
    client_cpu_s: float = 0.0
    round_p50: list[float] = field(default_factory=list)
    round_p99: list[float] = field(default_factory=list)
    round_rps: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    first_error: str = ""

    def cpu(self) -> dict[str, float]:
        return {label: sum(map(cpu_seconds, pids)) for label, pids in self.procs.items()}

    def switches(self) -> dict[str, int]:
        return {label: sum(map(context_switches, pids)) for label, pids in self.procs.items()}

    def switches_per_call(self, label: str) -> float:
        return self.load_switches[label] / len(self.load_ms) if self.load_ms else math.nan

    def seq(self, q: float) -> float:
        return percentile(self.seq_ms, q)

    @property
    def rps(self) -> float:
        return len(self.load_ms) / self.load_s if self.load_s > 0 else math.nan

    def load_cpu_us(self, label: str | None = None) -> float:
        seconds = sum(self.load_cpu_s.values()) if label is None else self.load_cpu_s[label]
        return seconds / len(self.load_ms) * 1e6 if self.load_ms else math.nan

    def seq_cpu_us(self, label: str | None = None) -> float:
        seconds = sum(self.seq_cpu_s.values()) if label is None else self.seq_cpu_s[label]
        return seconds / len(self.seq_ms) * 1e6 if self.seq_ms else math.nan

    @property
    def client_cpu_us(self) -> float:
        return self.client_cpu_s / len(self.load_ms) * 1e6 if self.load_ms else math.nan

    def record_error(self, exc: BaseException) -> None:
        self.errors[_error_name(exc)] += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    def summary(self) -> dict[str, Any]:
        return {
            "seq_calls": len(self.seq_ms),
            "seq_p50_ms": round(self.seq(50), 4),
            "seq_p99_ms": round(self.seq(99), 4),
            "seq_max_ms": round(max(self.seq_ms, default=math.nan), 3),
            "load_calls": len(self.load_ms),
            "rps": round(self.rps, 1),
            "load_p50_ms": round(percentile(self.load_ms, 50), 3),
            "load_p99_ms": round(percentile(self.load_ms, 99), 3),
            "server_cpu_us_per_call": round(self.load_cpu_us(), 1),
            "server_cpu_us_per_call_by_process": {k: round(self.load_cpu_us(k), 1) for k in self.procs},
            "context_switches_per_call_by_process": {
                k: round(self.switches_per_call(k), 2) for k in self.procs
            },
            "seq_server_cpu_us_per_call": round(self.seq_cpu_us(), 1),
            "seq_server_cpu_us_per_call_by_process": {k: round(self.seq_cpu_us(k), 1) for k in self.procs},
            "client_cpu_us_per_call": round(self.client_cpu_us, 1),
            "round_seq_p50_ms": [round(x, 4) for x in self.round_p50],
            "round_seq_p99_ms": [round(x, 4) for x in self.round_p99],
            "round_rps": [round(x, 1) for x in self.round_rps],
            "errors": dict(self.errors),
        }


async def warm_up(subject: Subject, concurrent: bool) -> None:
    await bench_warm_up(subject.call, calls=WARMUP_CALLS, callers=CONCURRENCY, concurrent=concurrent)


async def sequential(subject: Subject, calls: int) -> None:
    await warm_up(subject, concurrent=False)
    cpu0 = subject.cpu()
    latencies = await timed_sequential(
        subject.call, calls=calls, max_seconds=SEQ_CHUNK_MAX_SECONDS, on_error=subject.record_error
    )
    subject.seq_cpu_s.update({k: v - cpu0[k] for k, v in subject.cpu().items()})
    subject.seq_ms.extend(latencies)
    subject.round_p50.append(percentile(latencies, 50))
    subject.round_p99.append(percentile(latencies, 99))


async def load(subject: Subject, seconds: float) -> tuple[int, float]:
    """CONCURRENCY callers, each calling back to back (caller i always uses function i)."""
    latencies, elapsed = await timed_concurrent(
        subject.call,
        callers=CONCURRENCY,
        seconds=seconds,
        max_calls_per_caller=LOAD_MAX_CALLS_PER_CALLER,
        on_error=subject.record_error,
    )
    subject.load_ms.extend(latencies)
    return len(latencies), elapsed


async def concurrent(subject: Subject, seconds: float) -> None:
    await warm_up(subject, concurrent=True)
    cpu0, switches0, client0 = subject.cpu(), subject.switches(), time.process_time()
    calls, elapsed = await load(subject, seconds)
    subject.client_cpu_s += time.process_time() - client0
    subject.load_cpu_s.update({k: v - cpu0[k] for k, v in subject.cpu().items()})
    subject.load_switches.update({k: v - switches0[k] for k, v in subject.switches().items()})
    subject.load_s += elapsed
    subject.round_rps.append(calls / elapsed)


# -- set-up ----------------------------------------------------------------------------------


def register_request(index: int, run_uid: str) -> pb.RegisterFunctionRequest:
    return pb.RegisterFunctionRequest(
        run=pb.RunRef(run_uid=run_uid, attempt=1, namespace=NAMESPACE, name=f"fn-{index}", runtime="python"),
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=HANDLER_SOURCE)]),
        ),
    )


@dataclass
class Function:
    run_uid: str
    registration_id: str
    host_uid: str


async def register_functions(channel: grpc.aio.Channel) -> list[Function]:
    stub = pb_grpc.FunctionRuntimeStub(channel)
    functions = []
    for i in range(FUNCTIONS):
        run_uid = str(uuid.uuid4())
        response = await stub.RegisterFunction(register_request(i, run_uid), timeout=CALL_TIMEOUT_S)
        functions.append(Function(run_uid, response.registration_id, response.host_uid))
    return functions


def write_auth_files(tmp: Path) -> tuple[Path, Path]:
    tokens = tmp / "tokens.csv"
    tokens.write_text(f'{TOKEN},bench,1000,"bench"\n')
    tokens.chmod(0o600)
    bindings = tmp / "role-bindings.yaml"
    bindings.write_text(f"bindings:\n- namespace: {NAMESPACE}\n  users: [bench]\n")
    return tokens, bindings


async def wait_for_routes(call: Call, n: int) -> None:
    """Until the gateway answers an invoke of every function (its route came with a heartbeat)."""
    deadline = time.monotonic() + ROUTE_TIMEOUT_S
    for i in range(n):
        while True:
            try:
                await call(i)
                break
            except (HttpStatusError, aiohttp.ClientError) as exc:
                if time.monotonic() > deadline:
                    raise BenchError(f"the gateway did not route function {i}: {exc}") from None
                await asyncio.sleep(0.05)


@dataclass
class Setup:
    subjects: dict[str, Subject]
    servers: dict[str, Server]


class Clients:
    """The client side of every path: one aiohttp session and the per-path call functions."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.json_headers = {"Content-Type": "application/json"}
        self.auth_headers = {"Authorization": f"Bearer {TOKEN}", **self.json_headers}

    def gateway(self, base_url: str, functions: list[Function]) -> Call:
        session, headers = self.session, self.auth_headers
        urls = [
            URL(f"{base_url}/v1/namespaces/{NAMESPACE}/runtimes/python/functions/{f.run_uid}:invoke")
            for f in functions
        ]

        async def gateway_call(i: int) -> None:
            async with session.post(urls[i], data=PAYLOAD, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise HttpStatusError(resp.status, body)
            if SUCCEEDED not in body:
                raise BenchError(f"the gateway answered {body[:200]!r}")

        return gateway_call

    @staticmethod
    def direct(channel: grpc.aio.Channel, functions: list[Function]) -> Call:
        invoke = channel.unary_unary(INVOKE_METHOD)  # bytes in, bytes out: serialized once up front
        requests = [
            pb.InvokeFunctionRequest(
                registration_id=f.registration_id,
                payload=PAYLOAD,
                fence=pb.Fence(run_uid=f.run_uid, attempt=1, host_uid=f.host_uid),
            ).SerializeToString()
            for f in functions
        ]

        async def direct_call(i: int) -> None:
            response = pb.InvokeFunctionResponse.FromString(await invoke(requests[i], timeout=CALL_TIMEOUT_S))
            if response.status != pb.INVOCATION_STATUS_SUCCEEDED:
                raise BenchError(f"invoke: {pb.InvocationStatus.Name(response.status)} {response.error}")

        return direct_call

    def chain(self, url: str) -> Call:
        session, headers, target = self.session, self.json_headers, URL(url + "/invoke")

        async def chain_call(_: int) -> None:
            async with session.post(target, data=PAYLOAD, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise HttpStatusError(resp.status, body)
            if body != PAYLOAD:
                raise BenchError(f"the chain answered {body[:200]!r}")

        return chain_call


async def set_up(
    tmp: Path, servers: list[Server], stack: contextlib.AsyncExitStack, args: argparse.Namespace
) -> Setup:
    """Start every server, register the functions, wait for the routes; one Subject per path.

    The base stack is `python -m gateway` → `python -m workers.host`. With --alt-gateway-script
    and/or --alt-host-script an alternative stack (the given scripts, the base for the other) is
    measured too, as paths gateway-alt (and direct-alt when the host is replaced).
    """
    py = sys.executable
    tls = ensure_tls(tmp / "tls")
    tokens, bindings = write_auth_files(tmp)
    gateway_args = ["--listen", "127.0.0.1:0", "--heartbeat-listen", "127.0.0.1:0"]
    gateway_args += ["--cert", str(tls.cert), "--key", str(tls.key), "--auth", "embedded"]
    gateway_args += ["--token-file", str(tokens), "--role-bindings", str(bindings), "--log-level", "warning"]
    gateways = {"gateway": [py, "-m", "gateway"]}
    hosts = {"host": [py, "-m", "workers.host"]}
    pairs = [("", "gateway", "host")]  # (path suffix, gateway, host)
    if args.alt_gateway_script or args.alt_host_script:
        gw_name = "gateway-alt" if args.alt_gateway_script else "gateway"
        host_name = "host-alt" if args.alt_host_script else "host"
        if args.alt_gateway_script:
            gateways[gw_name] = [py, str(args.alt_gateway_script)]
        if args.alt_host_script:
            hosts[host_name] = [py, str(args.alt_host_script)]
        pairs.append(("-alt", gw_name, host_name))
    chains = {"chain": False} if args.no_uvloop_chain else {"chain": False, "chain-uv": True}

    def grpc_argv(uv: bool) -> list[str]:
        return [py, str(CHAIN_SCRIPT), "grpc", "--children", str(CONCURRENCY), *(["--uvloop"] if uv else [])]

    _note("starting the servers ...")
    first = [start_server(name, [*argv, *gateway_args], tmp, servers) for name, argv in gateways.items()]
    first += [start_server(f"{key}-grpc", grpc_argv(uv), tmp, servers) for key, uv in chains.items()]
    started = await asyncio.gather(*first)
    gw = dict(zip(gateways, started, strict=False))
    chain_grpcs = started[len(gateways) :]

    second = []
    for name, argv in hosts.items():
        (tmp / f"{name}-state").mkdir()
        host_argv = [*argv, "--host-id", f"bench-{name}", "--runtime", "python"]
        host_argv += ["--state-dir", str(tmp / f"{name}-state"), "--heartbeat-interval", "1"]
        for g in sorted({g for _, g, h in pairs if h == name}):
            host_argv += ["--gateway", gw[g].ready["heartbeatAddress"]]
        second.append(start_server(name, [*host_argv, "--log-level", "warning"], tmp, servers))
    for (key, uv), upstream in zip(chains.items(), chain_grpcs, strict=True):
        argv = [py, str(CHAIN_SCRIPT), "http", "--upstream", upstream.ready["address"]]
        argv += ["--cert", str(tls.cert), "--key", str(tls.key), *(["--uvloop"] if uv else [])]
        second.append(start_server(f"{key}-http", argv, tmp, servers))
    started = await asyncio.gather(*second)
    hs = dict(zip(hosts, started, strict=False))
    chain_https = started[len(hosts) :]

    client_ssl = ssl.create_default_context(cafile=str(tls.ca_cert))
    connector = aiohttp.TCPConnector(limit=64, ssl=client_ssl, keepalive_timeout=120)
    clients = Clients(await stack.enter_async_context(aiohttp.ClientSession(connector=connector)))

    registered: dict[str, tuple[grpc.aio.Channel, list[Function], list[int]]] = {}
    for name, host in hs.items():
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(host.ready["address"]))
        await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)
        _note(f"registering {FUNCTIONS} functions on {name} ...")
        functions = await register_functions(channel)
        fns = function_pids(host.pid)
        if len(fns) < FUNCTIONS:
            _note(f"warning: {len(fns)} function processes under {name}'s zygote, not {FUNCTIONS}")
        registered[name] = (channel, functions, fns)

    subjects: dict[str, Subject] = {}
    for suffix, g, h in pairs:
        channel, functions, fns = registered[h]
        call = clients.gateway(gw[g].ready["url"], functions)
        _note(f"waiting for {g}'s routes to {h} ...")
        await wait_for_routes(call, FUNCTIONS)
        key = "gateway" + suffix
        label = "gateway (HTTPS → gRPC → fn)" if not suffix else f"{key}: {g} → {h} (A/B)"
        procs = {"gateway": [gw[g].pid], "host": [hs[h].pid], "functions": fns}
        subjects[key] = Subject(key, label, call, procs)
        if not suffix or h != "host":
            key = "direct" + suffix
            label = "(a) direct gRPC InvokeFunction" if not suffix else f"{key}: {h} (A/B)"
            procs = {"host": [hs[h].pid], "functions": fns}
            subjects[key] = Subject(key, label, clients.direct(channel, functions), procs)
    for (key, uv), grpc_server, http_server in zip(chains.items(), chain_grpcs, chain_https, strict=True):
        subjects[key] = Subject(
            key,
            "(b) raw chain" + (" on uvloop" if uv else " (asyncio)"),
            clients.chain(http_server.ready["address"]),
            {"http": [http_server.pid], "grpc": [grpc_server.pid], "child": children(grpc_server.pid)},
        )
    return Setup(subjects, {s.name: s for s in servers})


# -- report ----------------------------------------------------------------------------------


def _f(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _span(values: list[float]) -> str:
    """min–max (median) of per-round values."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    return f"{min(finite):.2f}–{max(finite):.2f} (median {percentile(finite, 50):.2f})"


def _finite(value: Any) -> Any:
    """NaN (something that could not be measured) becomes null, so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _by_process(s: Subject) -> str:
    return " + ".join(f"{k} {_f(s.load_cpu_us(k), 0)}" for k in s.procs)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(subjects: dict[str, Subject], rounds: int, client_loop: str, elapsed: float) -> None:
    header = ["path", "seq p50 ms", "seq p99 ms", "seq max ms", "32-way rps", "load p50 ms", "load p99 ms"]
    header += ["server CPU µs/call", "client CPU µs/call", "errors"]
    rows = [header]
    for s in subjects.values():
        rows.append(
            [
                s.name,
                _f(s.seq(50)),
                _f(s.seq(99)),
                _f(max(s.seq_ms, default=math.nan), 2),
                _f(s.rps, 0),
                _f(percentile(s.load_ms, 50), 2),
                _f(percentile(s.load_ms, 99), 2),
                _f(s.load_cpu_us(), 0),
                _f(s.client_cpu_us, 0),
                ",".join(f"{k}:{v}" for k, v in s.errors.items()) or "0",
            ]
        )
    print(
        f"\ninvoke bench: loopback, {os.cpu_count()} CPUs, client loop {client_loop}, payload "
        f"{len(PAYLOAD)} B; {SEQ_CALLS} sequential calls and {CONCURRENCY} callers x {LOAD_SECONDS:g} s "
        f"per path, interleaved in {rounds} rounds"
    )
    print("\n".join(table(rows)))
    cpu_rows = [["path", "process", "µs/call 32-way", "µs/call sequential", "ctx sw/call 32-way"]]
    for s in subjects.values():
        for label, pids in s.procs.items():
            name = f"{label} ({len(pids)})" if len(pids) > 1 else f"{label} (pid {pids[0] if pids else '-'})"
            row = [s.key, name, _f(s.load_cpu_us(label), 0), _f(s.seq_cpu_us(label), 0)]
            cpu_rows.append([*row, _f(s.switches_per_call(label), 1)])
    print("\nserver CPU per call by process (utime+stime from /proc; processes of a kind summed):")
    print("\n".join(table(cpu_rows)))
    for s in subjects.values():
        if s.first_error:
            print(f"first error on {s.key}: {s.first_error}")

    gw, chain, direct = subjects["gateway"], subjects["chain"], subjects["direct"]
    r_p50 = ratio(gw.seq(50), chain.seq(50))
    r_p99 = ratio(gw.seq(99), chain.seq(99))
    r_rps = ratio(gw.rps, chain.rps)
    rounds_p50 = [ratio(a, b) for a, b in zip(gw.round_p50, chain.round_p50, strict=False)]
    rounds_p99 = [ratio(a, b) for a, b in zip(gw.round_p99, chain.round_p99, strict=False)]
    rounds_rps = [ratio(a, b) for a, b in zip(gw.round_rps, chain.round_rps, strict=False)]
    met = {
        "p50": r_p50 <= TARGET_P50_RATIO,
        "p99": gw.seq(99) <= TARGET_P99_MS,
        "rps": r_rps >= TARGET_RPS_RATIO,
    }
    print("\ngateway against the raw chain (b); per round: min–max (median)")
    print(
        f"  gateway p50 / chain p50   {_f(r_p50, 2)}×   per round {_span(rounds_p50)}   "
        f"target ≤ {TARGET_P50_RATIO}×: {_met(met['p50'])}"
    )
    print(
        f"  gateway p99               {_f(gw.seq(99), 2)} ms (chain {_f(chain.seq(99), 2)} ms; ratio "
        f"{_f(r_p99, 2)}×, per round {_span(rounds_p99)})   target ≤ {TARGET_P99_MS} ms: {_met(met['p99'])}"
    )
    print(
        f"  gateway rps / chain rps   {_f(r_rps, 2)}×   per round {_span(rounds_rps)}   "
        f"target ≥ {TARGET_RPS_RATIO}×: {_met(met['rps'])}"
    )
    print(
        f"  server CPU per call: gateway path {_f(gw.load_cpu_us(), 0)} µs ({_by_process(gw)}) "
        f"vs chain {_f(chain.load_cpu_us(), 0)} µs ({_by_process(chain)})"
    )
    cpu_rps = ratio(chain.load_cpu_us() + chain.client_cpu_us, gw.load_cpu_us() + gw.client_cpu_us)
    print(
        f"  CPU-bound estimate of gateway rps / chain rps (server + client CPU per call; the machine is "
        f"saturated in the 32-way phase, so this is steadier than the measured rps): {_f(cpu_rps, 2)}×"
    )
    print("(a) direct gRPC against the chain and the gateway:")
    print(
        f"  direct p50 / chain p50 {_f(ratio(direct.seq(50), chain.seq(50)), 2)}×, direct rps / chain rps "
        f"{_f(ratio(direct.rps, chain.rps), 2)}×; the gateway adds {_f(gw.seq(50) - direct.seq(50), 3)} ms "
        f"at p50 and {_f(gw.load_cpu_us('gateway'), 0)} µs of gateway CPU per call (host CPU per call "
        f"{_f(gw.load_cpu_us('host'), 0)} via the gateway vs {_f(direct.load_cpu_us('host'), 0)} direct)"
    )
    uv = subjects.get("chain-uv")
    if uv is not None:
        print(
            f"chain on uvloop: p50 {_f(uv.seq(50), 3)} ms ({_f(ratio(uv.seq(50), chain.seq(50)), 2)}× the "
            f"asyncio chain), rps {_f(uv.rps, 0)} ({_f(ratio(uv.rps, chain.rps), 2)}×), server CPU "
            f"{_f(uv.load_cpu_us(), 0)} µs/call; gateway rps / uvloop chain rps "
            f"{_f(ratio(gw.rps, uv.rps), 2)}×"
        )
    ab = ab_report(subjects)
    print(f"\nbench took {elapsed:.1f} s")

    out = {
        "bench": "invoke",
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "aiohttp": aiohttp.__version__,
        "client_loop": client_loop,
        "rounds": rounds,
        "paths": {k: s.summary() for k, s in subjects.items()},
        "ratio_gateway_p50_vs_chain": round(r_p50, 3),
        "ratio_gateway_p99_vs_chain": round(r_p99, 3),
        "ratio_gateway_rps_vs_chain": round(r_rps, 3),
        "round_ratio_gateway_p50_vs_chain": [round(x, 3) for x in rounds_p50],
        "round_ratio_gateway_rps_vs_chain": [round(x, 3) for x in rounds_rps],
        "ratio_direct_p50_vs_chain": round(ratio(direct.seq(50), chain.seq(50)), 3),
        "ratio_direct_rps_vs_chain": round(ratio(direct.rps, chain.rps), 3),
        "ratio_gateway_rps_vs_chain_uvloop": round(ratio(gw.rps, uv.rps), 3) if uv else None,
        "targets": {"p50_ratio_max": TARGET_P50_RATIO, "p99_ms_max": TARGET_P99_MS, "rps_ratio_min": 1.0},
        "target_met": met,
        "cpu_estimate_gateway_rps_vs_chain": round(cpu_rps, 3),
        "ab": ab,
        "seconds": round(elapsed, 1),
    }
    print(json.dumps(_finite(out), separators=(",", ":"), allow_nan=False))


def ab_report(subjects: dict[str, Subject]) -> dict[str, Any]:
    """The --alt-* variants against the path they replace, measured in the same rounds."""
    out: dict[str, Any] = {}
    for key, alt in subjects.items():
        base_key = key.removesuffix("-alt") if key.endswith("-alt") else None
        base = subjects.get(base_key) if base_key else None
        if base is None:
            continue
        rounds_p50 = [ratio(a, b) for a, b in zip(alt.round_p50, base.round_p50, strict=False)]
        rounds_rps = [ratio(a, b) for a, b in zip(alt.round_rps, base.round_rps, strict=False)]
        cpu = {k: alt.load_cpu_us(k) - base.load_cpu_us(k) for k in alt.procs if k in base.procs}
        print(
            f"A/B {key} vs {base_key}: p50 {_f(alt.seq(50), 3)} vs {_f(base.seq(50), 3)} ms "
            f"({_f(ratio(alt.seq(50), base.seq(50)), 2)}×, per round {_span(rounds_p50)}), rps "
            f"{_f(alt.rps, 0)} vs {_f(base.rps, 0)} ({_f(ratio(alt.rps, base.rps), 2)}×, per round "
            f"{_span(rounds_rps)}), server CPU µs/call {_f(alt.load_cpu_us(), 0)} vs "
            f"{_f(base.load_cpu_us(), 0)} (" + ", ".join(f"{k} {v:+.0f}" for k, v in cpu.items()) + ")"
        )
        out[key] = {
            "vs": base_key,
            "p50_ratio": round(ratio(alt.seq(50), base.seq(50)), 3),
            "rps_ratio": round(ratio(alt.rps, base.rps), 3),
            "cpu_us_per_call_delta": {k: round(v, 1) for k, v in cpu.items()},
        }
    return out


# -- main ------------------------------------------------------------------------------------


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _log_problems(servers: list[Server]) -> None:
    for server in servers:
        lines = server.log_lines()
        problems = [line for line in lines if any(w in line for w in ("ERROR", "Traceback", "error"))]
        if problems:
            _note(f"{server.name} logged {len(problems)} error lines, e.g.:\n" + "\n".join(problems[:5]))


async def run_rounds(subjects: dict[str, Subject], started: float) -> int:
    rounds = 0
    order = list(subjects.values())
    for r in range(ROUNDS):
        if time.perf_counter() - started > ROUNDS_BUDGET_S:
            _note(f"warning: time budget spent; stopping after {rounds} rounds")
            break
        _note(f"round {r + 1}/{ROUNDS} ...")
        rotated = order[r % len(order) :] + order[: r % len(order)]
        for subject in rotated:
            await sequential(subject, SEQ_CALLS // ROUNDS)
        for subject in rotated:
            await concurrent(subject, LOAD_SECONDS / ROUNDS)
        rounds += 1
    return rounds


async def run_profiles(setup: Setup, args: argparse.Namespace) -> None:
    """32-way load per path while py-spy samples its server processes and one function process."""
    out_dir: Path = args.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    for key in args.profile_paths.split(","):
        subject = setup.subjects.get(key)
        if subject is None:
            raise BenchError(f"--profile-paths: no path {key!r} (have {', '.join(setup.subjects)})")
        targets = [  # the servers, and one of the function processes or children
            Target(label if len(pids) == 1 else f"{label}-0", pids[0], 1 / len(pids))
            for label, pids in subject.procs.items()
            if pids
        ]
        _note(f"profiling {key}: {', '.join(f'{t.label} pid {t.pid}' for t in targets)} ...")
        await warm_up(subject, concurrent=True)
        cpu0 = subject.cpu()
        calls_box: list[int] = []

        async def drive(subject: Subject = subject, box: list[int] = calls_box) -> None:
            calls, _ = await load(subject, args.profile_seconds)
            box.append(calls)

        profiles = await profile_processes(
            targets,
            drive(),
            seconds=args.profile_seconds,
            out_dir=out_dir,
            prefix=key,
            rate=args.profile_rate,
            native=args.profile_native,
            gil=args.profile_gil,
        )
        calls = calls_box[0] if calls_box else 0
        cpu = {k: v - cpu0[k] for k, v in subject.cpu().items()}
        print(
            f"\n== {key}: {calls} calls in {args.profile_seconds:g} s under py-spy "
            f"({calls / args.profile_seconds:.0f}/s; the sampler itself takes CPU), server CPU µs/call: "
            + ", ".join(f"{k} {v / max(calls, 1) * 1e6:.0f}" for k, v in cpu.items())
            + f"; errors {dict(subject.errors) or 0}"
        )
        for profile in profiles:
            print(profile.render(calls, top=args.profile_top))


async def run(args: argparse.Namespace, client_loop: str) -> None:
    started = time.perf_counter()
    servers: list[Server] = []
    subjects: dict[str, Subject] = {}
    rounds = 0
    with tempfile.TemporaryDirectory(prefix="krt-bench-invoke-") as tmp_name:
        try:
            async with contextlib.AsyncExitStack() as stack:
                setup = await set_up(Path(tmp_name), servers, stack, args)
                subjects = setup.subjects
                if args.profile:
                    await run_profiles(setup, args)
                else:
                    rounds = await run_rounds(subjects, started)
        finally:
            for server in servers:
                stop_server(server)
            _log_problems(servers)
    if not args.profile:
        report(subjects, rounds, client_loop, time.perf_counter() - started)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-uvloop-chain", action="store_true", help="skip the chain-on-uvloop path")
    p.add_argument(
        "--alt-gateway-script",
        type=Path,
        metavar="SCRIPT",
        help="A/B: an alternative gateway, `python SCRIPT <gateway args>` (e.g. a patched copy), "
        "measured as path gateway-alt next to the base",
    )
    p.add_argument(
        "--alt-host-script",
        type=Path,
        metavar="SCRIPT",
        help="A/B: an alternative host, `python SCRIPT <host args>`, measured as paths gateway-alt "
        "(behind the alternative gateway if given, else the base one) and direct-alt",
    )
    p.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the servers instead of the bench")
    p.add_argument("--profile-paths", default="gateway,chain", help="comma-separated paths to profile")
    p.add_argument("--profile-seconds", type=float, default=15.0)
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="py-spy --native (C frames; pauses the process per sample and does not drop idle threads)",
    )
    p.add_argument("--profile-gil", action="store_true", help="py-spy --gil (only the GIL holder)")
    p.add_argument("--profile-top", type=int, default=30)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory, client_loop = uvloop.new_event_loop, "uvloop"
    except ImportError:
        loop_factory, client_loop = None, "asyncio"
    extra = len(args.profile_paths.split(",")) * (args.profile_seconds + 20) if args.profile else 0
    deadline = BENCH_DEADLINE_S + extra
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            runner.run(asyncio.wait_for(run(args, client_loop), deadline))
        except BenchError as exc:
            sys.exit(f"bench failed: {exc}")
        except TimeoutError:
            sys.exit(f"bench failed: did not finish within {deadline:.0f} s")


if __name__ == "__main__":
    main()
