"""`krt down` when the platform's supervisor is gone: the components it left running are stopped,
a dev server on its database that no record names too, and a recorded pid that is another
process's now is never signalled."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from kruntimes.cli.components import start_time
from kruntimes.workers.embedded import commands, supervise
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout, make_root, recorded_components, recorded_pid, write_up
from tests.embedded.platform_support import sleeper


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


def test_a_dev_server_on_the_state_dirs_database_that_no_record_names_is_refused_then_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = Layout(tmp_path)
    make_root(layout)
    database = layout.temporal / "temporal.db"
    # what a supervisor killed while its dev server started leaves: that server, in no record
    with (
        sleeper(argv=("--db-filename", str(database))) as server,
        sleeper(argv=("--db-filename", "x.db")) as other,
    ):
        with pytest.raises(PlatformError) as refused:
            supervise.refuse_if_running(layout)
        assert f"a dev server on {database} (pid {server.pid})" in str(refused.value)
        assert f"stop them with `KRT_STATE_DIR={tmp_path} krt down`" in str(refused.value)
        assert commands.down(layout) == 0
        assert server.wait(timeout=30) == -signal.SIGTERM
        assert other.poll() is None, "a process on another database is not this platform's"
    assert "stopped 1 component(s)" in capsys.readouterr().out
    supervise.refuse_if_running(layout)  # nothing runs from it any more
