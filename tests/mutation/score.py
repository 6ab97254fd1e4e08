"""The score of `make mutate` per module: what mutmut recorded under mutants/, one line each.

`python -m tests.mutation.score [--survivors]`; the modules are those `[tool.mutmut] only_mutate`
names (docs/mutation.md). Timeouts count as detected: the tests did not pass with the mutant.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

MUTANTS = Path("mutants")

# mutmut's exit codes (mutmut.stats.status_by_exit_code), named as docs/mutation.md names them
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, 24, -24, 152, 255}
NO_TESTS = {5, 33}


def status(exit_code: int | None) -> str:
    if exit_code in KILLED:
        return "killed"
    if exit_code in SURVIVED:
        return "survived"
    if exit_code in TIMEOUT:
        return "timeout"
    if exit_code in NO_TESTS:
        return "no tests"
    if exit_code is None:
        return "not run"
    return "other"


def results(root: Path) -> dict[str, dict[str, str]]:
    """Each mutated module's mutants and their status, by module path (kruntimes/wire/frames.py)."""
    by_module: dict[str, dict[str, str]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        recorded = json.loads(meta.read_text())["exit_code_by_key"]
        if recorded:
            module = str(meta.relative_to(root))[: -len(".meta")]
            by_module[module] = {name: status(code) for name, code in recorded.items()}
    return by_module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--survivors", action="store_true", help="also list every mutant not detected")
    args = parser.parse_args()
    by_module = results(MUTANTS)
    if not by_module:
        print("no results under mutants/: run `make mutate` first", file=sys.stderr)
        return 1
    columns = ("killed", "survived", "timeout", "no tests", "not run", "other")
    print(f"{'module':44} {'total':>5} " + " ".join(f"{c:>8}" for c in columns) + "  score")
    for module, statuses in by_module.items():
        counts = Counter(statuses.values())
        run = sum(counts[c] for c in columns if c != "not run")
        detected = counts["killed"] + counts["timeout"]
        score = f"{100 * detected / run:5.1f}%" if run else "    -"
        print(f"{module:44} {len(statuses):5} " + " ".join(f"{counts[c]:8}" for c in columns) + f"  {score}")
    if args.survivors:
        for statuses in by_module.values():
            for name, found in sorted(statuses.items()):
                if found not in {"killed", "timeout", "not run"}:
                    print(f"{found:9} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
