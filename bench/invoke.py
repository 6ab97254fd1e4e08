"""Benchmark: a warm invoke through the gateway next to a direct gRPC invoke and a raw chain, in one run.

    .venv/bin/python bench/invoke.py                      (the bench, < 2 min)
    .venv/bin/python bench/invoke.py --heartbeats-only    (the heartbeat verification part alone)
    .venv/bin/python bench/invoke.py --profile /tmp/prof  (py-spy the servers under 32-way load)

Paths, every server in its own process on 127.0.0.1 with ports picked at run time:
  gateway   HTTPS POST .../functions/{uid}:invoke to `python -m gateway` (embedded auth, the
            authorization cached after the first call, keep-alive), which calls InvokeFunction on
            the runtime host (`python -m kruntimes.workers.host --gateway ...`), which runs the function
            in its warm function process
  direct    (a) InvokeFunction on the same runtime host over one grpc.aio channel
  chain     (b) the raw chain (bench/_invoke_chain.py): an aiohttp HTTPS server forwarding the
            body over a kept-open grpc.aio channel to a grpc.aio server that writes it to a warm
            child process over a pipe and reads the echo back (bench/_invoke_child.py); asyncio,
            no auth, no validation. This is the reference the targets are set against.
  chain-uv  the same chain with both servers on uvloop (for scale; the gateway runs on uvloop)
  gateway-plain
            a second gateway → host pair whose invoke hop (the raw invoke port) is plaintext
            (bench/_plaintext.py); `gateway` runs it over mutual TLS, as the platform always does.
            Every other hop of both pairs — heartbeats, registering — is mutual TLS (bench/_pki.py),
            and its host gets the direct path too (direct-plain), so both hosts carry the same load.

The client (this process, uvloop when importable) uses one aiohttp ClientSession (keep-alive,
TCPConnector(limit=64), an SSL context trusting the bench CA) for the HTTPS paths and one
grpc.aio channel for the direct one; payload {"n": 1}. 32 functions are registered on the host
(namespace default); caller i always invokes function i, since a function runs one invocation at a
time, and the sequential phase always function 0. The chain has 32 warm children in a pool.

Temporal is on none of these paths: the gateway here runs without it, and on the embedded platform
the front before Temporal (kruntimes/temporal/front.py: mutual TLS, then the dev server's Unix
socket) carries only the control plane's calls, so an invoke's p50 is structurally unaffected by
it; bench/front.py measures what the front adds to a Temporal call.

Per path: 2000 sequential calls (p50/p99) and 32 concurrent callers for ~3 s (calls/s), in
interleaved rounds (each round 1/ROUNDS of every phase of every path, 200 warm-up calls before
each piece) so background load hits all paths alike; server CPU per call from /proc/<pid>/stat
for each server process (gateway, host, function processes; chain: http, grpc, children).

Targets (gateway vs the chain): p50 ≤ 1.2×, p99 ≤ 2 ms (sequential), throughput ≥ 1.0×; mutual TLS
on the invoke hop against plaintext (gateway vs gateway-plain): p50 ≤ 1.1×, throughput ≥ 0.9×.
Prints tables, the ratios with target met / not met and a final JSON line {"bench": "invoke", ...}.

The TLS comparison is judged on A/B blocks, a share of them after each round (so that they spread
over the run: on a loaded machine one server can be slow for seconds at a time): TLS_AB_BLOCKS
blocks, each a sequential piece (TLS_AB_SEQ_CALLS calls) and a 32-way piece (TLS_AB_LOAD_S) of
gateway and of gateway-plain back to back, the first of the two alternating block by block; the
ratios are the medians of the per-block ratios (p50(tls) / p50(plain), rps(tls) / rps(plain)),
printed with their quartiles and min–max, next to the pooled ratios of the rounds. The gateway's
TCP connections to each host are read from /proc before the rounds and after them: the same
connections throughout means every invoke reused them (no handshake per invoke, no reconnect).

Heartbeat verification (in this process, after the rounds, once the servers are stopped): a
RouteCache applying full snapshots of one host with 10,000 registrations, each with its signed
assignment — the first snapshot (every signature checked), unchanged snapshots (target ≤ 100 ms
each), and snapshots with 1% of the assignments new; each snapshot is parsed from its bytes
first, as the gRPC server hands it over.
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
import functools
import gc
import os
import ssl
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _benchlib as lib
import aiohttp
import grpc
from _benchlib import (
    CALL_TIMEOUT_S,
    PAYLOAD,
    BenchError,
    HttpStatusError,
    Subject,
    check_invoke,
    fmt,
    ratio,
    span,
)
from _invoke_profile import Target, profile_processes
from _pki import CONTROL_PLANE, GATEWAY, BenchPKI
from yarl import URL

from kruntimes.gateway.routes import RouteCache
from kruntimes.pki import Identity
from kruntimes.pki.assignments import SignedAssignment, Verifier
from kruntimes.pki.local import ensure_tls
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.workers.gateway import GC_THRESHOLDS as GATEWAY_GC_THRESHOLDS

BENCH = Path(__file__).resolve().parent
CHAIN_SCRIPT = BENCH / "_invoke_chain.py"
PLAIN_SCRIPT = BENCH / "_plaintext.py"
NAMESPACE = "default"
TOKEN = "bench-token-" + uuid.uuid4().hex

SUCCEEDED = b'"status":"Succeeded"'
FUNCTIONS = 32
PLAN = lib.Plan(rounds=5, seq_chunk_max_s=6.0, load_max_calls_per_caller=100_000, rounds_budget_s=80.0)
ROUTE_TIMEOUT_S = 20.0
BENCH_DEADLINE_S = 180.0
# gateway against the chain: p50 ≤ 1.2×, p99 ≤ 2 ms (sequential), throughput ≥ 1.0×
TARGETS = {"p50_ratio_max": 1.2, "p99_ms_max": 2.0, "rps_ratio_min": 1.0}
# the invoke hop over mutual TLS against plaintext: p50 ≤ 1.1×, throughput ≥ 0.9×
TLS_TARGETS = {"p50_ratio_max": 1.1, "rps_ratio_min": 0.9}
TLS_AB_BLOCKS = 20
TLS_AB_SEQ_CALLS = 40
TLS_AB_LOAD_S = 0.15
# heartbeat verification: one host's full snapshot of 10,000 registrations
HEARTBEAT_ROUTES = 10_000
HEARTBEAT_REPEATS = 20
HEARTBEAT_TARGET_MS = 100.0


def summary(s: Subject) -> dict[str, Any]:
    return {
        **s.latency_summary(),
        "server_cpu_us_per_call": round(s.load_cpu_us(), 1),
        "server_cpu_us_per_call_by_process": {k: round(s.load_cpu_us(k), 1) for k in s.procs},
        "context_switches_per_call_by_process": {k: round(s.switches_per_call(k), 2) for k in s.procs},
        "seq_server_cpu_us_per_call": round(s.seq_cpu_us(), 1),
        "seq_server_cpu_us_per_call_by_process": {k: round(s.seq_cpu_us(k), 1) for k in s.procs},
        "client_cpu_us_per_call": round(s.client_cpu_us, 1),
        "round_seq_p50_ms": [round(x, 4) for x in s.round_p50],
        "round_seq_p99_ms": [round(x, 4) for x in s.round_p99],
        "round_rps": [round(x, 1) for x in s.round_rps],
        "errors": dict(s.errors),
    }


# -- set-up ----------------------------------------------------------------------------------


@dataclass
class Function:
    run_uid: str
    registration_id: str
    host_uid: str


async def register_functions(
    channel: grpc.aio.Channel, host: lib.Server, pki: BenchPKI, *, host_id: str
) -> list[Function]:
    """Register the functions as the control plane does (its certificate, signed assignments)."""
    stub = pb_grpc.FunctionRuntimeStub(channel)
    functions = []
    for i in range(FUNCTIONS):
        request = pki.register_request(
            i, host_id=host_id, host_uid=host.ready["hostUid"], namespace=NAMESPACE
        )
        response = await stub.RegisterFunction(request, timeout=CALL_TIMEOUT_S)
        functions.append(Function(request.run.run_uid, response.registration_id, response.host_uid))
    return functions


def write_auth_files(tmp: Path) -> tuple[Path, Path]:
    tokens = tmp / "tokens.csv"
    tokens.write_text(f'{TOKEN},bench,1000,"bench"\n')
    tokens.chmod(0o600)
    bindings = tmp / "role-bindings.yaml"
    bindings.write_text(f"bindings:\n- namespace: {NAMESPACE}\n  users: [bench]\n")
    return tokens, bindings


async def wait_for_routes(call: lib.Call, n: int) -> None:
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
    servers: dict[str, lib.Server]


class Clients:
    """The client side of every path: one aiohttp session and the per-path call functions."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.json_headers = {"Content-Type": "application/json"}
        self.auth_headers = {"Authorization": f"Bearer {TOKEN}", **self.json_headers}

    def gateway(self, base_url: str, functions: list[Function]) -> lib.Call:
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
    def direct(channel: grpc.aio.Channel, functions: list[Function]) -> lib.Call:
        invoke = channel.unary_unary(lib.INVOKE_METHOD)  # bytes in, bytes out: serialized once up front
        requests = [
            pb.InvokeFunctionRequest(
                registration_id=f.registration_id,
                payload=PAYLOAD,
                fence=pb.Fence(run_uid=f.run_uid, attempt=1, host_uid=f.host_uid),
            ).SerializeToString()
            for f in functions
        ]

        async def direct_call(i: int) -> None:
            check_invoke(await invoke(requests[i], timeout=CALL_TIMEOUT_S))

        return direct_call

    def chain(self, url: str) -> lib.Call:
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
    tmp: Path, servers: list[lib.Server], stack: contextlib.AsyncExitStack, args: argparse.Namespace
) -> Setup:
    """Start every server, register the functions, wait for the routes; one Subject per path.

    The base stack is `python -m gateway` → `python -m kruntimes.workers.host`. With --alt-gateway-script
    and/or --alt-host-script an alternative stack (the given scripts, the base for the other) is
    measured too, as paths gateway-alt (and direct-alt when the host is replaced).
    """
    py = sys.executable
    tls = ensure_tls(tmp / "tls")
    pki = BenchPKI(tmp / "pki")
    tokens, bindings = write_auth_files(tmp)
    gateway_args = ["--listen", "127.0.0.1:0", "--heartbeat-listen", "127.0.0.1:0"]
    gateway_args += ["--cert", str(tls.cert), "--key", str(tls.key), "--auth", "embedded"]
    gateway_args += ["--token-file", str(tokens), "--role-bindings", str(bindings), "--log-level", "warning"]
    gateway_args += pki.gateway_args()
    gateways = {"gateway": [py, "-m", "gateway"], "gateway-plain": [py, str(PLAIN_SCRIPT), "gateway"]}
    hosts = {"host": [py, "-m", "kruntimes.workers.host"], "host-plain": [py, str(PLAIN_SCRIPT), "host"]}
    # (path suffix, gateway, host)
    pairs = [("", "gateway", "host"), ("-plain", "gateway-plain", "host-plain")]
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
        return [py, str(CHAIN_SCRIPT), "grpc", "--children", str(PLAN.callers), *(["--uvloop"] if uv else [])]

    lib.note("starting the servers ...")
    first = [lib.start_server(name, [*argv, *gateway_args], tmp, servers) for name, argv in gateways.items()]
    first += [lib.start_server(f"{key}-grpc", grpc_argv(uv), tmp, servers) for key, uv in chains.items()]
    started = await asyncio.gather(*first)
    gw = dict(zip(gateways, started, strict=False))
    chain_grpcs = started[len(gateways) :]

    second = []
    for name, argv in hosts.items():
        (tmp / f"{name}-state").mkdir()
        host_argv = [
            *argv,
            "--host-id",
            f"bench-{name}",
            "--runtime",
            "python",
            *pki.host_args(f"bench-{name}"),
        ]
        host_argv += ["--state-dir", str(tmp / f"{name}-state"), "--heartbeat-interval", "1"]
        for g in sorted({g for _, g, h in pairs if h == name}):
            host_argv += ["--gateway", gw[g].ready["heartbeatAddress"]]
        second.append(lib.start_server(name, [*host_argv, "--log-level", "warning"], tmp, servers))
    for (key, uv), upstream in zip(chains.items(), chain_grpcs, strict=True):
        argv = [py, str(CHAIN_SCRIPT), "http", "--upstream", upstream.ready["address"]]
        argv += ["--cert", str(tls.cert), "--key", str(tls.key), *(["--uvloop"] if uv else [])]
        second.append(lib.start_server(f"{key}-http", argv, tmp, servers))
    started = await asyncio.gather(*second)
    hs = dict(zip(hosts, started, strict=False))
    chain_https = started[len(hosts) :]

    client_ssl = ssl.create_default_context(cafile=str(tls.ca_cert))
    connector = aiohttp.TCPConnector(limit=64, ssl=client_ssl, keepalive_timeout=120)
    clients = Clients(await stack.enter_async_context(aiohttp.ClientSession(connector=connector)))

    registered: dict[str, tuple[grpc.aio.Channel, list[Function], list[int]]] = {}
    for name, host in hs.items():
        control = await stack.enter_async_context(pki.aio_channel(host.ready["address"], as_=CONTROL_PLANE))
        channel = await stack.enter_async_context(pki.aio_channel(host.ready["address"], as_=GATEWAY))
        await asyncio.wait_for(channel.channel_ready(), lib.START_TIMEOUT_S)
        lib.note(f"registering {FUNCTIONS} functions on {name} ...")
        functions = await register_functions(control, host, pki, host_id=f"bench-{name}")
        fns = lib.function_pids(host.pid)
        if len(fns) < FUNCTIONS:
            lib.note(f"warning: {len(fns)} function processes under {name}'s zygote, not {FUNCTIONS}")
        registered[name] = (channel, functions, fns)

    subjects: dict[str, Subject] = {}
    for suffix, g, h in pairs:
        channel, functions, fns = registered[h]
        call = clients.gateway(gw[g].ready["url"], functions)
        lib.note(f"waiting for {g}'s routes to {h} ...")
        await wait_for_routes(call, FUNCTIONS)
        key = "gateway" + suffix
        label = {
            "": "gateway (HTTPS → mTLS invoke port → fn)",
            "-plain": "gateway-plain (HTTPS → plaintext invoke port → fn)",
        }.get(suffix, f"{key}: {g} → {h} (A/B)")
        procs = {"gateway": [gw[g].pid], "host": [hs[h].pid], "functions": fns}
        subjects[key] = Subject(key, label, call, procs)
        if not suffix or h != "host":  # host-plain gets the direct path too: both hosts carry the same load
            key = "direct" + suffix
            label = {
                "": "(a) direct gRPC InvokeFunction",
                "-plain": "direct-plain: direct gRPC InvokeFunction on host-plain",
            }.get(suffix, f"{key}: {h} (A/B)")
            procs = {"host": [hs[h].pid], "functions": fns}
            subjects[key] = Subject(key, label, clients.direct(channel, functions), procs)
    for (key, uv), grpc_server, http_server in zip(chains.items(), chain_grpcs, chain_https, strict=True):
        subjects[key] = Subject(
            key,
            "(b) raw chain" + (" on uvloop" if uv else " (asyncio)"),
            clients.chain(http_server.ready["address"]),
            {"http": [http_server.pid], "grpc": [grpc_server.pid], "child": lib.children(grpc_server.pid)},
        )
    return Setup(subjects, {s.name: s for s in servers})


# -- heartbeat verification ------------------------------------------------------------------


async def heartbeat_bench(pki: BenchPKI) -> dict[str, Any]:
    """Full snapshots of one host with HEARTBEAT_ROUTES registrations through a RouteCache: the
    first (every assignment new), unchanged ones, and ones with 1% of the assignments new (a new
    attempt each time); every snapshot parsed from its bytes first, timed apart."""
    host_id, host_uid = "hb-bench-0", str(uuid.uuid4())
    peer = Identity.host(runtime="python", host_id=host_id)
    uids = [str(uuid.uuid4()) for _ in range(HEARTBEAT_ROUTES)]
    changing = uids[: HEARTBEAT_ROUTES // 100]
    lib.note(f"signing {HEARTBEAT_ROUTES} assignments for the heartbeat part ...")
    signed = {
        (uid, 1): pki.sign(run_uid=uid, host_id=host_id, host_uid=host_uid, name="fn", namespace=NAMESPACE)
        for uid in uids
    }
    for repeat in range(HEARTBEAT_REPEATS):
        for uid in changing:
            assignment = SignedAssignment(
                run_uid=uid,
                attempt=repeat + 2,
                host_id=host_id,
                host_uid=host_uid,
                namespace=NAMESPACE,
                name="fn",
                runtime="python",
            )
            signed[(uid, repeat + 2)] = pki.signer.sign(assignment)

    def snapshot(attempts: dict[str, int]) -> bytes:
        beat = hb.HostHeartbeat(
            host_id=host_id, host_uid=host_uid, runtime="python", address="127.0.0.1:1", interval_ms=5000
        )
        for i, uid in enumerate(uids):
            attempt = attempts.get(uid, 1)
            beat.registrations.append(
                pb.RegistrationState(
                    run_uid=uid,
                    attempt=attempt,
                    namespace=NAMESPACE,
                    name="fn",
                    runtime="python",
                    registration_id=f"reg-{i}",
                    phase=pb.REGISTRATION_PHASE_READY,
                    assignment=signed[(uid, attempt)],
                )
            )
        return beat.SerializeToString()

    routes = RouteCache(verifier=Verifier([pki.signer.public_key]))
    # collected as the gateway process collects (workers/gateway.py): start-up objects frozen
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GATEWAY_GC_THRESHOLDS)

    async def apply(data: bytes) -> tuple[float, float]:
        t0 = time.perf_counter()
        beat = hb.HostHeartbeat.FromString(data)
        t1 = time.perf_counter()
        skipped = await routes.apply(beat, peer=peer)
        t2 = time.perf_counter()
        if skipped or len(routes) != HEARTBEAT_ROUTES:
            raise BenchError(f"heartbeat bench: {skipped} skipped, {len(routes)} routes")
        return (t1 - t0) * 1000, (t2 - t1) * 1000

    base = snapshot({})
    parse_first, first = await apply(base)
    parses, unchanged, changed = [], [], []
    for repeat in range(HEARTBEAT_REPEATS):
        parse, ms_ = await apply(base if repeat % 2 else snapshot({u: repeat + 2 for u in changing}))
        parses.append(parse)
        (unchanged if repeat % 2 else changed).append(ms_)
        if repeat % 2 == 0 and routes.route(changing[0]).attempt != repeat + 2:  # type: ignore[union-attr]
            raise BenchError("heartbeat bench: the new attempt was not routed")
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    out = {
        "routes": HEARTBEAT_ROUTES,
        "first_snapshot_ms": round(first, 1),
        "unchanged_snapshot_ms_p50": round(lib.percentile(unchanged, 50), 1),
        "unchanged_snapshot_ms_max": round(max(unchanged), 1),
        "one_percent_new_snapshot_ms_p50": round(lib.percentile(changed, 50), 1),
        "one_percent_new_snapshot_ms_max": round(max(changed), 1),
        "parse_ms_p50": round(lib.percentile([parse_first, *parses], 50), 1),
        "target_ms": HEARTBEAT_TARGET_MS,
        "target_met": max(unchanged) <= HEARTBEAT_TARGET_MS and max(changed) <= HEARTBEAT_TARGET_MS,
    }
    print(
        f"\nheartbeat verification, one host's full snapshot of {HEARTBEAT_ROUTES} routes (apply; parse "
        f"p50 {out['parse_ms_p50']} ms apart): first (all {HEARTBEAT_ROUTES} signatures checked) "
        f"{out['first_snapshot_ms']} ms; unchanged p50 {out['unchanged_snapshot_ms_p50']} ms, max "
        f"{out['unchanged_snapshot_ms_max']} ms; 1% new assignments p50 "
        f"{out['one_percent_new_snapshot_ms_p50']} ms, max {out['one_percent_new_snapshot_ms_max']} ms; "
        f"target ≤ {HEARTBEAT_TARGET_MS:g} ms per snapshot: {_met(out['target_met'])}"
    )
    return out


# -- report ----------------------------------------------------------------------------------


def _by_process(s: Subject) -> str:
    return " + ".join(f"{k} {fmt(s.load_cpu_us(k), 0)}" for k in s.procs)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _tcp(pid: int) -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, inode) of the IPv4 TCP sockets process `pid` holds."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    found = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            parts = line.split()
            inode = int(parts[9])
            if inode in inodes:
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in parts[1:3])
                found.append((local, remote, parts[3], inode))
    return found


def connections_to(client_pid: int, server_pid: int) -> set[int]:
    """The established TCP connections (socket inodes) of `client_pid` to ports `server_pid` listens on."""
    listening = {local for local, _, state, _ in _tcp(server_pid) if state == "0A"}
    return {inode for _, remote, state, inode in _tcp(client_pid) if state == "01" and remote in listening}


@dataclass
class TlsAB:
    """gateway (mutual TLS hop) against gateway-plain in alternating blocks."""

    tls: Subject
    plain: Subject
    seq_ratios: list[float] = field(default_factory=list)
    rps_ratios: list[float] = field(default_factory=list)
    seq_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    async def blocks(self, n: int) -> None:
        """`n` more blocks: a sequential piece of each, then a 32-way piece of each, the first of
        the two alternating block by block."""
        tls, plain = self.tls, self.plain
        for _ in range(n):
            order = (tls, plain) if len(self.seq_ratios) % 2 == 0 else (plain, tls)
            p50: dict[str, float] = {}
            rps: dict[str, float] = {}
            for s in order:
                latencies = await lib.timed_sequential(
                    s.call, calls=TLS_AB_SEQ_CALLS, max_seconds=PLAN.seq_chunk_max_s, on_error=s.record_error
                )
                self.seq_ms[s.name] += latencies
                p50[s.name] = lib.percentile(latencies, 50)
            for s in order:
                latencies, elapsed = await lib.timed_concurrent(
                    s.call,
                    callers=PLAN.callers,
                    seconds=TLS_AB_LOAD_S,
                    max_calls_per_caller=PLAN.load_max_calls_per_caller,
                    on_error=s.record_error,
                )
                self.calls[s.name] += len(latencies)
                self.seconds[s.name] += elapsed
                rps[s.name] = len(latencies) / elapsed if elapsed else float("nan")
            self.seq_ratios.append(ratio(p50[tls.name], p50[plain.name]))
            self.rps_ratios.append(ratio(rps[tls.name], rps[plain.name]))

    def p50_ms(self, s: Subject) -> float:
        return lib.percentile(self.seq_ms[s.name], 50)

    def rps(self, s: Subject) -> float:
        return self.calls[s.name] / self.seconds[s.name] if self.seconds[s.name] else float("nan")


def _quartiles(values: list[float]) -> str:
    return (
        f"median {fmt(lib.percentile(values, 50), 3)}×, quartiles {fmt(lib.percentile(values, 25), 2)}–"
        f"{fmt(lib.percentile(values, 75), 2)}, min–max {span(values)}"
    )


def tls_report(
    subjects: dict[str, Subject], ab: TlsAB | None, connections: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The invoke hop over mutual TLS (gateway) against plaintext (gateway-plain)."""
    tls, plain = subjects["gateway"], subjects["gateway-plain"]
    vs = lib.ratios(tls, plain)
    print("\nmutual TLS on the gateway → host invoke hop against plaintext (gateway vs gateway-plain)")
    if ab is not None:
        p50_ratio, rps_ratio = lib.percentile(ab.seq_ratios, 50), lib.percentile(ab.rps_ratios, 50)
        print(
            f"  A/B, {len(ab.seq_ratios)} alternating blocks ({TLS_AB_SEQ_CALLS} sequential calls and "
            f"{PLAN.callers} callers x {TLS_AB_LOAD_S:g} s of each per block):"
        )
        print(
            f"    p50 {fmt(ab.p50_ms(tls), 3)} vs {fmt(ab.p50_ms(plain), 3)} ms; "
            f"per block {_quartiles(ab.seq_ratios)}"
            f"   target ≤ {TLS_TARGETS['p50_ratio_max']}×: {_met(p50_ratio <= TLS_TARGETS['p50_ratio_max'])}"
        )
        print(
            f"    rps {fmt(ab.rps(tls), 0)} vs {fmt(ab.rps(plain), 0)}; per block {_quartiles(ab.rps_ratios)}"
            f"   target ≥ {TLS_TARGETS['rps_ratio_min']}×: {_met(rps_ratio >= TLS_TARGETS['rps_ratio_min'])}"
        )
    else:  # no A/B phase (it did not run): the rounds' pooled ratios
        p50_ratio, rps_ratio = vs.p50, vs.rps
    met = {"p50": p50_ratio <= TLS_TARGETS["p50_ratio_max"], "rps": rps_ratio >= TLS_TARGETS["rps_ratio_min"]}
    print("  in the rounds (pooled, and per round):")
    print(
        f"    p50 {fmt(tls.seq(50), 3)} vs {fmt(plain.seq(50), 3)} ms: {fmt(vs.p50, 2)}×   per round "
        f"{span(vs.round_p50, median=True)}"
    )
    print(
        f"    rps {fmt(tls.rps, 0)} vs {fmt(plain.rps, 0)}: {fmt(vs.rps, 2)}×   per round "
        f"{span(vs.round_rps, median=True)}"
    )
    for key, conn in connections.items():
        reuse = "the same ones" if conn["same"] else "NOT the same ones (reconnected)"
        print(
            f"  {key} → its host: {conn['before']} TCP connection(s) before the rounds, "
            f"{conn['after']} after them, {reuse}"
        )
    cpu_ratio = ratio(tls.load_cpu_us(), plain.load_cpu_us())
    cpu_rps = ratio(plain.load_cpu_us() + plain.client_cpu_us, tls.load_cpu_us() + tls.client_cpu_us)
    print(
        f"  server CPU per call {fmt(tls.load_cpu_us(), 0)} vs {fmt(plain.load_cpu_us(), 0)} µs = "
        f"{fmt(cpu_ratio, 3)}× ({_by_process(tls)} vs {_by_process(plain)}); CPU-bound estimate of "
        f"rps(tls) / rps(plain): {fmt(cpu_rps, 2)}× (steadier than latency on a loaded machine)"
    )
    control: dict[str, float] = {}
    if "direct" in subjects and "direct-plain" in subjects:  # the same code on either host
        same = lib.ratios(subjects["direct"], subjects["direct-plain"])
        control = {"p50_ratio": round(same.p50, 3), "rps_ratio": round(same.rps, 3)}
        print(
            f"  control, identical paths on the two hosts (direct vs direct-plain): p50 {fmt(same.p50, 2)}×, "
            f"rps {fmt(same.rps, 2)}× — how far apart this machine puts the same work"
        )
    return {
        "control": control,
        "p50_ratio": round(p50_ratio, 3),
        "rps_ratio": round(rps_ratio, 3),
        "ab": {
            "blocks": len(ab.seq_ratios),
            "block_p50_ratio": [round(x, 3) for x in ab.seq_ratios],
            "block_rps_ratio": [round(x, 3) for x in ab.rps_ratios],
            "tls_p50_ms": round(ab.p50_ms(tls), 4),
            "plain_p50_ms": round(ab.p50_ms(plain), 4),
            "tls_rps": round(ab.rps(tls), 1),
            "plain_rps": round(ab.rps(plain), 1),
        }
        if ab is not None
        else None,
        "server_cpu_ratio": round(cpu_ratio, 3),
        "cpu_estimate_rps_ratio": round(cpu_rps, 3),
        "rounds_p50_ratio": round(vs.p50, 3),
        "rounds_rps_ratio": round(vs.rps, 3),
        "connections": connections,
        "p99_ratio": round(vs.p99, 3),
        "round_p50_ratio": [round(x, 3) for x in vs.round_p50],
        "round_rps_ratio": [round(x, 3) for x in vs.round_rps],
        "targets": TLS_TARGETS,
        "target_met": met,
    }


def report(
    subjects: dict[str, Subject],
    rounds: int,
    client_loop: str,
    elapsed: float,
    heartbeats: dict[str, Any] | None,
    ab: TlsAB | None,
    connections: dict[str, dict[str, Any]],
) -> None:
    header = [*lib.LATENCY_HEADER, "server CPU µs/call", "client CPU µs/call", "errors"]
    rows = [header]
    for s in subjects.values():
        rows.append([*s.latency_cells(), fmt(s.load_cpu_us(), 0), fmt(s.client_cpu_us, 0), s.errors_cell()])
    print(
        f"\ninvoke bench: loopback, {os.cpu_count()} CPUs, client loop {client_loop}, payload "
        f"{len(PAYLOAD)} B; {PLAN.describe(rounds)}"
    )
    print("\n".join(lib.table(rows)))
    cpu_rows = [["path", "process", "µs/call 32-way", "µs/call sequential", "ctx sw/call 32-way"]]
    for s in subjects.values():
        for label, pids in s.procs.items():
            name = f"{label} ({len(pids)})" if len(pids) > 1 else f"{label} (pid {pids[0] if pids else '-'})"
            row = [s.key, name, fmt(s.load_cpu_us(label), 0), fmt(s.seq_cpu_us(label), 0)]
            cpu_rows.append([*row, fmt(s.switches_per_call(label), 1)])
    print("\nserver CPU per call by process (utime+stime from /proc; processes of a kind summed):")
    print("\n".join(lib.table(cpu_rows)))
    for s in subjects.values():
        if s.first_error:
            print(f"first error on {s.key}: {s.first_error}")

    gw, chain, direct = subjects["gateway"], subjects["chain"], subjects["direct"]
    vs = lib.ratios(gw, chain)
    met = {
        "p50": vs.p50 <= TARGETS["p50_ratio_max"],
        "p99": gw.seq(99) <= TARGETS["p99_ms_max"],
        "rps": vs.rps >= TARGETS["rps_ratio_min"],
    }
    print("\ngateway against the raw chain (b); per round: min–max (median)")
    print(
        f"  gateway p50 / chain p50   {fmt(vs.p50, 2)}×   per round {span(vs.round_p50, median=True)}   "
        f"target ≤ {TARGETS['p50_ratio_max']}×: {_met(met['p50'])}"
    )
    print(
        f"  gateway p99               {fmt(gw.seq(99), 2)} ms (chain {fmt(chain.seq(99), 2)} ms; ratio "
        f"{fmt(vs.p99, 2)}×, per round {span(vs.round_p99, median=True)})   "
        f"target ≤ {TARGETS['p99_ms_max']} ms: {_met(met['p99'])}"
    )
    print(
        f"  gateway rps / chain rps   {fmt(vs.rps, 2)}×   per round {span(vs.round_rps, median=True)}   "
        f"target ≥ {TARGETS['rps_ratio_min']}×: {_met(met['rps'])}"
    )
    print(
        f"  server CPU per call: gateway path {fmt(gw.load_cpu_us(), 0)} µs ({_by_process(gw)}) "
        f"vs chain {fmt(chain.load_cpu_us(), 0)} µs ({_by_process(chain)})"
    )
    cpu_rps = ratio(chain.load_cpu_us() + chain.client_cpu_us, gw.load_cpu_us() + gw.client_cpu_us)
    print(
        f"  CPU-bound estimate of gateway rps / chain rps (server + client CPU per call; the machine is "
        f"saturated in the 32-way phase, so this is steadier than the measured rps): {fmt(cpu_rps, 2)}×"
    )
    print("(a) direct gRPC against the chain and the gateway:")
    print(
        f"  direct p50 / chain p50 {fmt(ratio(direct.seq(50), chain.seq(50)), 2)}×, direct rps / chain rps "
        f"{fmt(ratio(direct.rps, chain.rps), 2)}×; the gateway adds {fmt(gw.seq(50) - direct.seq(50), 3)} ms "
        f"at p50 and {fmt(gw.load_cpu_us('gateway'), 0)} µs of gateway CPU per call (host CPU per call "
        f"{fmt(gw.load_cpu_us('host'), 0)} via the gateway vs {fmt(direct.load_cpu_us('host'), 0)} direct)"
    )
    uv = subjects.get("chain-uv")
    if uv is not None:
        print(
            f"chain on uvloop: p50 {fmt(uv.seq(50), 3)} ms ({fmt(ratio(uv.seq(50), chain.seq(50)), 2)}× the "
            f"asyncio chain), rps {fmt(uv.rps, 0)} ({fmt(ratio(uv.rps, chain.rps), 2)}×), server CPU "
            f"{fmt(uv.load_cpu_us(), 0)} µs/call; gateway rps / uvloop chain rps "
            f"{fmt(ratio(gw.rps, uv.rps), 2)}×"
        )
    tls_out = tls_report(subjects, ab, connections)
    ab = ab_report(subjects)
    print(f"\nbench took {elapsed:.1f} s")

    out = {
        "bench": "invoke",
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "aiohttp": aiohttp.__version__,
        "client_loop": client_loop,
        "rounds": rounds,
        "paths": {k: summary(s) for k, s in subjects.items()},
        "ratio_gateway_p50_vs_chain": round(vs.p50, 3),
        "ratio_gateway_p99_vs_chain": round(vs.p99, 3),
        "ratio_gateway_rps_vs_chain": round(vs.rps, 3),
        "round_ratio_gateway_p50_vs_chain": [round(x, 3) for x in vs.round_p50],
        "round_ratio_gateway_rps_vs_chain": [round(x, 3) for x in vs.round_rps],
        "tls": tls_out,
        "heartbeats": heartbeats,
        "ratio_direct_p50_vs_chain": round(ratio(direct.seq(50), chain.seq(50)), 3),
        "ratio_direct_rps_vs_chain": round(ratio(direct.rps, chain.rps), 3),
        "ratio_gateway_rps_vs_chain_uvloop": round(ratio(gw.rps, uv.rps), 3) if uv else None,
        "targets": TARGETS,
        "target_met": met,
        "cpu_estimate_gateway_rps_vs_chain": round(cpu_rps, 3),
        "ab": ab,
        "seconds": round(elapsed, 1),
    }
    lib.print_json_line(out)


def ab_report(subjects: dict[str, Subject]) -> dict[str, Any]:
    """The --alt-* variants against the path they replace, measured in the same rounds."""
    out: dict[str, Any] = {}
    for key, alt in subjects.items():
        base_key = key.removesuffix("-alt") if key.endswith("-alt") else None
        base = subjects.get(base_key) if base_key else None
        if base is None:
            continue
        vs = lib.ratios(alt, base)
        cpu = {k: alt.load_cpu_us(k) - base.load_cpu_us(k) for k in alt.procs if k in base.procs}
        print(
            f"A/B {key} vs {base_key}: p50 {fmt(alt.seq(50), 3)} vs {fmt(base.seq(50), 3)} ms "
            f"({fmt(vs.p50, 2)}×, per round {span(vs.round_p50, median=True)}), rps "
            f"{fmt(alt.rps, 0)} vs {fmt(base.rps, 0)} ({fmt(vs.rps, 2)}×, per round "
            f"{span(vs.round_rps, median=True)}), server CPU µs/call {fmt(alt.load_cpu_us(), 0)} vs "
            f"{fmt(base.load_cpu_us(), 0)} (" + ", ".join(f"{k} {v:+.0f}" for k, v in cpu.items()) + ")"
        )
        out[key] = {
            "vs": base_key,
            "p50_ratio": round(vs.p50, 3),
            "rps_ratio": round(vs.rps, 3),
            "cpu_us_per_call_delta": {k: round(v, 1) for k, v in cpu.items()},
        }
    return out


# -- main ------------------------------------------------------------------------------------


def _log_problems(servers: list[lib.Server]) -> None:
    for server in servers:
        problems = server.problems()
        if problems:
            lib.note(f"{server.name} logged {len(problems)} error lines, e.g.:\n" + "\n".join(problems[:5]))


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
        lib.note(f"profiling {key}: {', '.join(f'{t.label} pid {t.pid}' for t in targets)} ...")
        await PLAN.warm_up(subject, concurrent=True)
        cpu0 = subject.cpu()
        calls_box: list[int] = []

        async def drive(subject: Subject = subject, box: list[int] = calls_box) -> None:
            calls, _ = await PLAN.load(subject, args.profile_seconds)
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
    servers: list[lib.Server] = []
    subjects: dict[str, Subject] = {}
    rounds = 0
    heartbeats: dict[str, Any] | None = None
    ab: TlsAB | None = None
    connections: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="krt-bench-invoke-") as tmp_name:
        if args.heartbeats_only:
            heartbeats = await heartbeat_bench(BenchPKI(Path(tmp_name) / "heartbeat-pki"))
            lib.print_json_line({"bench": "invoke-heartbeats", "heartbeats": heartbeats})
            return
        try:
            async with contextlib.AsyncExitStack() as stack:
                setup = await set_up(Path(tmp_name), servers, stack, args)
                subjects = setup.subjects
                if args.profile:
                    await run_profiles(setup, args)
                else:
                    pairs = {"gateway": ("gateway", "host"), "gateway-plain": ("gateway-plain", "host-plain")}
                    pids = {k: (setup.servers[g].pid, setup.servers[h].pid) for k, (g, h) in pairs.items()}
                    before = {k: connections_to(*p) for k, p in pids.items()}
                    ab = TlsAB(subjects["gateway"], subjects["gateway-plain"])

                    async def ab_blocks(_: int, ab: TlsAB = ab) -> None:  # a share after each round
                        await ab.blocks(TLS_AB_BLOCKS // PLAN.rounds)

                    rounds = await PLAN.run(subjects, started, after_round=ab_blocks)
                    await ab.blocks(TLS_AB_BLOCKS - len(ab.seq_ratios))  # those of rounds cut by the budget
                    after = {k: connections_to(*p) for k, p in pids.items()}
                    connections = {
                        k: {"before": len(before[k]), "after": len(after[k]), "same": before[k] == after[k]}
                        for k in pairs
                    }
        finally:
            for server in servers:
                lib.stop_server(server)
            _log_problems(servers)
        if not args.profile:  # in this process, once the servers are gone
            heartbeats = await heartbeat_bench(BenchPKI(Path(tmp_name) / "heartbeat-pki"))
    if not args.profile:
        report(subjects, rounds, client_loop, time.perf_counter() - started, heartbeats, ab, connections)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-uvloop-chain", action="store_true", help="skip the chain-on-uvloop path")
    p.add_argument(
        "--heartbeats-only", action="store_true", help="only the heartbeat verification part (a few seconds)"
    )
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
    extra = len(args.profile_paths.split(",")) * (args.profile_seconds + 20) if args.profile else 0
    lib.run_bench(functools.partial(run, args), deadline_s=BENCH_DEADLINE_S + extra)


if __name__ == "__main__":
    main()
