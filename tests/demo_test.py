"""`make demo` is the README's promise: it must run to the end and exit 0."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_deploys_and_invokes_both_examples() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.demo"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "'greeting': 'hello, kruntimes'" in done.stdout
    assert "'greeting': 'hello from bash'" in done.stdout
    assert "demo finished" in done.stdout
