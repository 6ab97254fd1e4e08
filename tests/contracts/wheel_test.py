"""The wheel installs one import root, `kruntimes`, holding every package of the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The repository folders linked into the package, each a package of the wheel.
LINKED = ("workflows", "activities", "workers", "gateway", "runtime", "krm")
# Tracked files the build reads; copied so the build writes nothing into the working tree.
SOURCES = ("pyproject.toml", "README.md", "kruntimes", *LINKED)


def _build_wheel(out: Path) -> Path:
    tree = out / "src"
    tree.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tree / name, follow_symlinks=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("kruntimes-*.whl")
    return wheel


def test_the_wheel_has_one_top_level_name_and_every_package_under_it(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"kruntimes"}
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["kruntimes"]
    for package in LINKED:
        assert f"kruntimes/{package}/__init__.py" in names, package
    assert "kruntimes/gateway/openapi.json" in names
    assert "kruntimes/krm/_launcher.py" in names


def test_the_installed_wheel_imports_from_its_own_files_only(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")} == {"kruntimes", "bin"}
    # The installed copy, not the repository's, answers every import (cwd is not the repository).
    code = (
        f"import sys; sys.path.insert(0, {str(target)!r});"
        "import kruntimes.workers.krt, kruntimes.workflows.run, kruntimes.runtime.zygote, kruntimes.krm.process;"
        "mods = [m for n, m in sys.modules.items() if n.startswith('kruntimes') and getattr(m, '__file__', None)];"
        f"print(all(m.__file__.startswith({str(target)!r}) for m in mods), len(mods) > 20)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["True", "True"]
