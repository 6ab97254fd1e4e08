"""`krt run create --concurrency N --queue N --queue-timeout S` make a function Run's
mode.function, and `krt run describe` says them; no platform is contacted."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kruntimes.api.status import RunStatus
from kruntimes.cli.commands import manifest_from_flags
from kruntimes.cli.output import describe
from kruntimes.cli.parser import UsageError, parse
from kruntimes.sdk.client import RunObject
from kruntimes.sdk.runs import prepare

CREATE = ["run", "create", "x", "--runtime", "python", "--source", "src", "--handler", "main:handle"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()


def _mode(text: str) -> str:
    run = manifest_from_flags(parse([*CREATE, *text.split()]), stdin=io.StringIO())
    shown = describe(RunObject.of(prepare(run), RunStatus(), created=datetime.now(UTC)), [])
    (line,) = [line for line in shown.splitlines() if line.startswith("Mode:")]
    return line.split(":", 1)[1].strip()


def test_the_flags_make_mode_function_and_describe_says_them() -> None:
    run = manifest_from_flags(
        parse([*CREATE, "--concurrency", "4", "--queue", "10", "--queue-timeout", "2.5"]), stdin=io.StringIO()
    )
    fn = run.spec.mode.function
    assert fn is not None and (fn.concurrency, fn.queue, fn.queueTimeoutSeconds) == (4, 10, 2.5)
    assert _mode("--concurrency 4 --queue 10 --queue-timeout 2.5") == (
        "function (concurrency 4, queue 10, waiting at most 2.5 s)"
    )
    assert _mode("--idle-timeout 60 --concurrency 2") == "function (idle timeout 60 s, concurrency 2)"
    assert _mode("") == "function"  # unset stays unset


def test_the_flags_are_refused_for_a_task_and_past_their_bounds() -> None:
    with pytest.raises(UsageError, match="apply to --mode function only"):
        manifest_from_flags(parse([*CREATE, "--mode", "task", "--queue", "1"]), stdin=io.StringIO())
    with pytest.raises(ValueError, match="less than or equal to 1000"):
        manifest_from_flags(parse([*CREATE, "--concurrency", "1001"]), stdin=io.StringIO())
    with pytest.raises(ValueError, match="queueTimeoutSeconds needs a queue"):
        manifest_from_flags(parse([*CREATE, "--queue-timeout", "3"]), stdin=io.StringIO())
