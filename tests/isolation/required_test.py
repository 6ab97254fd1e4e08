"""A test of the isolation core that this machine cannot run skips, printed in the summary, unless
the run requires isolation (KRT_REQUIRE_ISOLATION=1, as .ci/run sets): it fails then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.isolation import REQUIRE

REPO = Path(__file__).resolve().parents[2]
NEEDING = """
from tests.support.isolation import needing, require_or_skip

isolation_needed = needing(False, "no PID namespaces on this machine")

def test_needs_namespaces():
    pass
"""
REQUIRING = """
from tests.support.isolation import require_or_skip

def test_needs_a_cgroup():
    require_or_skip("no writable cgroup on this machine")
"""


def outcome(tmp_path: Path, source: str, *, required: str | None) -> str:
    """The last line of pytest's report (with skip reasons) on a module of `source`."""
    test = tmp_path / "lacking_test.py"
    test.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE}
    env["PYTHONPATH"] = str(REPO)
    if required is not None:
        env[REQUIRE] = required
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


@pytest.mark.parametrize("source", [NEEDING, REQUIRING], ids=["module", "test"])
def test_a_missing_mechanism_is_a_skip_with_its_reason_locally(tmp_path: Path, source: str) -> None:
    for required in (None, "0"):
        report = outcome(tmp_path, source, required=required)
        assert "1 skipped" in report and "failed" not in report, report
        assert "SKIPPED" in report and "on this machine" in report, "the reason is in the summary"


@pytest.mark.parametrize("source", [NEEDING, REQUIRING], ids=["module", "test"])
def test_a_missing_mechanism_fails_when_isolation_is_required(tmp_path: Path, source: str) -> None:
    report = outcome(tmp_path, source, required="1")
    assert "skipped" not in report, report
    assert f"{REQUIRE} is set, but" in report and "on this machine" in report, report
    assert ("1 failed" in report) or ("1 error" in report), report
