"""KRM function programs used by the tests, written as small Python scripts.

Each is written to a file with the test interpreter in its shebang. `PIDS` names a file the
program appends its pid (and its children's) to, so a test can check by pid that nothing is left.
"""

from __future__ import annotations

import sys
from pathlib import Path

SET_LABELS = """
import sys, yaml
rl = yaml.safe_load(sys.stdin)
labels = ((rl.get("functionConfig") or {}).get("data")) or {}
for item in rl["items"]:
    item.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
print(f"labelled {len(rl['items'])} resources", file=sys.stderr)
yaml.safe_dump(rl, sys.stdout)
"""

VALIDATOR = """
import sys, yaml
rl = yaml.safe_load(sys.stdin)
results = []
for item in rl["items"]:
    meta = item.get("metadata", {})
    if "owner" not in meta.get("labels", {}):
        annotations = meta.get("annotations", {})
        results.append({
            "severity": "error",
            "message": "every resource needs an owner label",
            "resourceRef": {"apiVersion": item["apiVersion"], "kind": item["kind"], "name": meta.get("name", "")},
            "field": {"path": "metadata.labels.owner", "currentValue": None, "proposedValue": "team-a"},
            "file": {"path": annotations.get("config.kubernetes.io/path", ""),
                     "index": int(annotations.get("config.kubernetes.io/index", 0))},
            "tags": {"rule": "owner"},
        })
rl["results"] = results
yaml.safe_dump(rl, sys.stdout)
print("validation failed" if results else "ok", file=sys.stderr)
sys.exit(1 if results else 0)
"""

EXIT_1 = """
import sys
sys.stdin.read()
print("something went wrong", file=sys.stderr)
sys.exit(1)
"""

GARBAGE = """
import sys
sys.stdin.read()
print("this is [not: a ResourceList")
"""

ECHO = """
import sys
sys.stdout.write(sys.stdin.read())
"""

NOISY = """
import sys
data = sys.stdin.read()
sys.stderr.write("x" * 200000)
sys.stdout.write(data)
"""

SLEEPER = """
import os, sys, time
with open({pids!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
time.sleep(60)
"""

# Ignores SIGTERM and leaves a child (also ignoring it) in its process group.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
with open({pids!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n{{child}}\\n")
time.sleep(60)
"""


# Answers and exits, leaving a child in its process group that holds its stdout open.
LEAVER = """
import os, sys, time
data = sys.stdin.read()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
with open({pids!r}, "a") as f:
    f.write(f"{{child}}\\n")
sys.stdout.write(data)
"""


def write(directory: Path, name: str, body: str, **fmt: str) -> Path:
    path = directory / name
    path.write_text(f"#!{sys.executable}\n" + (body.format(**fmt) if fmt else body))
    path.chmod(0o755)
    return path


def pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []
