"""Benchmark: async invocations (issue #44) on the embedded platform, against their peers in the
same run.

    .venv/bin/python bench/async_invoke.py                       (about two minutes)
    .venv/bin/python bench/async_invoke.py --invocations 300 --duplicates 60     (a quick look)

`krt up --detach` in a new state directory (Temporal dev server on SQLite, the worker, the HTTPS
gateway, one process host). One function Run, concurrency 8 with `asyncInvocations.share: 100`,
whose handler creates a file named by its invocation id (one per execution: the bench counts
them) and sleeps 20 ms. Real HTTPS clients (aiohttp, one keep-alive session), ports picked at run
time, traffic only to 127.0.0.1:

  e2e     `--e2e` fresh async invocations (`Prefer: respond-async`), `--callers` at once: from
          the first accept until the last of them is Succeeded (each read back through the
          gateway), completions/s against `sync`.
  sync    as many sync invokes of the same Run, 8 clients (its concurrency): its rate.
  accept  `--invocations` async invocations and `--duplicates` submissions again of ids already
          sent (the same body; half right after their original, so the two race, half in the
          next round), in `--rounds` rounds, `--callers` at once: every answer must be 202 with
          its id's one Location; latency p50/p99 and requests/s against
  plain   a plain Temporal workflow start (the Python SDK's client of the platform, its codec; a
          workflow type on a task queue nobody polls), as many a round, `--callers` at once,
          before or after the round's accepts (swapped every round). Both run while the
          invocations accepted so far run (the worker and the dev server busy with them); the
          plain starts make no such work of their own, so on a machine of few CPUs this
          ratio is the accepts' share of CPUs their invocations also need.
  alone   the accept path alone: `--alone-rounds` rounds of `--alone` accepts against as many
          plain starts (swapped every round) with the platform's worker stopped (SIGSTOP, then
          SIGCONT), so no accepted invocation runs meanwhile: goal accept ≥ 0.8× the plain
          starts' rate (medians of the rounds), and each process's CPU per item (/proc).

Every id must have run exactly once (its files counted) and ended Succeeded; any other answer or
count fails the bench. Prints the machine, a table and a final JSON line {"bench": "async_invoke"}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import _benchlib as lib
import aiohttp
from _benchlib import BenchError
from temporalio.client import Client as TemporalClient

from kruntimes.api.run import Run
from kruntimes.contracts.invocation import QUERY_INVOCATION, InvocationStatus, invocation_workflow_id
from kruntimes.sdk.client import Client
from kruntimes.temporal.connect import connect
from kruntimes.wire import search

ACCEPT_GOAL = 0.8
SYNC_CLIENTS = 8
CONCURRENCY = 8
RUNTIMES = """\
runtimes:
  - {name: python, adapter: python, runs: 4, minHosts: 1, maxHosts: 1}
"""
SOURCE = """\
import os, time

def handle(payload, context):
    open(os.path.join(os.environ["RECORDS"], context.invocation_id + "." + os.urandom(4).hex()), "x").close()
    time.sleep(0.02)
    return {"ok": True}
"""
# workflows/invocation.py's reasons for an attempt whose activity never answered: it may have run
# (AttemptLost), or it timed out before it recorded that it sends (AttemptNotStarted: tried again)
LOST_REASONS = ("AttemptLost", "AttemptNotStarted")
PLAIN_QUEUE = "bench-async-nobody"  # no worker polls it: a start is all that is measured
COMPLETION_BOUND_S = 600.0


@dataclass
class Timed:
    latencies: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    @property
    def rate(self) -> float:
        return lib.ratio(len(self.latencies), self.ended - self.started)


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


async def spread(calls: Sequence[object], callers: int, one: Callable[[object], Awaitable[None]]) -> Timed:
    """Each of `calls` passed to `one` (an async callable), `callers` at once; each one's latency."""
    timed = Timed()
    queue: asyncio.Queue[object] = asyncio.Queue()
    for c in calls:
        queue.put_nowait(c)

    async def caller() -> None:
        while not queue.empty():
            item = queue.get_nowait()
            t0 = time.perf_counter()
            await one(item)
            timed.latencies.append(time.perf_counter() - t0)

    timed.started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    timed.ended = time.perf_counter()
    return timed


def ran(records: Path) -> Counter[str]:
    return Counter(p.name.rpartition(".")[0] for p in records.iterdir())


async def bench(args: argparse.Namespace) -> int:
    records = Path(tempfile.mkdtemp(prefix="krt-bench-async-records-"))
    try:
        return await measure(args, records)
    finally:
        shutil.rmtree(records, ignore_errors=True)


async def measure(args: argparse.Namespace, records: Path) -> int:
    records.chmod(0o1777)  # the function writes here as its own uid
    runtimes = RUNTIMES + f"sharedDirectories: [{records}]\n"
    lib.note("starting the embedded platform (krt up --detach) ...")
    async with lib.embedded_platform(prefix="krt-bench-async-", runtimes=runtimes) as (state, config):
        token = config.token or ""
        temporal = await connect(config.temporal_settings())
        client_ssl = ssl.create_default_context(cafile=config.caFile)
        connector = aiohttp.TCPConnector(limit=args.callers * 2, ssl=client_ssl, keepalive_timeout=120)
        async with (
            Client(config) as krt,
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session,
        ):
            name = "abench"
            await krt.create(
                Run.new(
                    name, runtime="python", handler="main:handle", inline={"main.py": SOURCE},
                    env={"RECORDS": str(records)}, uid=str(uuid.uuid4()),
                    mode={"function": {"concurrency": CONCURRENCY, "asyncInvocations": {"share": 100}}},
                )
            )  # fmt: skip
            run = await krt.wait(name, timeout=120)
            assert run.status is not None and run.status.endpoint is not None
            url = run.status.endpoint.url
            auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

            # warm-up: the function's processes, the gateway's route and Temporal's caches
            for n in range(CONCURRENCY):
                async with session.post(
                    url, data=b"{}", headers={**auth, "X-Kruntime-Invocation-ID": f"warm-{n}"}
                ) as r:
                    if r.status != 200:
                        raise BenchError(f"warm-up invoke: {r.status} {await r.text()}")

            locations: dict[str, set[str]] = {}
            statuses: Counter[int] = Counter()
            body = json.dumps({"x": 1}).encode()

            async def accept(inv: object) -> None:
                headers = {**auth, "X-Kruntime-Invocation-ID": str(inv), "Prefer": "respond-async"}
                async with session.post(url, data=body, headers=headers) as r:
                    statuses[r.status] += 1
                    if r.status == 202:
                        locations.setdefault(str(inv), set()).add(r.headers.get("Location", ""))
                    else:
                        lib.note(f"accept {inv}: {r.status} {(await r.text())[:200]}")

            async def plain(n: object) -> None:
                await temporal.start_workflow(
                    "BenchPlainStart", {"n": n}, id=f"bench-plain-{n}", task_queue=PLAIN_QUEUE
                )

            async def sync(n: object) -> None:
                headers = {**auth, "X-Kruntime-Invocation-ID": f"sync-{n}"}
                async with session.post(url, data=body, headers=headers) as r:
                    statuses[-r.status] += 1  # negative: a sync answer's status
                    await r.read()

            attempts: dict[str, int] = {}  # each ended invocation's attempts
            ended_not_ok: dict[str, str] = {}  # id → Failed or Unknown
            lost_ids: set[str] = set()  # those with an attempt whose activity never answered

            async def all_succeeded(wanted: set[str]) -> None:
                """Until each of `wanted` ended (Succeeded, or Failed / Unknown: kept in `ended_not_ok`
                as the bench's finding, never waited for past its end)."""
                deadline = time.monotonic() + COMPLETION_BOUND_S
                ended: set[str] = set()
                while not wanted <= ended:
                    for state in ("Succeeded", "Failed", "Unknown"):
                        async for inv in krt.invocations.list(run, state=state, limit=None, page_size=1000):
                            if inv.invocationId in wanted:
                                ended.add(inv.invocationId)
                                attempts[inv.invocationId] = inv.attemptCount
                                if any(a.reason in LOST_REASONS for a in inv.attempts):
                                    lost_ids.add(inv.invocationId)
                                if state != "Succeeded":
                                    ended_not_ok[inv.invocationId] = state
                    if not wanted <= ended:
                        if time.monotonic() > deadline:
                            raise BenchError(f"{len(wanted - ended)} did not end in {COMPLETION_BOUND_S:g} s")
                        await asyncio.sleep(0.2)

            # e2e: a burst of fresh invocations, from the first accept until the last Succeeded
            e2e_ids = [f"e2e-{n:05d}-{uuid.uuid4().hex[:6]}" for n in range(args.e2e)]
            lib.note(f"end to end: {args.e2e} async invocations ...")
            first = time.perf_counter()
            await spread(e2e_ids, args.callers, accept)
            await all_succeeded(set(e2e_ids))
            e2e_s = time.perf_counter() - first
            lib.note(f"sync invokes: {args.e2e} ...")
            sync_t = await spread(list(range(args.e2e)), SYNC_CLIENTS, sync)

            # accept against plain starts, round by round (the order swapped every round), while
            # the invocations accepted so far run
            ids = [f"inv-{n:05d}-{uuid.uuid4().hex[:6]}" for n in range(args.invocations)]
            dups = random.Random(7).sample(range(args.invocations), args.duplicates)
            per = -(-args.invocations // args.rounds)
            batches = [ids[rnd * per : (rnd + 1) * per] for rnd in range(args.rounds)]
            for k, n in enumerate(dups):
                rnd = n // per
                if k % 2 == 0:  # right after its original: the two race
                    batches[rnd].insert(
                        min(len(batches[rnd]), batches[rnd].index(ids[n]) + 1 + k % 3), ids[n]
                    )
                else:  # in a later round (the last one's own at its end): a submission again
                    batches[min(rnd + 1, args.rounds - 1)].append(ids[n])
            acc, plains = Timed(), Timed()
            acc_s = plain_s = 0.0
            # a diagnostic: the gateway's backlog count (the same visibility query, each second
            # one per target and one per namespace) timed while the rounds run
            backlog_query = search.invocations_listed(
                namespace="default", target_kind="Run", target_uid=run.uid, state="Queued"
            )
            counts: list[float] = []

            async def count_backlog() -> None:
                while True:
                    t0 = time.perf_counter()
                    await temporal.count_workflows(backlog_query)
                    counts.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.5)

            counting = asyncio.create_task(count_backlog())
            for rnd, batch in enumerate(batches):
                lib.note(f"round {rnd + 1}/{args.rounds}: {len(batch)} accepts, {per} plain starts ...")
                starts = list(range(rnd * per, rnd * per + per))
                for kind in ("accept", "plain") if rnd % 2 == 0 else ("plain", "accept"):
                    if kind == "accept":
                        timed = await spread(batch, args.callers, accept)
                        acc.latencies += timed.latencies
                        acc_s += timed.ended - timed.started
                    else:
                        timed = await spread(starts, args.callers, plain)
                        plains.latencies += timed.latencies
                        plain_s += timed.ended - timed.started
            counting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counting
            lib.note("waiting for every invocation to complete ...")
            await all_succeeded(set(ids))

            # the accept path alone: the same rounds with the platform's worker stopped, so that no
            # accepted invocation runs beside them (each plain start makes no such work either);
            # CPU per item of each process on the path from /proc
            iso_ids = [f"iso-{n:05d}-{uuid.uuid4().hex[:6]}" for n in range(args.alone_rounds * args.alone)]
            alone = await accept_path_alone(state, args, iso_ids, accept, plain)
            lib.note("waiting for the accept path's invocations to complete ...")
            await all_succeeded(set(iso_ids))
            ids = [*ids, *iso_ids]
            lost = await lost_attempts(temporal, run.uid, sorted(lost_ids), args.keep_histories)
            if args.keep_histories is not None and lost_ids:  # the processes' logs beside them
                for log in state.rglob("*.log"):
                    shutil.copy(log, args.keep_histories / log.name)

    counted = ran(records)
    # exactly once: every Succeeded id ran once; one that ended otherwise ran at most once
    twice = sorted(
        inv for inv in [*ids, *e2e_ids] if counted[inv] > 1 or (counted[inv] != 1 and inv not in ended_not_ok)
    )
    wrong_locations = sorted(inv for inv, seen in locations.items() if len(seen) != 1)
    plain_lat = plains.latencies
    plain_rate = lib.ratio(len(plain_lat), plain_s)
    acc_rate = lib.ratio(len(acc.latencies), acc_s)
    accept_ratio = lib.ratio(acc_rate, plain_rate)
    e2e_rate = lib.ratio(args.e2e, e2e_s)
    e2e_ratio = lib.ratio(e2e_rate, sync_t.rate)
    alone_ratio = float(alone["ratio"])  # type: ignore[arg-type]
    met = alone_ratio >= ACCEPT_GOAL
    bad = {k: v for k, v in statuses.items() if k not in (202, -200)}
    print(f"machine: {json.dumps(machine())}")
    rows = [
        ["case", "requests", "p50 ms", "p99 ms", "per s", "ratio"],
        ["plain start, invocations running", str(len(plain_lat)), f"{lib.ms(lib.percentile(plain_lat, 50))}",
         f"{lib.ms(lib.percentile(plain_lat, 99))}", lib.fmt(plain_rate, 1), "1"],
        ["async accept, invocations running", str(len(acc.latencies)),
         f"{lib.ms(lib.percentile(acc.latencies, 50))}", f"{lib.ms(lib.percentile(acc.latencies, 99))}",
         lib.fmt(acc_rate, 1), f"{lib.fmt(accept_ratio, 2)} of plain"],
        ["plain start, worker stopped", str(args.alone * args.alone_rounds), f"{alone['plain_p50_ms']}",
         f"{alone['plain_p99_ms']}",
         lib.fmt(float(alone["plain_per_s"]), 1), "1"],  # type: ignore[arg-type]
        ["async accept, worker stopped", str(args.alone * args.alone_rounds), f"{alone['accept_p50_ms']}",
         f"{alone['accept_p99_ms']}",
         lib.fmt(float(alone["accept_per_s"]), 1),  # type: ignore[arg-type]
         f"{lib.fmt(alone_ratio, 2)} of plain (goal ≥ {ACCEPT_GOAL}: {'met' if met else 'NOT met'})"],
        ["sync invoke", str(len(sync_t.latencies)), f"{lib.ms(lib.percentile(sync_t.latencies, 50))}",
         f"{lib.ms(lib.percentile(sync_t.latencies, 99))}", lib.fmt(sync_t.rate, 1), "1"],
        ["async end to end", str(args.e2e), "-", "-", lib.fmt(e2e_rate, 1),
         f"{lib.fmt(e2e_ratio, 2)} of sync"],
    ]  # fmt: skip
    for line in lib.table(rows):
        print(line)
    print(
        f"CPU ms per item, the accept path alone (medians of rounds' rates above): {alone['cpu_ms_per_item']}"
    )
    retried = sum(1 for n in attempts.values() if n > 1)
    print(f"invocations attempted more than once (refused for load, then run): {retried} of {len(attempts)}")
    print(
        f"the backlog's visibility count while the rounds ran: p50 {lib.ms(lib.percentile(counts, 50))} ms, "
        f"max {lib.ms(max(counts, default=math.nan))} ms ({len(counts)} counts)"
    )
    print(
        f"ids {args.invocations}, duplicate submissions {args.duplicates}: each ran exactly once: "
        f"{'yes' if not twice else f'NO ({len(twice)}, e.g. {twice[:3]})'}; one Location each: "
        f"{'yes' if not wrong_locations else f'NO ({wrong_locations[:3]})'}; other answers: {bad or 'none'}"
    )
    print(f"attempts whose activity never answered: {dict(lost) or 'none'}")
    if ended_not_ok:
        never_ran = sorted(inv for inv in ended_not_ok if counted[inv] == 0)
        print(
            f"ended other than Succeeded: {len(ended_not_ok)} ({sorted(set(ended_not_ok.values()))}), "
            f"{len(never_ran)} of them never ran, e.g. {never_ran[:3]}"
        )

    def summary(timed: list[float], rate: float) -> dict[str, float]:
        p50, p99 = lib.percentile(timed, 50), lib.percentile(timed, 99)
        return {"p50_ms": lib.ms(p50), "p99_ms": lib.ms(p99), "per_s": round(rate, 1)}

    lib.print_json_line(
        {
            "bench": "async_invoke",
            "machine": machine(),
            "invocations": args.invocations,
            "duplicates": args.duplicates,
            "e2e_invocations": args.e2e,
            "backlog_count_ms": {
                "p50": lib.ms(lib.percentile(counts, 50)),
                "max": lib.ms(max(counts, default=math.nan)),
            },
            "callers": args.callers,
            "plain": summary(plain_lat, plain_rate),
            "accept": {**summary(acc.latencies, acc_rate), "ratio": accept_ratio},
            "accept_path_alone": {**alone, "goal": ACCEPT_GOAL, "met": met},
            "sync": summary(sync_t.latencies, sync_t.rate),
            "e2e": {"seconds": round(e2e_s, 2), "per_s": round(e2e_rate, 1), "ratio_to_sync": e2e_ratio},
            "exactly_once": not twice,
            "ended_not_succeeded": len(ended_not_ok),
            "attempted_more_than_once": retried,
            "attempts_lost": dict(lost),
            "other_answers": {str(k): v for k, v in bad.items()},
        }
    )
    return 0 if not twice and not wrong_locations and not bad else 1


async def lost_attempts(
    temporal: TemporalClient, uid: str, ids: list[str], keep: Path | None
) -> Counter[str]:
    """The attempts of `ids` whose activity never answered, by reason (LOST_REASONS), from their
    statuses; with `keep`, each one's history is written there (JSON, as `temporal workflow show
    --output json`) to read what became of its activity."""
    lost: Counter[str] = Counter()
    for inv in ids:
        handle = temporal.get_workflow_handle(invocation_workflow_id("default", uid, inv))
        status = await handle.query(QUERY_INVOCATION, result_type=InvocationStatus)
        lost.update(a.reason for a in status.attempts if a.reason in LOST_REASONS)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            history = await handle.fetch_history()
            (keep / f"{inv}.json").write_text(history.to_json())
    return lost


TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _platform_pids(state: Path, pattern: str) -> list[int]:
    """The pids of this bench's platform's processes whose command line matches `pattern` and
    names its state directory (processes this bench started with `krt up`, none other)."""
    found = subprocess.run(
        ["pgrep", "-f", f"{pattern}.*{state}"], capture_output=True, text=True, check=False
    )
    return [int(p) for p in found.stdout.split()]


async def accept_path_alone(
    state: Path,
    args: argparse.Namespace,
    ids: list[str],
    accept: Callable[[object], Awaitable[None]],
    plain: Callable[[object], Awaitable[None]],
) -> dict[str, object]:
    """`--alone-rounds` rounds of `--alone` accepts against as many plain starts (the order swapped
    every round) with the platform's worker stopped (SIGSTOP, SIGCONT after): the rates and each
    process's CPU per item."""
    workers = _platform_pids(state, "kruntimes.workers.worker")
    if not workers:
        raise BenchError("the platform's worker process was not found")
    processes = {
        "dev server": _platform_pids(state, "temporal server start-dev"),
        "front": _platform_pids(state, "kruntimes.workers.temporal_front"),
        "gateway": _platform_pids(state, "kruntimes.workers.gateway"),
        "bench": [os.getpid()],
    }
    rates: dict[str, list[float]] = {"accept": [], "plain": []}
    latencies: dict[str, list[float]] = {"accept": [], "plain": []}
    cpu: dict[str, dict[str, float]] = {
        "accept": dict.fromkeys(processes, 0.0),
        "plain": dict.fromkeys(processes, 0.0),
    }
    counted = {"accept": 0, "plain": 0}
    lib.note(f"the accept path alone: {args.alone_rounds} rounds of {args.alone}, the worker stopped ...")
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        for rnd in range(args.alone_rounds):
            batch = ids[rnd * args.alone : (rnd + 1) * args.alone]
            starts = [f"alone-{rnd}-{n}" for n in range(args.alone)]
            for kind in ("accept", "plain") if rnd % 2 == 0 else ("plain", "accept"):
                before = {k: sum(_cpu_s(p) for p in v) for k, v in processes.items()}
                timed = (
                    await spread(batch, args.callers, accept)
                    if kind == "accept"
                    else await spread(starts, args.callers, plain)
                )
                for k, v in processes.items():
                    cpu[kind][k] += sum(_cpu_s(p) for p in v) - before[k]
                rates[kind].append(len(timed.latencies) / (timed.ended - timed.started))
                latencies[kind] += timed.latencies
                counted[kind] += len(timed.latencies)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    accept_rate, plain_rate = statistics.median(rates["accept"]), statistics.median(rates["plain"])
    per_item = {
        kind: {k: round(v / max(counted[kind], 1) * 1000, 2) for k, v in cpu[kind].items()} for kind in cpu
    }
    return {
        "rounds": args.alone_rounds,
        "per_round": args.alone,
        "accept_per_s": round(accept_rate, 1),
        "plain_per_s": round(plain_rate, 1),
        "accept_p50_ms": lib.ms(lib.percentile(latencies["accept"], 50)),
        "accept_p99_ms": lib.ms(lib.percentile(latencies["accept"], 99)),
        "plain_p50_ms": lib.ms(lib.percentile(latencies["plain"], 50)),
        "plain_p99_ms": lib.ms(lib.percentile(latencies["plain"], 99)),
        "ratio": round(accept_rate / plain_rate, 3),
        "cpu_ms_per_item": per_item,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invocations", type=int, default=1000, help="distinct invocation ids")
    parser.add_argument("--duplicates", type=int, default=200, help="submissions again of ids already sent")
    parser.add_argument("--callers", type=int, default=32, help="concurrent accepts (and plain starts)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of accepts against plain starts")
    parser.add_argument(
        "--alone", type=int, default=300, help="accepts (and plain starts) a round, worker stopped"
    )
    parser.add_argument("--alone-rounds", type=int, default=4, help="rounds of the accept path alone")
    parser.add_argument("--e2e", type=int, default=300, help="async invocations of the end-to-end case")
    parser.add_argument(
        "--keep-histories", type=Path, default=None, help="write the histories of those not Succeeded here"
    )
    args = parser.parse_args()
    if not 0 <= args.duplicates <= args.invocations:
        parser.error("--duplicates must be within 0..--invocations")
    if not 1 <= args.rounds <= args.invocations or args.e2e < 1 or args.callers < 1:
        parser.error("--rounds must be within 1..--invocations; --e2e and --callers at least 1")
    return args


def main() -> None:
    args = parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.exit(asyncio.run(bench(args)))


if __name__ == "__main__":
    main()
