"""Benchmark: what starting a function costs the machine, sandboxed next to unsandboxed, in one run.

    .venv/bin/python bench/function_start.py [--hosts 5] [--per-host 60] [--rounds 3]

Starts HOSTS runtime hosts of each kind, all on 127.0.0.1 with ports picked at run time, python
runtime: `sandboxed` (`python -m kruntimes.workers.host` with its defaults: as root, each function
its own uid, PID, mount and IPC namespaces, cgroup, syscall filter, Landlock, and `network:
outbound`'s packet rules, which need nothing per function), `host` (the same with `--network
host`: each function's uid added to the rules' open set when its identity is made and taken out
when it is released, one nft run each), `allowlist` (outbound with ALLOW_ENTRIES `--egress-allow`
entries: as many elements added and taken out per function, one nft run each) and `unsandboxed`
(bench/_host_unsandboxed.py). Each round registers PER_HOST Python echo functions on every host
of one kind at once (all of them in flight, as bench/lifecycle.py's burst hands a host its Runs),
then the same on each other kind; the order of the kinds rotates between rounds, so background
load on a shared machine hits them alike. Every registration is the control plane's: a signed
assignment over mutual TLS, answered once the function's process has imported its handler. Then,
still registered, INVOKES warm invocations one after another (as the gateway, round-robin over
the kind's functions): their latency, p50, which no packet rule is on the path of.

Measured for each batch: the whole machine's busy CPU (/proc/stat, every CPU, user and kernel)
from the first registration sent until the last answered, per function. That counts the host,
its zygote, the function's processes (each in a session of its own, so no per-process figure of
the host's has them) and the kernel's work for them, and this bench's client (the same for both
kinds). Between rounds every function is unregistered and the bench waits until its processes
are gone (not timed). After the first sandboxed batch: the memory a Ready function holds on its
host (PSS from /proc/PID/smaps_rollup, its namespace's init and its function process).

Prints the CPU per start of each kind (median over rounds, each round's too), the ratios (what
isolation costs a start; outbound against `network: host`; an allow list against none), the warm
invoke p50 of each kind, the PSS, this machine's price of a fresh page and of a copy-on-write
copy, and a final JSON line. docs/pool.md ("What bounds a burst of creates") and
docs/security.md ("The network of a function") read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _benchlib as lib
from _benchlib import CALL_TIMEOUT_S, PAGE_PROBE_PAGES, BenchError, machine_busy_seconds, page_costs_us
from _pki import CONTROL_PLANE, GATEWAY, BenchPKI

from kruntimes.config.egress import parse_allow_list
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.sandbox import egress
from kruntimes.runtime.server import HostOptions

KINDS = ("sandboxed", "host", "allowlist", "unsandboxed")
SANDBOXED = ("sandboxed", "host", "allowlist")
ALLOW_ENTRIES = 16  # TEST-NET addresses: nothing of this bench connects to them
KIND_FLAGS = {
    "host": ["--network", "host"],
    "allowlist": [
        *(f"--egress-allow=198.51.100.{i}/32:443" for i in range(1, ALLOW_ENTRIES // 2 + 1)),
        *(f"--egress-allow=[2001:db8::{i:x}/128]:443" for i in range(1, ALLOW_ENTRIES // 2 + 1)),
    ],
}
BARE_HOST = Path(__file__).resolve().with_name("_host_unsandboxed.py")
GONE_TIMEOUT_S = 60.0
RULE_CHANGES = 50
BENCH_DEADLINE_S = 900.0


@dataclass
class Host:
    kind: str
    host_id: str
    server: lib.Server
    stub: pb_grpc.FunctionRuntimeStub | None = None
    gateway: pb_grpc.FunctionRuntimeStub | None = None
    registered: list[str] = field(default_factory=list)


def host_argv(kind: str, host_id: str, state: Path, pki: BenchPKI) -> list[str]:
    program = ["-m", "kruntimes.workers.host"] if kind in SANDBOXED else [str(BARE_HOST)]
    return [
        sys.executable,
        *program,
        *("--host-id", host_id, "--runtime", "python", "--state-dir", str(state)),
        *("--log-level", "warning", *pki.host_args(host_id)),
        *KIND_FLAGS.get(kind, []),
    ]


async def register_batch(hosts: list[Host], per_host: int, pki: BenchPKI) -> tuple[float, float]:
    """PER_HOST functions on every host at once; (machine CPU seconds, wall seconds)."""

    async def one(host: Host, i: int) -> None:
        assert host.stub is not None
        request = pki.register_request(
            i, host_id=host.host_id, host_uid=host.server.ready["hostUid"], namespace="bench"
        )
        response = await host.stub.RegisterFunction(request, timeout=CALL_TIMEOUT_S)
        host.registered.append(response.registration_id)

    busy0, t0 = machine_busy_seconds(), time.perf_counter()
    await asyncio.gather(*(one(h, i) for h in hosts for i in range(per_host)))
    return machine_busy_seconds() - busy0, time.perf_counter() - t0


async def warm_invokes(hosts: list[Host], calls: int) -> list[float]:
    """`calls` invocations one after another, round-robin over the hosts' registered functions;
    each one's latency (s)."""
    pairs = [(h, r) for h in hosts for r in h.registered]
    latencies = []
    for i in range(calls):
        host, registration = pairs[i % len(pairs)]
        assert host.gateway is not None
        t0 = time.perf_counter()
        answer = await host.gateway.InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=registration, payload=b'{"n": 1}', timeout_ms=30_000),
            timeout=CALL_TIMEOUT_S,
        )
        latencies.append(time.perf_counter() - t0)
        lib.check_invoke(answer.SerializeToString())
    return latencies


def rule_changes(calls: int, lock_dir: Path) -> dict[str, float]:
    """What one function's packet-rule elements cost, measured alone (ms of wall time per nft run,
    median of `calls`): the open uid of a `network: host` function, and an allow list of
    ALLOW_ENTRIES, each added (its identity made) and taken out (released). Uids of a range no
    host uses (between the default range and the pods'), taken out of the pool set after."""
    rules = egress.PacketRules(lock_dir=str(lock_dir))
    first = 2_099_000_000
    rules.install(first, first + calls - 1, resolvers=())
    allow = parse_allow_list([flag.removeprefix("--egress-allow=") for flag in KIND_FLAGS["allowlist"]])
    spent: dict[str, list[float]] = {"open_add": [], "open_remove": [], "allow_add": [], "allow_remove": []}
    try:
        for uid in range(first, first + calls):
            for name, change in (
                ("open_add", lambda u: rules.admit(u, open_=True)),
                ("open_remove", lambda u: rules.revoke(u, open_=True)),
                ("allow_add", lambda u: rules.admit(u, allow=allow)),
                ("allow_remove", lambda u: rules.revoke(u, allow=allow)),
            ):
                t0 = time.perf_counter()
                change(uid)
                spent[name].append(time.perf_counter() - t0)
    finally:
        subprocess.run(
            [
                rules.nft,
                f"delete element {egress.FAMILY} {egress.TABLE} pool {{ {first}-{first + calls - 1} }}",
            ],
            check=False,
            capture_output=True,
            timeout=30,
        )
    return {name: round(1000 * statistics.median(values), 2) for name, values in spent.items()}


async def unregister_all(hosts: list[Host]) -> None:
    """Every function unregistered, then until the hosts' function processes are gone."""
    for host in hosts:
        assert host.stub is not None
        stub = host.stub
        await asyncio.gather(
            *(
                stub.UnregisterFunction(
                    pb.UnregisterFunctionRequest(registration_id=r), timeout=CALL_TIMEOUT_S
                )
                for r in host.registered
            )
        )
        host.registered.clear()
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while any(len(lib.function_pids(h.server.pid)) > seeds(h) for h in hosts):
        if time.monotonic() > deadline:
            raise BenchError(f"function processes still alive {GONE_TIMEOUT_S:g} s after unregistering")
        await asyncio.sleep(0.1)


def seeds(host: Host) -> int:
    """The processes a host keeps with no function: its seeds (`HostOptions.seeds`, the bench's
    hosts' default; an init and a waiting process each), which it plants again after use."""
    return 2 * HostOptions.seeds if host.kind in SANDBOXED else 0


def memory(hosts: list[Host]) -> dict[str, float]:
    """PSS (MiB) of a Ready sandboxed function on its host: its init and its function process."""
    inits: list[int] = []
    functions: list[int] = []
    for host in hosts:
        zygote = lib.zygote_of(host.server.pid)
        for init in lib.children(zygote) if zygote is not None else []:
            kids = lib.children(init)
            if len(kids) == 1 and not lib.children(kids[0]):
                inits.append(init)
                functions.append(kids[0])

    def mean_pss(pids: list[int]) -> float:
        values = [pss_kib(p) for p in pids]
        known = [v for v in values if v is not None]
        return round(statistics.fmean(known) / 1024, 2) if known else float("nan")

    return {
        "functions": len(functions),
        "init_pss_mib": mean_pss(inits),
        "function_pss_mib": mean_pss(functions),
    }


def pss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    servers: list[lib.Server] = []
    with tempfile.TemporaryDirectory(prefix="krt-bench-start-") as tmp_name:
        tmp = Path(tmp_name)
        pki = BenchPKI(tmp / "pki")
        try:
            async with contextlib.AsyncExitStack() as stack:
                lib.note(f"starting {args.hosts} hosts of each kind ...")
                hosts: list[Host] = []
                for kind in KINDS:
                    for i in range(args.hosts):
                        host_id = f"{kind}-{i}"
                        state = tmp / host_id
                        state.mkdir()
                        server = await lib.start_server(
                            host_id, host_argv(kind, host_id, state, pki), tmp, servers
                        )
                        hosts.append(Host(kind, host_id, server))
                for host in hosts:
                    channel = await stack.enter_async_context(
                        pki.aio_channel(host.server.address, as_=CONTROL_PLANE)
                    )
                    await asyncio.wait_for(channel.channel_ready(), lib.START_TIMEOUT_S)
                    host.stub = pb_grpc.FunctionRuntimeStub(channel)
                    as_gateway = await stack.enter_async_context(
                        pki.aio_channel(host.server.address, as_=GATEWAY)
                    )
                    host.gateway = pb_grpc.FunctionRuntimeStub(as_gateway)
                isolation = {
                    kind: next(h.server.ready.get("isolation", "?") for h in hosts if h.kind == kind)
                    for kind in SANDBOXED
                }
                per_start: dict[str, list[float]] = {kind: [] for kind in KINDS}
                walls: dict[str, list[float]] = {kind: [] for kind in KINDS}
                invokes: dict[str, list[float]] = {kind: [] for kind in KINDS}
                held: dict[str, float] = {}
                for r in range(args.rounds):
                    for kind in KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]:
                        group = [h for h in hosts if h.kind == kind]
                        lib.note(
                            f"round {r + 1}/{args.rounds}: {args.per_host} functions on each {kind} host ..."
                        )
                        cpu_s, wall_s = await register_batch(group, args.per_host, pki)
                        per_start[kind].append(1000 * cpu_s / (args.per_host * len(group)))
                        walls[kind].append(wall_s)
                        if kind == "sandboxed" and not held:
                            held = memory(group)
                        invokes[kind] += await warm_invokes(group, args.invokes)
                        await unregister_all(group)
        finally:
            for server in servers:
                lib.stop_server(server)
        lib.note("packet-rule elements of one function, alone ...")
        nft = rule_changes(RULE_CHANGES, tmp / "uids")
    pages = page_costs_us()
    start = {kind: statistics.median(per_start[kind]) for kind in KINDS}
    p50 = {kind: 1000 * statistics.median(invokes[kind]) for kind in KINDS}
    on, off = start["sandboxed"], start["unsandboxed"]
    print()
    print(
        f"{args.hosts} hosts of each kind, {args.per_host} Python echo functions registered on each at once,"
    )
    print(f"{args.rounds} rounds; sandboxed: {isolation['sandboxed']}")
    for kind in KINDS:
        rounds = ", ".join(f"{v:.1f}" for v in per_start[kind])
        print(
            f"  machine CPU per start, {kind:<11}: {start[kind]:5.1f} ms (rounds: {rounds}); "
            f"warm invoke p50 {p50[kind]:.3f} ms ({len(invokes[kind])} calls)"
        )
    print(f"  isolation's cost: {on / off:.2f}x the machine's CPU of an unsandboxed start")
    print(
        f"  network outbound against host: a start {on / start['host']:.2f}x, a warm invoke "
        f"{p50['sandboxed'] / p50['host']:.2f}x"
    )
    print(
        f"  an allow list of {ALLOW_ENTRIES} entries: {start['allowlist'] - on:+.1f} ms of machine CPU "
        f"a start ({start['allowlist'] / on:.2f}x)"
    )
    print(
        f"  one function's elements, one nft run each: open uid {nft['open_add']} ms added, "
        f"{nft['open_remove']} ms taken out; {ALLOW_ENTRIES} allowed destinations {nft['allow_add']} ms "
        f"added, {nft['allow_remove']} ms taken out (median of {RULE_CHANGES})"
    )
    print(
        f"  a Ready sandboxed function on its host: init {held.get('init_pss_mib')} MiB PSS, "
        f"function process {held.get('function_pss_mib')} MiB ({held.get('functions')} read)"
    )
    print(
        f"  this machine's memory: a fresh page {pages['fresh_page_us']} µs, a copy-on-write copy "
        f"{pages['copy_on_write_us']} µs ({PAGE_PROBE_PAGES} pages)"
    )
    return {
        "bench": "function_start",
        "hosts": args.hosts,
        "per_host": args.per_host,
        "rounds": args.rounds,
        "isolation": isolation,
        "machine_cpu_ms_per_start": {kind: [round(v, 2) for v in per_start[kind]] for kind in KINDS},
        "wall_s": {kind: [round(v, 2) for v in walls[kind]] for kind in KINDS},
        "ratio": round(on / off, 2),
        "outbound_vs_host": {
            "start": round(on / start["host"], 2),
            "warm_invoke_p50": round(p50["sandboxed"] / p50["host"], 2),
        },
        "allowlist_entries": ALLOW_ENTRIES,
        "allowlist_extra_ms_per_start": round(start["allowlist"] - on, 2),
        "warm_invoke_p50_ms": {kind: round(p50[kind], 3) for kind in KINDS},
        "nft_ms_per_function": nft,
        "memory": held,
        "page_costs_us": pages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=5, help="hosts of each kind (1..20)")
    parser.add_argument(
        "--per-host", type=int, default=60, help="functions registered on each at once (1..200)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every kind (1..10)")
    parser.add_argument(
        "--invokes", type=int, default=200, help="warm invocations of each kind each round (1..10000)"
    )
    args = parser.parse_args()
    bounds = (("hosts", 1, 20), ("per_host", 1, 200), ("rounds", 1, 10), ("invokes", 1, 10_000))
    for name, low, high in bounds:
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} takes {low}..{high}")

    async def bounded() -> dict[str, Any]:
        return await asyncio.wait_for(run(args), BENCH_DEADLINE_S)

    lib.print_json_line(asyncio.run(bounded()))


if __name__ == "__main__":
    main()
