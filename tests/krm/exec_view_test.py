"""`krt fn eval --exec` shows the function, read-only, what its command names (the program, each
argument that is an existing path with its directory) and nothing else of the caller's private
files; a function that fails on a file hidden from it is told so, with where to read why.

The function is a script kept under a private directory (mode 0700, as a home is), importing a
module beside it, run through `python SCRIPT` as root runs it: in the sandbox, as another uid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.isolation import needing

isolation_needed = needing(os.geteuid() == 0, "the exec sandbox's own uid needs root")

RESOURCE = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
LABEL = """
import sys
import helper
import yaml
data = yaml.safe_load(sys.stdin)
try:
    open({notes!r}).read()
    seen = "read"
except OSError as e:
    seen = type(e).__name__
try:
    open({script!r}, "a")
    wrote = "wrote"
except OSError as e:
    wrote = type(e).__name__
data["results"] = [{{"severity": "info", "message": f"{{helper.SAY}} notes={{seen}} own={{wrote}}"}}]
yaml.safe_dump(data, sys.stdout)
"""
NEEDS_NOTES = "import sys\nsys.stdin.read()\nprint(open({notes!r}).read())\n"


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A directory only its owner may enter, holding a function and, beside it, a private file."""
    root = tmp_path / "private"
    (root / "fns").mkdir(parents=True)
    root.chmod(0o700)
    (root / "notes.txt").write_text("the caller's own notes")
    (root / "notes.txt").chmod(0o644)
    (root / "fns" / "helper.py").write_text("SAY = 'helper imported'\n")
    return root


def _eval(command: str, *, cwd: Path) -> subprocess.CompletedProcess[str]:
    krt = Path(sys.executable).with_name("krt")
    return subprocess.run(
        [str(krt), "fn", "eval", "-", "--exec", command],
        input=RESOURCE,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_script_under_a_private_directory_runs_with_its_module_and_sees_nothing_else(
    private: Path, relative: bool
) -> None:
    script = private / "fns" / "label.py"
    script.write_text(LABEL.format(notes=str(private / "notes.txt"), script=str(script)))
    named = "fns/label.py" if relative else str(script)
    done = _eval(f"{sys.executable} {named}", cwd=private)
    assert done.returncode == 0, done.stderr
    assert "[PASS]" in done.stderr
    assert "helper imported" in done.stderr, "the script's directory, with its module, is shown"
    assert "notes=FileNotFoundError" in done.stderr, "nothing else of the private directory"
    assert "own=OSError" in done.stderr or "own=PermissionError" in done.stderr, "read-only"
    assert "name: c" in done.stdout


def test_a_function_failing_on_a_file_hidden_from_it_is_told_so(private: Path) -> None:
    script = private / "fns" / "needs_notes.py"
    script.write_text(NEEDS_NOTES.format(notes=str(private / "notes.txt")))
    done = _eval(f"{sys.executable} {script}", cwd=private)
    assert done.returncode != 0
    assert "FunctionFailed" in done.stderr
    assert f"it names {private / 'notes.txt'}, which its sandbox hides from it" in done.stderr, done.stderr
    assert "docs/security.md" in done.stderr
