"""Benchmark: the Runtime Server's InvokeFunction next to raw gRPC echo baselines, in one run.

    .venv/bin/python bench/runtime_server.py        (or `make bench`)

Every server runs in its own process on 127.0.0.1 with a port picked at run time, so server CPU
(utime + stime from /proc/<pid>/stat) is not mixed with the client's: a sync gRPC echo, a
grpc.aio echo, a grpc.aio echo on uvloop (bench/_echo_server.py) and the runtime host
(`python -m kruntimes.workers.host`). Every one serves mutual TLS with a host certificate of the bench's CA
(bench/_pki.py), as hosts always do; the client presents a gateway's certificate (invoking, the
echo) and the control plane's (registering). The client is one grpc.aio channel per server (uvloop when
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

What isolation costs: the same host with isolation (`python -m kruntimes.workers.host`, root: a uid per
function) and without (bench/_host_unsandboxed.py), in one run. Registration alternates between
the two hosts function by function; its ratio is the median over rounds of 10 function pairs of
p50(on) / p50(off). The warm invoke is measured in 48 alternating blocks of 25 sequential
calls on each host (the first host of a block alternates too), a share of them after each round so
that they spread over the run (on a loaded machine one host can be slow for seconds at a time;
those of rounds the time budget cut run after the last); its ratio is the median over blocks of
p50(on) / p50(off). Both print their per-round spread and the pooled p50 ratio next to it; the
targets are judged on the medians, which background load on a shared machine moves least.

Prints a table, the ratios against the grpc.aio echo (target <= 1.5x) and a final JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _benchlib as lib
import grpc
from _benchlib import CALL_TIMEOUT_S, PAYLOAD, BenchError, Subject, check_invoke, fmt, percentile, ratio, span
from _pki import CONTROL_PLANE, GATEWAY, BenchPKI

from kruntimes.pki import Identity
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc

ECHO_SCRIPT = Path(__file__).resolve().with_name("_echo_server.py")
ECHO_METHOD = "/bench.Echo/Echo"
ECHO_KINDS = ("sync", "aio", "aio-uvloop")

PLAN = lib.Plan(rounds=4, seq_chunk_max_s=5.0, load_max_calls_per_caller=50_000, rounds_budget_s=60.0)
REGISTRATIONS = 100
REGISTER_MAX_SECONDS = 20.0
MEMORY_AT = 50
BENCH_DEADLINE_S = 110.0
TARGET = 1.5
ISOLATION_REGISTER_TARGET = 1.2  # registration with isolation on / off
ISOLATION_INVOKE_TARGET = 1.05  # warm invoke p50 with isolation on / off
BARE_HOST = Path(__file__).resolve().with_name("_host_unsandboxed.py")
REGISTRATION_ROUND = 10  # function pairs (isolated, bare) per round of the registration ratio
AB_BLOCKS = 48  # alternating blocks of the warm-invoke comparison (a share after each round)
AB_BLOCK_CALLS = 25


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


# -- the measured paths ----------------------------------------------------------------------
# Every path's server process is labelled "server"; the runtime host's function processes "functions".


def server_cpu_us(s: Subject) -> float:
    return s.load_cpu_us("server")


def function_cpu_us(s: Subject) -> float:
    return s.load_cpu_us("functions") if s.procs.get("functions") else math.nan


def summary(s: Subject) -> dict[str, Any]:
    return {
        **s.latency_summary(),
        "seq_server_cpu_us_per_call": round(s.seq_cpu_us("server"), 1),
        "server_cpu_us_per_call": round(server_cpu_us(s), 1),
        "server_context_switches_per_call": round(s.switches_per_call("server"), 2),
        "function_cpu_us_per_call": round(function_cpu_us(s), 1),
        "client_cpu_us_per_call": round(s.client_cpu_us, 1),
        "round_seq_p50_ms": [round(x, 4) for x in s.round_p50],
        "round_rps": [round(x, 1) for x in s.round_rps],
        "errors": dict(s.errors),
    }


# -- the runtime host ------------------------------------------------------------------------


def invoke_request(registration_id: str) -> bytes:
    return pb.InvokeFunctionRequest(registration_id=registration_id, payload=PAYLOAD).SerializeToString()


def function_memory(host_pid: int) -> dict[str, Any]:
    zygote = lib.zygote_of(host_pid)
    if zygote is None:
        return {"error": f"no zygote among the children of {host_pid}"}
    fns = lib.function_pids(host_pid)
    mem = [memory_kib(p) for p in fns]
    pss, rss = sum(m[0] for m in mem), sum(m[1] for m in mem)
    n = max(1, len(fns))
    host_pss, host_rss = memory_kib(host_pid)
    zyg_pss, zyg_rss = memory_kib(zygote)
    return {
        "functions": len(fns),
        # a registered function's processes (isolated: its function process and the init of its
        # namespace), the host's seeds shared among them
        "per_function_pss_mib": round(pss / MEMORY_AT / 1024, 2),
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


@dataclass
class Target:
    """A runtime host to register on: its control and gateway channels, its process, its id."""

    control: grpc.aio.Channel
    channel: grpc.aio.Channel
    host: lib.Server
    host_id: str


async def register_functions(targets: list[Target], pki: BenchPKI) -> list[Registrations]:
    """REGISTRATIONS functions on each host, one host after the other function by function (so
    background load hits every host alike)."""
    calls = [
        (pb_grpc.FunctionRuntimeStub(t.control), t.channel.unary_unary(lib.INVOKE_METHOD), t) for t in targets
    ]
    all_regs = [Registrations() for _ in targets]
    deadline = time.perf_counter() + REGISTER_MAX_SECONDS * len(targets)
    for i in range(REGISTRATIONS):
        if time.perf_counter() > deadline:
            print(f"warning: registration stopped after {i} functions (time bound)", file=sys.stderr)
            break
        for (stub, invoke, target), regs in zip(calls, all_regs, strict=True):
            request = pki.register_request(
                i, host_id=target.host_id, host_uid=target.host.ready["hostUid"], namespace="bench"
            )
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
                regs.memory = function_memory(target.host.pid)
    return all_regs


def registration_rounds(on: Registrations, off: Registrations) -> list[float]:
    """p50(on) / p50(off) over each round of REGISTRATION_ROUND consecutive function pairs (the
    first pair, right after the hosts said ready, left out)."""
    pairs = min(len(on.total_ms), len(off.total_ms))
    return [
        ratio(
            percentile(on.total_ms[i : i + REGISTRATION_ROUND], 50),
            percentile(off.total_ms[i : i + REGISTRATION_ROUND], 50),
        )
        for i in range(1, pairs - REGISTRATION_ROUND + 1, REGISTRATION_ROUND)
    ]


@dataclass
class AB:
    """The warm invoke on the isolated host (on) next to the bare one (off), in alternating blocks."""

    on_ms: list[float] = field(default_factory=list)
    off_ms: list[float] = field(default_factory=list)
    block_ratios: list[float] = field(default_factory=list)

    @property
    def pooled(self) -> float:
        return ratio(percentile(self.on_ms, 50), percentile(self.off_ms, 50))

    @property
    def median(self) -> float:
        return percentile(self.block_ratios, 50)


async def isolation_ab(ab: AB, on: lib.Call, off: lib.Call, *, blocks: int) -> None:
    """`blocks` more alternating blocks of sequential warm invokes on each host into `ab`."""
    for _ in range(blocks):
        block = len(ab.block_ratios)
        latencies: dict[str, list[float]] = {}
        order = (("on", on), ("off", off)) if block % 2 == 0 else (("off", off), ("on", on))
        for name, call in order:
            latencies[name] = await lib.timed_sequential(
                call, calls=AB_BLOCK_CALLS, max_seconds=PLAN.seq_chunk_max_s, on_error=_raise
            )
        ab.on_ms += latencies["on"]
        ab.off_ms += latencies["off"]
        ab.block_ratios.append(ratio(percentile(latencies["on"], 50), percentile(latencies["off"], 50)))


def _raise(exc: Exception) -> None:
    raise BenchError(f"warm invoke failed in the isolation comparison: {exc}") from exc


# -- report ----------------------------------------------------------------------------------


def _met(value: float, target: float) -> str:
    return "met" if value <= target else "not met"


def _less(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{abs(1 - value) * 100:.0f}% {'less' if value <= 1 else 'more'}"


def report(
    subjects: dict[str, Subject],
    regs: Registrations,
    bare_regs: Registrations,
    ab: AB,
    rounds: int,
    client_loop: str,
    elapsed: float,
) -> None:
    header = [
        *lib.LATENCY_HEADER,
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
                *s.latency_cells(),
                fmt(server_cpu_us(s), 0),
                fmt(s.switches_per_call("server"), 1),
                fmt(function_cpu_us(s), 0),
                fmt(s.client_cpu_us, 0),
                s.errors_cell(),
            ]
        )
    print(
        f"\nruntime_server bench: loopback, {os.cpu_count()} CPUs, grpcio {grpc.__version__}, "
        f"client loop {client_loop}, payload {len(PAYLOAD)} B; {PLAN.describe(rounds)}"
    )
    print("\n".join(lib.table(rows)))
    print(
        "(server CPU and ctx sw: the server process, all threads, in the 32-way phase; "
        "fn procs: CPU of the function processes)"
    )

    inv, aio, sync, uv = subjects["invoke"], subjects["aio"], subjects["sync"], subjects["aio-uvloop"]
    # latency: invoke / echo; rps: echo / invoke
    vs_echo, echo_vs = lib.ratios(inv, aio), lib.ratios(aio, inv)
    r_p50, r_p99, r_rps = vs_echo.p50, vs_echo.p99, echo_vs.rps
    p50s, p99s, rpss = span(vs_echo.round_p50), span(vs_echo.round_p99), span(echo_vs.round_rps)

    def met(value: float) -> str:
        return "met" if value <= TARGET else "not met"

    print(f"\nagainst the grpc.aio echo (target ≤ {TARGET}×)                  per round")
    print(f"  invoke p50 / aio-echo p50    {fmt(r_p50, 2)}×  {p50s:>11}   target: {met(r_p50)}")
    print(f"  invoke p99 / aio-echo p99    {fmt(r_p99, 2)}×  {p99s:>11}   target: {met(r_p99)}")
    print(f"  aio-echo rps / invoke rps    {fmt(r_rps, 2)}×  {rpss:>11}   target: {met(r_rps)}")
    print(f"  invoke throughput = {fmt(ratio(inv.rps, aio.rps), 2)} of the aio echo's")
    print("against the uvloop echo (the runtime host serves grpc.aio on uvloop; this isolates its own work):")
    print(
        f"  invoke p50 / uvloop-echo p50 {fmt(ratio(inv.seq(50), uv.seq(50)), 2)}×, "
        f"uvloop-echo rps / invoke rps {fmt(ratio(uv.rps, inv.rps), 2)}×, host CPU per call above the "
        f"uvloop echo {fmt(server_cpu_us(inv) - server_cpu_us(uv), 0)} µs "
        f"(+{fmt(function_cpu_us(inv), 0)} µs in the function process)"
    )
    cpu_sync = ratio(server_cpu_us(sync), server_cpu_us(aio))
    cpu_uv = ratio(server_cpu_us(uv), server_cpu_us(aio))
    print("server choice, server CPU per call in the 32-way phase:")
    print(
        f"  sync-echo / aio-echo     {fmt(cpu_sync, 2)}×  ({fmt(server_cpu_us(sync), 0)} vs "
        f"{fmt(server_cpu_us(aio), 0)} µs, {_less(cpu_sync)})"
    )
    print(
        f"  uvloop-echo / aio-echo   {fmt(cpu_uv, 2)}×  ({fmt(server_cpu_us(uv), 0)} vs "
        f"{fmt(server_cpu_us(aio), 0)} µs, {_less(cpu_uv)})"
    )
    echoes = [s for s in (sync, aio, uv) if not math.isnan(server_cpu_us(s))]
    leaner = min(echoes, key=lambda s: server_cpu_us(s)) if echoes else None
    print(f"  leaner server: {leaner.name if leaner else '-'} (the runtime host uses grpc.aio on uvloop)")

    mem = regs.memory
    print(
        f"\nregistration, RegisterFunction → first InvokeFunction answered ({len(regs.total_ms)} functions):"
    )
    print(
        f"  p50 {fmt(percentile(regs.total_ms, 50), 2)} ms, p99 {fmt(percentile(regs.total_ms, 99), 2)} ms, "
        f"max {fmt(max(regs.total_ms, default=math.nan), 2)} ms; {fmt(regs.per_second, 1)} registrations/s"
    )
    print(
        f"  RegisterFunction alone p50 {fmt(percentile(regs.register_ms, 50), 2)} / "
        f"p99 {fmt(percentile(regs.register_ms, 99), 2)} ms; first invoke p50 "
        f"{fmt(percentile(regs.first_invoke_ms, 50), 2)} / "
        f"p99 {fmt(percentile(regs.first_invoke_ms, 99), 2)} ms"
    )
    if regs.total_ms:
        slowest = sorted(range(len(regs.total_ms)), key=lambda i: -regs.total_ms[i])[:3]
        print(
            f"  the first one (right after the host said ready) {fmt(regs.total_ms[0], 1)} ms; "
            f"without it p50 {fmt(percentile(regs.total_ms[1:], 50), 2)} / "
            f"p99 {fmt(percentile(regs.total_ms[1:], 99), 2)} ms; slowest: "
            + ", ".join(f"#{i + 1} {regs.total_ms[i]:.1f} ms" for i in slowest)
        )
    if not mem or "error" in mem:
        print(f"memory: not measured ({mem.get('error', 'fewer functions registered')})")
    else:
        print(f"memory with {MEMORY_AT} functions registered ({mem['functions']} function processes found):")
        print(
            f"  per function: PSS {mem['per_function_pss_mib']} MiB; "
            f"per process: PSS {mem['avg_pss_mib']} MiB, RSS {mem['avg_rss_mib']} MiB"
        )
        print(
            f"  all functions PSS {mem['total_pss_mib']} MiB; zygote PSS {mem['zygote_pss_mib']} / "
            f"RSS {mem['zygote_rss_mib']} MiB; host PSS {mem['host_pss_mib']} / RSS {mem['host_rss_mib']} MiB"
        )
    bare = subjects["invoke-bare"]
    reg_pooled = ratio(percentile(regs.total_ms[1:], 50), percentile(bare_regs.total_ms[1:], 50))
    reg_rounds = registration_rounds(regs, bare_regs)
    reg_cost = percentile(reg_rounds, 50)
    invoke_cost = ab.median
    bare_mem = bare_regs.memory
    bare_register = fmt(percentile(bare_regs.register_ms, 50), 2)
    bare_first = fmt(percentile(bare_regs.first_invoke_ms, 50), 2)
    print(f"\nwithout isolation: RegisterFunction alone p50 {bare_register} ms, first invoke {bare_first} ms")
    print("\nwhat isolation costs (the same host with and without it, in this run; the ratio is the median")
    print("of the per-round ratios, min–max over rounds and the pooled p50 ratio next to it):")
    print(
        f"  registration p50 {fmt(percentile(regs.total_ms[1:], 50), 2)} ms vs "
        f"{fmt(percentile(bare_regs.total_ms[1:], 50), 2)} ms: {fmt(reg_cost, 3)}× "
        f"({len(reg_rounds)} rounds of {REGISTRATION_ROUND} pairs: {span(reg_rounds)}; "
        f"pooled {fmt(reg_pooled, 3)}×) "
        f"target ≤ {ISOLATION_REGISTER_TARGET}×: {_met(reg_cost, ISOLATION_REGISTER_TARGET)}"
    )
    print(
        f"  warm invoke p50 {fmt(percentile(ab.on_ms, 50), 3)} ms vs {fmt(percentile(ab.off_ms, 50), 3)} ms: "
        f"{fmt(invoke_cost, 3)}× ({len(ab.block_ratios)} blocks of {AB_BLOCK_CALLS} calls: "
        f"{span(ab.block_ratios)}; pooled {fmt(ab.pooled, 3)}×; in the rounds above "
        f"{fmt(ratio(inv.seq(50), bare.seq(50)), 3)}×) "
        f"target ≤ {ISOLATION_INVOKE_TARGET}×: {_met(invoke_cost, ISOLATION_INVOKE_TARGET)}"
    )
    if mem and bare_mem and "error" not in mem and "error" not in bare_mem:
        print(
            f"  memory per function PSS {mem['per_function_pss_mib']} "
            f"vs {bare_mem['per_function_pss_mib']} MiB "
            "(isolated: its function process and the init of its namespace)"
        )
    print(f"\nbench took {elapsed:.1f} s")

    out = {
        "bench": "runtime_server",
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "client_loop": client_loop,
        "rounds": rounds,
        "invoke": summary(inv),
        "echo_aio": summary(aio),
        "echo_aio_uvloop": summary(uv),
        "echo_sync": summary(sync),
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
        "isolation": {
            "registration_ratio": round(reg_cost, 3),
            "registration_round_ratios": [round(x, 3) for x in reg_rounds],
            "registration_pooled_ratio": round(reg_pooled, 3),
            "warm_invoke_ratio": round(invoke_cost, 3),
            "warm_invoke_block_ratios": [round(x, 3) for x in ab.block_ratios],
            "warm_invoke_pooled_ratio": round(ab.pooled, 3),
            "warm_invoke_in_rounds_ratio": round(ratio(inv.seq(50), bare.seq(50)), 3),
            "targets": {"registration": ISOLATION_REGISTER_TARGET, "warm_invoke": ISOLATION_INVOKE_TARGET},
        },
        "seconds": round(elapsed, 1),
    }
    lib.print_json_line(out)


# -- main ------------------------------------------------------------------------------------


def pki_host(host_id: str) -> Identity:
    return Identity.host(runtime="python", host_id=host_id)


async def run(client_loop: str) -> None:
    started = time.perf_counter()
    servers: list[lib.Server] = []
    with tempfile.TemporaryDirectory(prefix="krt-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "host-state").mkdir()
        pki = BenchPKI(tmp / "pki")
        host_argv = [
            sys.executable,
            "-m",
            "kruntimes.workers.host",
            "--host-id",
            "bench-0",
            "--runtime",
            "python",
        ]
        host_argv += [
            "--state-dir",
            str(tmp / "host-state"),
            "--log-level",
            "warning",
            *pki.host_args("bench-0"),
        ]
        (tmp / "bare-state").mkdir()
        bare_argv = [sys.executable, str(BARE_HOST), "--host-id", "bench-1", "--runtime", "python"]
        bare_argv += [
            "--state-dir",
            str(tmp / "bare-state"),
            "--log-level",
            "warning",
            *pki.host_args("bench-1"),
        ]
        echo_tls = ["--peer-tls", str(pki.directory(pki_host("bench-echo")))]
        try:
            async with contextlib.AsyncExitStack() as stack:
                lib.note("starting the servers ...")
                starts = [
                    lib.start_server("runtime-host", host_argv, tmp, servers),
                    lib.start_server("runtime-host-bare", bare_argv, tmp, servers),
                ]
                starts += [
                    lib.start_server(
                        f"echo-{k}", [sys.executable, str(ECHO_SCRIPT), "--kind", k, *echo_tls], tmp, servers
                    )
                    for k in ECHO_KINDS
                ]
                host, bare, *echo_servers = await asyncio.gather(*starts)

                channels = {}
                for server in (host, bare, *echo_servers):
                    channel = await stack.enter_async_context(pki.aio_channel(server.address, as_=GATEWAY))
                    await asyncio.wait_for(channel.channel_ready(), lib.START_TIMEOUT_S)  # connect untimed
                    channels[server.name] = channel
                control = await stack.enter_async_context(pki.aio_channel(host.address, as_=CONTROL_PLANE))
                bare_control = await stack.enter_async_context(
                    pki.aio_channel(bare.address, as_=CONTROL_PLANE)
                )

                lib.note(f"registering {REGISTRATIONS} functions on each host ...")
                regs, bare_regs = await register_functions(
                    [
                        Target(control, channels[host.name], host, "bench-0"),
                        Target(bare_control, channels[bare.name], bare, "bench-1"),
                    ],
                    pki,
                )
                if min(len(regs.ids), len(bare_regs.ids)) < PLAN.callers:
                    raise BenchError(f"only {len(regs.ids)} functions registered; need {PLAN.callers}")

                subjects: dict[str, Subject] = {}
                for kind, server in zip(ECHO_KINDS, echo_servers, strict=True):
                    echo = channels[server.name].unary_unary(ECHO_METHOD)  # bytes in, bytes out

                    async def echo_call(_: int, echo: grpc.aio.UnaryUnaryMultiCallable = echo) -> None:
                        if await echo(PAYLOAD, timeout=CALL_TIMEOUT_S) != PAYLOAD:
                            raise BenchError("the echo answered something else")

                    subjects[kind] = Subject(kind, f"grpc echo ({kind})", echo_call, {"server": [server.pid]})

                invoke = channels[host.name].unary_unary(lib.INVOKE_METHOD)  # bytes, like the echo
                requests = [invoke_request(rid) for rid in regs.ids[: PLAN.callers]]

                async def invoke_call(i: int) -> None:
                    check_invoke(await invoke(requests[i], timeout=CALL_TIMEOUT_S))

                procs = {
                    "server": [host.pid],
                    "functions": lib.function_pids(host.pid),
                }  # idle ones add nothing
                subjects["invoke"] = Subject("invoke", "runtime InvokeFunction", invoke_call, procs)
                bare_invoke = channels[bare.name].unary_unary(lib.INVOKE_METHOD)
                bare_requests = [invoke_request(rid) for rid in bare_regs.ids[: PLAN.callers]]

                async def bare_call(i: int) -> None:
                    check_invoke(await bare_invoke(bare_requests[i], timeout=CALL_TIMEOUT_S))

                bare_procs = {"server": [bare.pid], "functions": lib.function_pids(bare.pid)}
                subjects["invoke-bare"] = Subject(
                    "invoke-bare", "InvokeFunction, no isolation", bare_call, bare_procs
                )
                ab = AB()

                async def ab_blocks(_: int) -> None:  # a share of the blocks after each round
                    await isolation_ab(ab, invoke_call, bare_call, blocks=AB_BLOCKS // PLAN.rounds)

                rounds = await PLAN.run(subjects, started, after_round=ab_blocks)
                # the blocks that rounds cut by the time budget did not run: after them
                await isolation_ab(ab, invoke_call, bare_call, blocks=AB_BLOCKS - len(ab.block_ratios))
        finally:
            for server in servers:
                lib.stop_server(server)
        problems = next((s.problems() for s in servers if s.name == "runtime-host"), [])
        if problems:
            lib.note(
                f"the runtime host logged {len(problems)} error lines, e.g.:\n" + "\n".join(problems[:10])
            )
        report(subjects, regs, bare_regs, ab, rounds, client_loop, time.perf_counter() - started)


def main() -> None:
    lib.run_bench(run, deadline_s=BENCH_DEADLINE_S)


if __name__ == "__main__":
    main()
