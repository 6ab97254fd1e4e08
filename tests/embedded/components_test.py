"""The state of each component read from the platform's record: restarting only while a running
supervisor starts it again (until it serves), down otherwise; and the `--wait` line that names
the component a Pending Run waits for."""

from __future__ import annotations

import asyncio
import io
import subprocess
from pathlib import Path

from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.cli import components
from kruntimes.cli.components import Restarting
from kruntimes.cli.output import Progress
from tests.embedded.platform_support import sleeper
from tests.support.waiting import eventually


def _gone_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait(timeout=30)
    return done.pid


def _states(path: Path) -> dict[str, components.ComponentState]:
    return {s.name: s for s in components.states(components.read(path))}


def test_a_dead_component_is_restarting_while_its_supervisor_runs_and_down_once_it_is_gone(
    tmp_path: Path,
) -> None:
    record = tmp_path / components.RECORD_FILE
    dead = _gone_pid()
    with sleeper() as supervisor, sleeper() as gateway:
        components.write(
            record,
            pid=supervisor.pid,
            components={"gateway": gateway.pid, "worker": dead},
            restarting={"worker": Restarting(2, "exited with code 1: ValueError: bad")},
        )
        states = _states(record)
        assert [s.name for s in states.values()] == ["platform", "temporal", "front", "gateway", "worker"]
        assert states["platform"].state == "running" and states["gateway"].state == "running"
        assert states["temporal"].state == "down", "never recorded: down"
        assert states["worker"].describe() == (
            "the worker is restarting (attempt 2; exited with code 1: ValueError: bad)"
        )
        supervisor.kill()
        supervisor.wait(timeout=30)
        states = _states(record)
        assert states["platform"].state == "down" and states["worker"].state == "down"
        assert states["gateway"].state == "running", "what a dead supervisor left still runs"
    assert components.not_running(tmp_path) == [
        components.ComponentState("gateway", "down", gateway.pid),
        components.ComponentState("worker", "down", dead),
    ]


def test_a_component_started_again_is_restarting_until_it_serves(tmp_path: Path) -> None:
    record = tmp_path / components.RECORD_FILE
    with sleeper() as supervisor, sleeper() as worker:
        components.write(
            record,
            pid=supervisor.pid,
            components={"worker": worker.pid},
            restarting={"worker": Restarting(1, "exited with code -9")},
        )
        assert _states(record)["worker"].state == "restarting"
        components.write(record, pid=supervisor.pid, components={"worker": worker.pid})
        assert _states(record)["worker"].state == "running"


def test_no_record_means_no_embedded_platform_to_blame(tmp_path: Path) -> None:
    assert components.not_running(tmp_path) == []


async def test_a_pending_run_waiting_for_missing_components_names_them(tmp_path: Path) -> None:
    stream = io.StringIO()
    progress = Progress(stream, label="run/a", clock=lambda: 5.0)
    progress(RunStatus(phase=RunPhase.Pending, message="waiting for capacity"))
    with sleeper() as supervisor:
        components.write(tmp_path / components.RECORD_FILE, pid=supervisor.pid, components={})
        naming = asyncio.ensure_future(
            components.name_what_is_missing(progress, str(tmp_path), after_s=0, every_s=0.01)
        )
        try:
            await eventually(lambda: stream.getvalue().count("\n") >= 2, what="the missing component named")
        finally:
            naming.cancel()
    assert stream.getvalue().splitlines()[:2] == [
        "run/a: Pending (0.0s) - waiting for capacity",
        "run/a: Pending (0.0s) - the gateway is down; the worker is down: the Run waits for it"
        " (`krt status` shows the platform)",
    ]
