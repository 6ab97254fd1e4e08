"""Benchmark: the exec evaluator next to spawning the same binary directly, in one run.

    .venv/bin/python bench/krm.py [--calls 300] [--rounds 5]

A trivial function (echo: the ResourceList from stdin to stdout) is evaluated through
`ExecEvaluator.evaluate` (FunctionConfig lookup, process group, limits, bounded reads, output
parsed as a ResourceList with its results) and spawned directly (`asyncio.create_subprocess_exec`
with the same stdin, output read whole). Two programs: a Python script and a `/bin/sh` one
(`exec cat`, a much cheaper start, so our own overhead shows more). The two paths alternate call
by call in several rounds, so background load hits both alike.

Target: evaluation p50 <= 1.3x the direct spawn p50. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from krm import config as fc
from krm.evaluation import Request
from krm.executable import ExecEvaluator
from krm.resources import resource_list
from krm.store import Store

TARGET = 1.3
PROGRAMS = {
    "python": f"#!{sys.executable}\nimport sys\nsys.stdout.write(sys.stdin.read())\n",
    "sh": "#!/bin/sh\nexec cat\n",
}


def payload() -> bytes:
    items = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}, "data": {"k": "v" * 32}}
        for i in range(10)
    ]
    return resource_list(items)


async def direct(path: Path, data: bytes) -> bytes:
    process = await asyncio.create_subprocess_exec(
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate(data)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(name: str, path: Path, data: bytes, *, calls: int, rounds: int) -> dict[str, float]:
    store = Store(functions_dir=path.parent)
    store.put(
        "bench",
        fc.parse(
            {
                "apiVersion": fc.API_VERSION,
                "kind": fc.KIND,
                "metadata": {"name": name},
                "spec": {"prefixes": [f"bench/{name}"], "binaryExecutor": {"path": path.name, "tags": ["*"]}},
            },
            source="bench",
        ),
    )
    evaluator = ExecEvaluator(store)
    image = f"bench/{name}:v1.0.0"
    evaluated: list[float] = []
    spawned: list[float] = []
    ratios: list[float] = []
    for _ in range(10):  # warm-up
        await evaluator.evaluate(Request.new(image=image, resource_list=data))
        await direct(path, data)
    for _ in range(rounds):
        round_eval: list[float] = []
        round_spawn: list[float] = []
        for i in range(calls // rounds):
            for which in ("eval", "spawn") if i % 2 == 0 else ("spawn", "eval"):
                start = time.perf_counter()
                if which == "eval":
                    out = (
                        await evaluator.evaluate(Request.new(image=image, resource_list=data))
                    ).resource_list
                    round_eval.append(time.perf_counter() - start)
                else:
                    out = await direct(path, data)
                    round_spawn.append(time.perf_counter() - start)
                assert out == data
        ratios.append(statistics.median(round_eval) / statistics.median(round_spawn))
        evaluated += round_eval
        spawned += round_spawn
    return {
        "eval_p50_ms": statistics.median(evaluated) * 1e3,
        "eval_p99_ms": quantile(evaluated, 0.99) * 1e3,
        "spawn_p50_ms": statistics.median(spawned) * 1e3,
        "spawn_p99_ms": quantile(spawned, 0.99) * 1e3,
        "ratio_p50": statistics.median(evaluated) / statistics.median(spawned),
        "ratio_min_round": min(ratios),
        "ratio_max_round": max(ratios),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per path and program")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data = payload()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="krm-bench-") as tmp:
        for name, body in PROGRAMS.items():
            path = Path(tmp) / f"echo-{name}"
            path.write_text(body)
            path.chmod(0o755)
            results[name] = await measure(name, path, data, calls=args.calls, rounds=args.rounds)
    print(f"trivial function, {len(data)}-byte ResourceList, {args.calls} calls per path")
    print(
        f"{'program':8} {'eval p50':>9} {'spawn p50':>10} {'eval p99':>9} {'spawn p99':>10} "
        f"{'p50 ratio':>10}  per round"
    )
    for name, r in results.items():
        met = "met" if r["ratio_p50"] <= TARGET else "MISSED"
        print(
            f"{name:8} {r['eval_p50_ms']:8.2f}ms {r['spawn_p50_ms']:9.2f}ms {r['eval_p99_ms']:8.2f}ms "
            f"{r['spawn_p99_ms']:9.2f}ms {r['ratio_p50']:9.2f}×  "
            f"{r['ratio_min_round']:.2f}–{r['ratio_max_round']:.2f}"
            f"  target ≤ {TARGET}×: {met}"
        )
    print(json.dumps({"bench": "krm-exec", "target": TARGET, "results": results}))


if __name__ == "__main__":
    asyncio.run(main())
