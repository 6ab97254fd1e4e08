"""Benchmark: one reconciler round's decision (`kruntimes.decisions.reconciling.plan`) at 10,000 Ready Runs
next to the same at 1,000, in one run.

    .venv/bin/python bench/reconcile.py [--runs 10000] [--base 1000] [--repeat 5]

A runtime as bench/scale.py leaves it: hosts of 500 Runs, every Run Ready, registered on its
host, holding its slot there and running; the snapshot a round reads of it, and the plan made
from it (nothing to do). The plan runs on the worker's event loop, which every workflow task
and local activity of that worker waits on, so its time is a pause of the whole worker once a
minute. Reported: the plan's median time at BASE and at RUNS Ready Runs, per Ready Run, and
the ratio of the two per-Run costs (target <= 1.5: linear in the Runs; looking every Ready Run
up in every reservation made it 5 s at 10,000).

Prints a table and a final JSON line {"bench": "reconcile", ...}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _benchlib import print_json_line, table

from kruntimes.decisions.reconciling import HostSeen, Registration, Snapshot, plan
from kruntimes.decisions.scheduling.model import Host, HostState, Reservation, TenancyMode

HOST_RUNS = 500
TARGET = 1.5
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(minutes=10)


def snapshot(runs: int) -> Snapshot:
    hosts = [
        Host(
            hostId=f"bash-{i}",
            hostUid=f"bash-{i}-uid",
            runtime="bash",
            address=f"127.0.0.1:{20000 + i}",
            state=HostState.Ready,
            capacity=HOST_RUNS,
            tenancy=TenancyMode.Shared,
            createdAt=OLD,
            assignedAt=OLD,
            readyAt=OLD,
            supervised=True,
        )
        for i in range(-(-runs // HOST_RUNS))
    ]
    uids = [f"run-{i:05d}" for i in range(runs)]
    workflow = {uid: f"run/default/{uid}" for uid in uids}
    seen = [
        HostSeen(
            host,
            tuple(
                Registration(f"reg-{uid}", uid, 1, "default", uid, OLD)
                for uid in uids[n * HOST_RUNS : (n + 1) * HOST_RUNS]
            ),
        )
        for n, host in enumerate(hosts)
    ]
    reservations = [
        Reservation(runUid=uid, hostId=hosts[i // HOST_RUNS].hostId, hostUid=hosts[i // HOST_RUNS].hostUid,
                    tenant=None, reservedAt=OLD)
        for i, uid in enumerate(uids)
    ]  # fmt: skip
    return Snapshot(
        now=NOW,
        grace_s=60.0,
        ready=workflow,
        hosts=seen,
        reservations=reservations,
        owners=workflow,
        queued=[],
        provisioning=frozenset(),
        running={wid: uid for uid, wid in workflow.items()},
        records=[],
        live_uids=frozenset(h.hostUid for h in hosts),
        supervisors=frozenset(h.hostId for h in hosts),
    )


def median_s(runs: int, repeat: int) -> float:
    state = snapshot(runs)
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        decided = plan(state)
        times.append(time.perf_counter() - began)
        if decided.actions():
            raise SystemExit(f"a consistent runtime of {runs} Runs got {decided.actions()} actions")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--base", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base, full = median_s(args.base, args.repeat), median_s(args.runs, args.repeat)
    per_base, per_full = base / args.base, full / args.runs
    ratio = per_full / per_base
    rows = [
        ["Ready Runs", "plan (median)", "per Ready Run"],
        [f"{args.base:,}", f"{base * 1000:.1f} ms", f"{per_base * 1e6:.2f} µs"],
        [f"{args.runs:,}", f"{full * 1000:.1f} ms", f"{per_full * 1e6:.2f} µs"],
    ]
    for line in table(rows):
        print(line)
    verdict = "met" if ratio <= TARGET else "NOT MET"
    print(f"per-Run cost at {args.runs:,} / at {args.base:,}: {ratio:.2f}x (target <= {TARGET}x) {verdict}")
    print_json_line(
        {
            "bench": "reconcile",
            "runs": args.runs,
            "base": args.base,
            "plan_ms": round(full * 1000, 2),
            "base_plan_ms": round(base * 1000, 2),
            "per_run_ratio": round(ratio, 3),
        }
    )


if __name__ == "__main__":
    main()
