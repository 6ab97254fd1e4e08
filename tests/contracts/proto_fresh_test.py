"""The committed stubs are exactly what `make proto` generates from proto/."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["proto_generate"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    generated = _generator().generate(tmp_path)
    assert generated, "no stubs generated"
    committed_root = ROOT / "kruntimes" / "rpc"
    fresh = {p.relative_to(tmp_path / "kruntimes" / "rpc") for p in generated}
    committed = {p.relative_to(committed_root) for p in committed_root.rglob("*_pb2*")}
    assert fresh == committed, "stub files differ: run `make proto` and commit"
    stale = [
        str(p)
        for p in sorted(fresh)
        if not filecmp.cmp(tmp_path / "kruntimes" / "rpc" / p, committed_root / p, shallow=False)
    ]
    assert not stale, f"stale stubs (run `make proto` and commit): {stale}"
