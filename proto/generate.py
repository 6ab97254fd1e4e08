"""Generate the Python stubs for the contracts in proto/ (run by `make proto`).

The stubs land under `kruntimes/rpc/` (the proto package path), are committed, and are checked
fresh by tests/contracts. `--out DIR` writes them elsewhere (the freshness test uses it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.glob("kruntimes/**/*.proto"))


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency; imported here so the module loads without it

    plugin = Path(sys.executable).with_name("protoc-gen-mypy")
    grpc_plugin = Path(sys.executable).with_name("protoc-gen-mypy_grpc")
    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"--plugin=protoc-gen-mypy_grpc={grpc_plugin}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = sorted(out.glob("kruntimes/rpc/**/*_pb2*"))
    for package in {path.parent for path in written}:
        while package != out / "kruntimes":  # kruntimes/ itself is a real package
            (package / "__init__.py").touch()
            package = package.parent
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT)
    ns = parser.parse_args()
    target = ns.out / "kruntimes" / "rpc"
    if ns.out == REPO_ROOT and target.exists():
        for stale in target.rglob("*_pb2*"):
            stale.unlink()
    for path in generate(ns.out):
        print(path.relative_to(ns.out))
    shutil.rmtree(ns.out / "kruntimes" / "rpc" / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
