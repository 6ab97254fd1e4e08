"""Benchmark: the Runtime Server's InvokeFunction next to raw gRPC echo baselines, in one run.

    .venv/bin/python bench/runtime_server.py        (or `make bench`)

Every server runs in its own process on 127.0.0.1 with a port picked at run time, so server CPU
(utime + stime from /proc/<pid>/stat) is not mixed with the client's: a sync gRPC echo, a
grpc.aio echo, a grpc.aio echo on uvloop (bench/_echo_server.py) and the runtime host
(`python -m workers.host`). The client is one grpc.aio channel per server (uvloop when
importable) sending the same ~10-byte payload on every path; the invoke request is serialized
once up front and each response parsed and checked, so the client's work is nearly the same.

Per path: sequential p50/p99 over 2000 calls, and 32 concurrent callers for ~3 s (calls/s,
latency under load, server CPU per call). The runtime host gets 32 different functions for the
concurrent phase, one per caller, because a registration runs one invocation at a time.
The paths are measured in interleaved rounds (each round: 1/ROUNDS of every phase for every
path, 200 warm-up calls before each piece), so background load on a shared machine hits all
paths alike and the ratios stay meaningful; the per-round spread of the ratios is printed too.

Also measured, first: registration cost (RegisterFunction -> first InvokeFunction answered, 100
functions one after another) and the memory of the function processes with 50 registered (PSS
and RSS per function, from /proc/<pid>/smaps_rollup of the zygote's children).

Prints a table, the ratios against the grpc.aio echo (target <= 1.5x) and a final JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from any directory, also without the editable install
    sys.path.insert(0, str(ROOT))

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

from kruntimes.rpc.v1 import runtime_pb2 as pb  # noqa: E402
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc  # noqa: E402

ECHO_SCRIPT = Path(__file__).resolve().with_name("_echo_server.py")
ECHO_METHOD = "/bench.Echo/Echo"
INVOKE_METHOD = "/kruntimes.rpc.v1.FunctionRuntime/InvokeFunction"
ECHO_KINDS = ("sync", "aio", "aio-uvloop")

PAYLOAD = b'{"n": 1}'
HANDLER_SOURCE = b"def handle(payload):\n    return payload\n"
WARMUP_CALLS = 200
SEQ_CALLS = 2000
CONCURRENCY = 32
LOAD_SECONDS = 3.0
ROUNDS = 4  # SEQ_CALLS and LOAD_SECONDS are split over the rounds
SEQ_CHUNK_MAX_SECONDS = 5.0
LOAD_MAX_CALLS_PER_CALLER = 50_000
REGISTRATIONS = 100
REGISTER_MAX_SECONDS = 20.0
MEMORY_AT = 50
CALL_TIMEOUT_S = 10.0
ROUNDS_BUDGET_S = 60.0  # no new round starts after this many seconds of the bench
BENCH_DEADLINE_S = 88.0
TARGET = 1.5

Call = Callable[[int], Awaitable[None]]


# -- /proc helpers ---------------------------------------------------------------------------


def memory_kib(pid: int) -> tuple[int, int]:
    """(Pss, Rss) in KiB from /proc/<pid>/smaps_rollup."""
    pss = rss = 0
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    return pss, rss


def zygote_of(host_pid: int) -> int | None:
    kids = children(host_pid)
    for pid in kids:
        if "runtime.zygote" in cmdline(pid):
            return pid
    return kids[0] if len(kids) == 1 else None


# -- server processes ------------------------------------------------------------------------


# -- measurement -----------------------------------------------------------------------------


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    return type(exc).__name__


@dataclass
class Subject:
    """One measured path and everything measured on it, summed over the rounds."""

    key: str
    name: str
    server: Server
    call: Call
    function_pids: list[int] = field(default_factory=list)  # the runtime host's function processes
    seq_ms: list[float] = field(default_factory=list)
    seq_cpu_s: float = 0.0
    load_ms: list[float] = field(default_factory=list)
    load_s: float = 0.0
    load_cpu_s: float = 0.0
    load_switches: int = 0
    function_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    round_p50: list[float] = field(default_factory=list)
    round_p99: list[float] = field(default_factory=list)
    round_rps: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def seq(self, q: float) -> float:
        return percentile(self.seq_ms, q)

    @property
    def rps(self) -> float:
        return len(self.load_ms) / self.load_s if self.load_s > 0 else math.nan

    def _per_call_us(self, seconds: float, calls: int) -> float:
        return seconds / calls * 1e6 if calls else math.nan

    @property
    def seq_cpu_us(self) -> float:
        return self._per_call_us(self.seq_cpu_s, len(self.seq_ms))

    @property
    def server_cpu_us(self) -> float:
        return self._per_call_us(self.load_cpu_s, len(self.load_ms))

    @property
    def switches_per_call(self) -> float:
        return self.load_switches / len(self.load_ms) if self.load_ms else math.nan

    @property
    def function_cpu_us(self) -> float:
        return self._per_call_us(self.function_cpu_s, len(self.load_ms)) if self.function_pids else math.nan

    @property
    def client_cpu_us(self) -> float:
        return self._per_call_us(self.client_cpu_s, len(self.load_ms))

    def summary(self) -> dict[str, Any]:
        return {
            "seq_calls": len(self.seq_ms),
            "seq_p50_ms": round(self.seq(50), 4),
            "seq_p99_ms": round(self.seq(99), 4),
            "seq_max_ms": round(max(self.seq_ms, default=math.nan), 3),
            "seq_server_cpu_us_per_call": round(self.seq_cpu_us, 1),
            "load_calls": len(self.load_ms),
            "rps": round(self.rps, 1),
            "load_p50_ms": round(percentile(self.load_ms, 50), 3),
            "load_p99_ms": round(percentile(self.load_ms, 99), 3),
            "server_cpu_us_per_call": round(self.server_cpu_us, 1),
            "server_context_switches_per_call": round(self.switches_per_call, 2),
            "function_cpu_us_per_call": round(self.function_cpu_us, 1),
            "client_cpu_us_per_call": round(self.client_cpu_us, 1),
            "round_seq_p50_ms": [round(x, 4) for x in self.round_p50],
            "round_rps": [round(x, 1) for x in self.round_rps],
            "errors": dict(self.errors),
        }


async def warm_up(subject: Subject, concurrent: bool) -> None:
    await bench_warm_up(subject.call, calls=WARMUP_CALLS, callers=CONCURRENCY, concurrent=concurrent)


def _record_error(subject: Subject) -> Callable[[BaseException], None]:
    def record(exc: BaseException) -> None:
        subject.errors[_error_name(exc)] += 1

    return record


async def sequential(subject: Subject, calls: int) -> None:
    await warm_up(subject, concurrent=False)
    cpu0 = cpu_seconds(subject.server.pid)
    latencies = await timed_sequential(
        subject.call, calls=calls, max_seconds=SEQ_CHUNK_MAX_SECONDS, on_error=_record_error(subject)
    )
    subject.seq_cpu_s += cpu_seconds(subject.server.pid) - cpu0
    subject.seq_ms.extend(latencies)
    subject.round_p50.append(percentile(latencies, 50))
    subject.round_p99.append(percentile(latencies, 99))


async def concurrent(subject: Subject, seconds: float) -> None:
    """CONCURRENCY callers, each calling back to back (caller i always uses function i)."""
    await warm_up(subject, concurrent=True)
    pid = subject.server.pid
    cpu0, fn0, client0 = cpu_seconds(pid), sum(map(cpu_seconds, subject.function_pids)), time.process_time()
    switches0 = context_switches(pid)
    latencies, elapsed = await timed_concurrent(
        subject.call,
        callers=CONCURRENCY,
        seconds=seconds,
        max_calls_per_caller=LOAD_MAX_CALLS_PER_CALLER,
        on_error=_record_error(subject),
    )
    subject.client_cpu_s += time.process_time() - client0
    subject.load_cpu_s += cpu_seconds(pid) - cpu0
    subject.load_switches += context_switches(pid) - switches0
    subject.function_cpu_s += sum(map(cpu_seconds, subject.function_pids)) - fn0
    subject.load_s += elapsed
    subject.load_ms.extend(latencies)
    subject.round_rps.append(len(latencies) / elapsed)


# -- the runtime host ------------------------------------------------------------------------


def register_request(index: int) -> pb.RegisterFunctionRequest:
    return pb.RegisterFunctionRequest(
        run=pb.RunRef(
            run_uid=str(uuid.uuid4()), attempt=1, namespace="bench", name=f"fn-{index}", runtime="python"
        ),
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=HANDLER_SOURCE)]),
        ),
    )


def invoke_request(registration_id: str) -> bytes:
    return pb.InvokeFunctionRequest(registration_id=registration_id, payload=PAYLOAD).SerializeToString()


def check_invoke(raw: bytes) -> None:
    response = pb.InvokeFunctionResponse.FromString(raw)
    if response.status != pb.INVOCATION_STATUS_SUCCEEDED:
        raise BenchError(f"invoke: {pb.InvocationStatus.Name(response.status)} {response.error}")


def function_memory(host_pid: int) -> dict[str, Any]:
    zygote = zygote_of(host_pid)
    if zygote is None:
        return {"error": f"no zygote among the children of {host_pid}"}
    fns = children(zygote)
    mem = [memory_kib(p) for p in fns]
    pss, rss = sum(m[0] for m in mem), sum(m[1] for m in mem)
    n = max(1, len(fns))
    host_pss, host_rss = memory_kib(host_pid)
    zyg_pss, zyg_rss = memory_kib(zygote)
    return {
        "functions": len(fns),
        "avg_pss_mib": round(pss / n / 1024, 2),
        "avg_rss_mib": round(rss / n / 1024, 2),
        "total_pss_mib": round(pss / 1024, 1),
        "zygote_pss_mib": round(zyg_pss / 1024, 1),
        "zygote_rss_mib": round(zyg_rss / 1024, 1),
        "host_pss_mib": round(host_pss / 1024, 1),
        "host_rss_mib": round(host_rss / 1024, 1),
    }


@dataclass
class Registrations:
    ids: list[str] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)  # RegisterFunction -> first invoke answered
    register_ms: list[float] = field(default_factory=list)  # the RegisterFunction call alone
    first_invoke_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return len(self.total_ms) / self.wall_s if self.wall_s else math.nan


async def register_functions(channel: grpc.aio.Channel, host_pid: int) -> Registrations:
    stub = pb_grpc.FunctionRuntimeStub(channel)
    invoke = channel.unary_unary(INVOKE_METHOD)
    regs = Registrations()
    deadline = time.perf_counter() + REGISTER_MAX_SECONDS
    for i in range(REGISTRATIONS):
        if time.perf_counter() > deadline:
            print(f"warning: registration stopped after {i} functions (time bound)", file=sys.stderr)
            break
        request = register_request(i)
        t0 = time.perf_counter()
        response = await stub.RegisterFunction(request, timeout=CALL_TIMEOUT_S)
        t1 = time.perf_counter()
        raw = await invoke(invoke_request(response.registration_id), timeout=CALL_TIMEOUT_S)
        t2 = time.perf_counter()
        check_invoke(raw)
        regs.wall_s += t2 - t0
        regs.ids.append(response.registration_id)
        regs.register_ms.append((t1 - t0) * 1000)
        regs.first_invoke_ms.append((t2 - t1) * 1000)
        regs.total_ms.append((t2 - t0) * 1000)
        if len(regs.ids) == MEMORY_AT:  # outside the timed part
            regs.memory = function_memory(host_pid)
    return regs


# -- report ----------------------------------------------------------------------------------


def _f(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _less(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{abs(1 - value) * 100:.0f}% {'less' if value <= 1 else 'more'}"


def _span(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    return f"{min(finite):.2f}–{max(finite):.2f}" if finite else "-"


def _finite(value: Any) -> Any:
    """NaN (something that could not be measured) becomes null, so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def report(
    subjects: dict[str, Subject], regs: Registrations, rounds: int, client_loop: str, elapsed: float
) -> None:
    header = [
        "path",
        "seq p50 ms",
        "seq p99 ms",
        "seq max ms",
        "32-way rps",
        "load p50 ms",
        "load p99 ms",
        "server CPU µs/call",
        "ctx sw/call",
        "fn procs µs/call",
        "client CPU µs/call",
        "errors",
    ]
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
                _f(s.server_cpu_us, 0),
                _f(s.switches_per_call, 1),
                _f(s.function_cpu_us, 0),
                _f(s.client_cpu_us, 0),
                ",".join(f"{k}:{v}" for k, v in s.errors.items()) or "0",
            ]
        )
    print(
        f"\nruntime_server bench: loopback, {os.cpu_count()} CPUs, grpcio {grpc.__version__}, "
        f"client loop {client_loop}, payload {len(PAYLOAD)} B; {SEQ_CALLS} sequential calls and "
        f"{CONCURRENCY} callers x {LOAD_SECONDS:g} s per path, interleaved in {rounds} rounds"
    )
    print("\n".join(table(rows)))
    print(
        "(server CPU and ctx sw: the server process, all threads, in the 32-way phase; "
        "fn procs: CPU of the function processes)"
    )

    inv, aio, sync, uv = subjects["invoke"], subjects["aio"], subjects["sync"], subjects["aio-uvloop"]
    r_p50 = ratio(inv.seq(50), aio.seq(50))
    r_p99 = ratio(inv.seq(99), aio.seq(99))
    r_rps = ratio(aio.rps, inv.rps)
    rounds_p50 = [ratio(a, b) for a, b in zip(inv.round_p50, aio.round_p50, strict=False)]
    rounds_p99 = [ratio(a, b) for a, b in zip(inv.round_p99, aio.round_p99, strict=False)]
    rounds_rps = [ratio(b, a) for a, b in zip(inv.round_rps, aio.round_rps, strict=False)]

    def met(value: float) -> str:
        return "met" if value <= TARGET else "not met"

    print(f"\nagainst the grpc.aio echo (target ≤ {TARGET}×)                  per round")
    print(f"  invoke p50 / aio-echo p50    {_f(r_p50, 2)}×  {_span(rounds_p50):>11}   target: {met(r_p50)}")
    print(f"  invoke p99 / aio-echo p99    {_f(r_p99, 2)}×  {_span(rounds_p99):>11}   target: {met(r_p99)}")
    print(f"  aio-echo rps / invoke rps    {_f(r_rps, 2)}×  {_span(rounds_rps):>11}   target: {met(r_rps)}")
    print(f"  invoke throughput = {_f(ratio(inv.rps, aio.rps), 2)} of the aio echo's")
    print("against the uvloop echo (the runtime host serves grpc.aio on uvloop; this isolates its own work):")
    print(
        f"  invoke p50 / uvloop-echo p50 {_f(ratio(inv.seq(50), uv.seq(50)), 2)}×, "
        f"uvloop-echo rps / invoke rps {_f(ratio(uv.rps, inv.rps), 2)}×, host CPU per call above the "
        f"uvloop echo {_f(inv.server_cpu_us - uv.server_cpu_us, 0)} µs (+{_f(inv.function_cpu_us, 0)} µs "
        "in the function process)"
    )
    cpu_sync = ratio(sync.server_cpu_us, aio.server_cpu_us)
    cpu_uv = ratio(uv.server_cpu_us, aio.server_cpu_us)
    print("server choice, server CPU per call in the 32-way phase:")
    print(
        f"  sync-echo / aio-echo     {_f(cpu_sync, 2)}×  ({_f(sync.server_cpu_us, 0)} vs "
        f"{_f(aio.server_cpu_us, 0)} µs, {_less(cpu_sync)})"
    )
    print(
        f"  uvloop-echo / aio-echo   {_f(cpu_uv, 2)}×  ({_f(uv.server_cpu_us, 0)} vs "
        f"{_f(aio.server_cpu_us, 0)} µs, {_less(cpu_uv)})"
    )
    echoes = [s for s in (sync, aio, uv) if not math.isnan(s.server_cpu_us)]
    leaner = min(echoes, key=lambda s: s.server_cpu_us) if echoes else None
    print(f"  leaner server: {leaner.name if leaner else '-'} (the runtime host uses grpc.aio on uvloop)")

    mem = regs.memory
    print(
        f"\nregistration, RegisterFunction → first InvokeFunction answered ({len(regs.total_ms)} functions):"
    )
    print(
        f"  p50 {_f(percentile(regs.total_ms, 50), 2)} ms, p99 {_f(percentile(regs.total_ms, 99), 2)} ms, "
        f"max {_f(max(regs.total_ms, default=math.nan), 2)} ms; {_f(regs.per_second, 1)} registrations/s"
    )
    print(
        f"  RegisterFunction alone p50 {_f(percentile(regs.register_ms, 50), 2)} / "
        f"p99 {_f(percentile(regs.register_ms, 99), 2)} ms; first invoke p50 "
        f"{_f(percentile(regs.first_invoke_ms, 50), 2)} / "
        f"p99 {_f(percentile(regs.first_invoke_ms, 99), 2)} ms"
    )
    if regs.total_ms:
        slowest = sorted(range(len(regs.total_ms)), key=lambda i: -regs.total_ms[i])[:3]
        print(
            f"  the first one (right after the host said ready) {_f(regs.total_ms[0], 1)} ms; "
            f"without it p50 {_f(percentile(regs.total_ms[1:], 50), 2)} / "
            f"p99 {_f(percentile(regs.total_ms[1:], 99), 2)} ms; slowest: "
            + ", ".join(f"#{i + 1} {regs.total_ms[i]:.1f} ms" for i in slowest)
        )
    if not mem or "error" in mem:
        print(f"memory: not measured ({mem.get('error', 'fewer functions registered')})")
    else:
        print(f"memory with {MEMORY_AT} functions registered ({mem['functions']} function processes found):")
        print(f"  per function: PSS {mem['avg_pss_mib']} MiB, RSS {mem['avg_rss_mib']} MiB")
        print(
            f"  all functions PSS {mem['total_pss_mib']} MiB; zygote PSS {mem['zygote_pss_mib']} / "
            f"RSS {mem['zygote_rss_mib']} MiB; host PSS {mem['host_pss_mib']} / RSS {mem['host_rss_mib']} MiB"
        )
    print(f"\nbench took {elapsed:.1f} s")

    out = {
        "bench": "runtime_server",
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "client_loop": client_loop,
        "rounds": rounds,
        "invoke": inv.summary(),
        "echo_aio": aio.summary(),
        "echo_aio_uvloop": uv.summary(),
        "echo_sync": sync.summary(),
        "ratio_invoke_p50_vs_aio_echo": round(r_p50, 3),
        "ratio_invoke_p99_vs_aio_echo": round(r_p99, 3),
        "ratio_aio_echo_rps_vs_invoke": round(r_rps, 3),
        "invoke_rps_fraction_of_aio_echo": round(ratio(inv.rps, aio.rps), 3),
        "ratio_invoke_p50_vs_sync_echo": round(ratio(inv.seq(50), sync.seq(50)), 3),
        "ratio_sync_echo_rps_vs_invoke": round(ratio(sync.rps, inv.rps), 3),
        "ratio_invoke_p50_vs_uvloop_echo": round(ratio(inv.seq(50), uv.seq(50)), 3),
        "ratio_uvloop_echo_rps_vs_invoke": round(ratio(uv.rps, inv.rps), 3),
        "ratio_sync_vs_aio_echo_cpu": round(cpu_sync, 3),
        "ratio_uvloop_vs_aio_echo_cpu": round(cpu_uv, 3),
        "target": TARGET,
        "target_met": {"p50": r_p50 <= TARGET, "p99": r_p99 <= TARGET, "rps": r_rps <= TARGET},
        "registration": {
            "functions": len(regs.total_ms),
            "p50_ms": round(percentile(regs.total_ms, 50), 3),
            "p99_ms": round(percentile(regs.total_ms, 99), 3),
            "register_rpc_p50_ms": round(percentile(regs.register_ms, 50), 3),
            "first_invoke_p50_ms": round(percentile(regs.first_invoke_ms, 50), 3),
            "first_registration_ms": round(regs.total_ms[0], 3) if regs.total_ms else None,
            "p99_without_first_ms": round(percentile(regs.total_ms[1:], 99), 3),
            "per_second": round(regs.per_second, 1),
        },
        "memory": {"registered": MEMORY_AT, **mem},
        "seconds": round(elapsed, 1),
    }
    print(json.dumps(_finite(out), separators=(",", ":"), allow_nan=False))


# -- main ------------------------------------------------------------------------------------


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run(client_loop: str) -> None:
    started = time.perf_counter()
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="krt-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "host-state").mkdir()
        host_argv = [sys.executable, "-m", "workers.host", "--host-id", "bench-0", "--runtime", "python"]
        host_argv += ["--state-dir", str(tmp / "host-state"), "--log-level", "warning"]
        try:
            async with contextlib.AsyncExitStack() as stack:
                _note("starting the servers ...")
                starts = [start_server("runtime-host", host_argv, tmp, servers)]
                starts += [
                    start_server(f"echo-{k}", [sys.executable, str(ECHO_SCRIPT), "--kind", k], tmp, servers)
                    for k in ECHO_KINDS
                ]
                host, *echo_servers = await asyncio.gather(*starts)

                channels = {}
                for server in (host, *echo_servers):
                    channel = await stack.enter_async_context(grpc.aio.insecure_channel(server.address))
                    await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)  # connect untimed
                    channels[server.name] = channel

                _note(f"registering {REGISTRATIONS} functions ...")
                regs = await register_functions(channels[host.name], host.pid)
                if len(regs.ids) < CONCURRENCY:
                    raise BenchError(f"only {len(regs.ids)} functions registered; need {CONCURRENCY}")

                subjects: dict[str, Subject] = {}
                for kind, server in zip(ECHO_KINDS, echo_servers, strict=True):
                    echo = channels[server.name].unary_unary(ECHO_METHOD)  # bytes in, bytes out

                    async def echo_call(_: int, echo: grpc.aio.UnaryUnaryMultiCallable = echo) -> None:
                        if await echo(PAYLOAD, timeout=CALL_TIMEOUT_S) != PAYLOAD:
                            raise BenchError("the echo answered something else")

                    subjects[kind] = Subject(kind, f"grpc echo ({kind})", server, echo_call)

                invoke = channels[host.name].unary_unary(INVOKE_METHOD)  # bytes, like the echo
                requests = [invoke_request(rid) for rid in regs.ids[:CONCURRENCY]]

                async def invoke_call(i: int) -> None:
                    check_invoke(await invoke(requests[i], timeout=CALL_TIMEOUT_S))

                zygote = zygote_of(host.pid)
                function_pids = children(zygote) if zygote else []  # idle ones add nothing
                subjects["invoke"] = Subject(
                    "invoke", "runtime InvokeFunction", host, invoke_call, function_pids
                )

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
        finally:
            for server in servers:
                stop_server(server)
        host_log = next((s.log_lines() for s in servers if s.name == "runtime-host"), [])
        problems = [line for line in host_log if any(w in line for w in ("ERROR", "Traceback", "error"))]
        if problems:
            _note(f"the runtime host logged {len(problems)} error lines, e.g.:\n" + "\n".join(problems[:10]))
        report(subjects, regs, rounds, client_loop, time.perf_counter() - started)


def main() -> None:
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory, client_loop = uvloop.new_event_loop, "uvloop"
    except ImportError:
        loop_factory, client_loop = None, "asyncio"
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            runner.run(asyncio.wait_for(run(client_loop), BENCH_DEADLINE_S))
        except BenchError as exc:
            sys.exit(f"bench failed: {exc}")
        except TimeoutError:
            sys.exit(f"bench failed: did not finish within {BENCH_DEADLINE_S:.0f} s")


if __name__ == "__main__":
    main()
