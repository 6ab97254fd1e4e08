"""`krt down` when the platform's supervisor is gone: the components it left running are stopped,
and a recorded pid that is another process's now is never signalled."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.cli.components import start_time
from kruntimes.workers.embedded import commands, supervise
from kruntimes.workers.embedded.layout import Layout, recorded_components, recorded_pid, write_up

# Says "ready" once its SIGTERM disposition is set, then sleeps (at most 5 minutes).
SLEEPER = "import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(300)\n"


@contextlib.contextmanager
def sleeper(*, ignore_term: bool = False) -> Iterator[subprocess.Popen[str]]:
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER.format(setup=setup)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as the supervisor starts its components
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _gone_pid() -> int:
    """The pid of a process that ran and was reaped (it may be given to another one later)."""
    done = subprocess.Popen(["true"])
    done.wait(timeout=30)
    return done.pid


def test_down_stops_the_components_a_dead_supervisor_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(supervise, "STOP_TIMEOUT_S", 2.0)
    layout = Layout(tmp_path)
    with sleeper() as temporal, sleeper(ignore_term=True) as worker:
        write_up(layout, pid=_gone_pid(), components={"temporal": temporal.pid, "worker": worker.pid})
        assert recorded_pid(layout) == 0, "the supervisor is gone"
        assert commands.down(layout) == 0
        assert temporal.wait(timeout=30) == -signal.SIGTERM
        assert worker.wait(timeout=30) == -signal.SIGKILL, "one that ignores SIGTERM is killed"
    out = capsys.readouterr().out
    assert out.startswith(f"kruntimes is not running from {tmp_path}") and "stopped 2 component(s)" in out


def test_a_recorded_pid_given_to_another_process_is_never_signalled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = Layout(tmp_path)
    with sleeper() as stranger, sleeper() as other:
        # up.json of a platform long gone, whose pids the machine has since given to these two
        started = {str(p.pid): (start_time(p.pid) or 0) + 1 for p in (stranger, other)}
        record = {"pid": stranger.pid, "components": {"gateway": other.pid}, "started": started}
        layout.up.write_text(json.dumps(record))
        assert recorded_pid(layout) == 0 and recorded_components(layout) == {}
        assert commands.down(layout) == 0
        assert stranger.poll() is None and other.poll() is None, "neither was signalled"
    assert capsys.readouterr().out == f"kruntimes is not running from {tmp_path}\n"


def test_the_running_platform_and_its_components_are_recognised_by_pid_and_start_time(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    with sleeper() as platform, sleeper() as gateway:
        write_up(layout, pid=platform.pid, components={"gateway": gateway.pid})
        assert recorded_pid(layout) == platform.pid
        assert supervise.running(layout) == platform.pid
        assert recorded_components(layout) == {"gateway": gateway.pid}
        gateway.kill()
        gateway.wait(timeout=30)
        assert recorded_components(layout) == {}, "a component that ended is not one any more"
