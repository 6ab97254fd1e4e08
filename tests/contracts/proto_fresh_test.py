"""The committed stubs are exactly what `make proto` generates from proto/."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    # In a process of its own: protoc forks its plugins, and forking this test process (whose
    # gRPC threads other tests started) can crash the child.
    done = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    fresh_root = tmp_path / "kruntimes" / "rpc"
    committed_root = ROOT / "kruntimes" / "rpc"
    fresh = {p.relative_to(fresh_root) for p in fresh_root.rglob("*_pb2*")}
    committed = {p.relative_to(committed_root) for p in committed_root.rglob("*_pb2*")}
    assert fresh, "no stubs generated"
    assert fresh == committed, "stub files differ: run `make proto` and commit"
    stale = [
        str(p) for p in sorted(fresh) if not filecmp.cmp(fresh_root / p, committed_root / p, shallow=False)
    ]
    assert not stale, f"stale stubs (run `make proto` and commit): {stale}"
