"""YAML aliases count as what they expand to, while the YAML is read: an alias bomb in a package
or in a function's output is refused before it is expanded, in a process whose peak memory stays
a small multiple of the bound (each run in a child process of its own, which reports its peak)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Request
from kruntimes.krm.limits import MAX_RESOURCE_LIST_BYTES
from kruntimes.krm.resources import ExpansionTooLarge, expanded_size, load_all, output_results

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
# what a `krt fn eval` process may take at its peak: the interpreter and its imports, and a few
# times the bounded input and output; an expanded bomb takes hundreds of MiB
PEAK_BOUND_KIB = 64 * MiB // 1024 + 12 * MAX_RESOURCE_LIST_BYTES // 1024


# One string of `size` bytes, anchored once and aliased `times` times.
def _bomb(*, size: int, times: int) -> str:
    head = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bomb}}\ndata:\n  k0: &big {'x' * size}\n"
    return head + "".join(f"  k{i}: *big\n" for i in range(1, times + 1))


def _eval(*argv: str, cwd: Path) -> tuple[int, str, int]:
    """`krt fn eval ARGV` in a child process: its exit code, its stderr, its peak RSS in KiB."""
    peak = cwd / "peak"
    program = (
        "import sys\n"
        "from kruntimes.workers import fn_eval\n"
        "code = fn_eval.main(sys.argv[2:])\n"
        # VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over exec)
        "peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')]\n"
        "open(sys.argv[1], 'w').write(peak[0])\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
    done = subprocess.run(
        [sys.executable, "-c", program, str(peak), *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr, int(peak.read_text())


def test_aliases_are_counted_expanded_and_refused_past_the_bound() -> None:
    small = _bomb(size=1000, times=10)
    assert expanded_size(small, MAX_RESOURCE_LIST_BYTES) > 11 * 1000
    assert load_all(small)[0]["data"]["k10"] == "x" * 1000, "a few aliases are fine"
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    )
    with pytest.raises(ExpansionTooLarge, match=f"more than {MAX_RESOURCE_LIST_BYTES} bytes"):
        load_all(laughs)
    with pytest.raises(ExpansionTooLarge):
        output_results(
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- "
                + laughs.replace("\n", "\n  ")
            ).encode()
        )


def test_an_alias_bomb_package_is_refused_as_input_too_large_within_bounded_memory(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "bomb.yaml").write_text(_bomb(size=2 * MiB, times=200))  # 400 MiB expanded
    code, err, peak_kib = _eval(str(package), "--exec", "/bin/cat", cwd=tmp_path)
    assert code == 1, err
    assert "InputTooLarge: bomb.yaml: its YAML aliases expand it to more than" in err
    assert peak_kib < PEAK_BOUND_KIB, f"peak {peak_kib} KiB"


def test_an_alias_bomb_output_is_refused_as_invalid_output_and_nothing_is_written(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n")
    function = tmp_path / "bomber"
    items = _bomb(size=MiB, times=300).replace("\n", "\n  ")  # 1 MiB written, 300 MiB expanded
    output = f"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- {items}\n"
    function.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.read()\nsys.stdout.write({output!r})\n")
    function.chmod(0o755)
    results = tmp_path / "results"
    code, err, peak_kib = _eval(
        str(package), "--exec", str(function), "--results-dir", str(results), cwd=tmp_path
    )
    assert code == 1, err
    assert "[FAIL]" in err and "InvalidOutput" in err and "aliases expand it to more than" in err
    assert sorted(p.name for p in package.iterdir()) == ["cm.yaml"], "nothing of the output is written"
    assert (package / "cm.yaml").read_text() == "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n"
    assert json.dumps(load_all((results / "results.yaml").read_text())).count("InvalidOutput") >= 1
    assert peak_kib < PEAK_BOUND_KIB, f"peak {peak_kib} KiB"


def test_an_alias_bomb_sent_to_an_evaluator_is_refused_before_any_function_gets_it() -> None:
    """What `krt fn-runner` and the evaluators take: the request itself is refused."""
    item = _bomb(size=MiB, times=10).replace("\n", "\n  ")
    bomb = f"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- {item}\n"
    assert len(load_all(bomb, max_expanded=None)[0]["items"][0]["data"]) == 11
    with pytest.raises(errors.InputTooLarge, match="aliases expand it to more than"):
        Request.new(image="example.com/fn/x:v1", resource_list=bomb.encode())
