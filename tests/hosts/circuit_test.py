"""The breaker of each (provider, runtime) and what every provider operation reports.

A real process provider whose host command exits 1 until the test lets it start real hosts:
its circuit opens after N failed creates, fails fast with CircuitOpen while open (the command is
not run), lets one trial through once the (injected) clock passed the delay, and closes when a
trial succeeds. Its operations' metrics go through a real Temporal runtime's meter, and their log
lines and failures carry the scale-out request's id.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.runtime import BufferedMetricUpdate, MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.host_manager import HostActivities
from kruntimes.activities.hosts import ProcessProvider
from kruntimes.activities.hosts.base import HostManager
from kruntimes.activities.hosts.circuit import CircuitBreakers, CircuitState
from kruntimes.activities.hosts.observe import CIRCUIT, DURATION, OPERATIONS
from kruntimes.config.runtimes import ProviderCircuitConfig, parse_config
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderFailure
from kruntimes.pki import HostIssuer
from tests.hosts.conftest import spec

OPEN_S = 30.0


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def flaky_python(directory: Path) -> tuple[Path, Path, Path]:
    """A host command that exits 1 (noting each run) until `works` exists, then runs the real
    Python: the script, its run log and the file that makes it work."""
    directory.mkdir(parents=True, exist_ok=True)
    runs, works = directory / "runs", directory / "works"
    script = directory / "python.sh"
    script.write_text(
        f'#!/bin/sh\necho run >> "{runs}"\n[ -e "{works}" ] && exec "{sys.executable}" "$@"\n'
        'echo "no python today" >&2\nexit 1\n'
    )
    script.chmod(0o755)
    return script, runs, works


def runs_of(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def scale_out_env(request_id: str) -> ActivityEnvironment:
    """An activity environment whose activity a ScaleOutWorkflow of `request_id` started."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, workflow_type="ScaleOutWorkflow", workflow_id=f"scaleout/python/{request_id}"
    )
    return env


async def failed_create(
    activities: HostActivities, state_dir: Path, request_id: str, host_id: str
) -> ProviderFailure:
    with pytest.raises(ApplicationError) as caught:
        await scale_out_env(request_id).run(activities.create_host, spec(state_dir, host_id))
    [details] = caught.value.details
    failure = ProviderFailure.model_validate(details)
    assert caught.value.type == failure.reason
    assert f"scale-out request {request_id}" in caught.value.message, "the id is on every failure"
    assert failure.requestId == request_id
    return failure


def updates_of(updates: Sequence[BufferedMetricUpdate], name: str) -> list[tuple[dict[str, object], object]]:
    return [(dict(u.attributes), u.value) for u in updates if u.metric.name == name]


async def test_a_provider_that_fails_every_create_opens_its_circuit_fails_fast_and_recovers(
    tmp_path: Path, state_dir: Path, issuer: HostIssuer, caplog: pytest.LogCaptureFixture
) -> None:
    script, runs, works = flaky_python(tmp_path / "bin")
    clock = Clock()
    breakers = CircuitBreakers(ProviderCircuitConfig(failures=3, openSeconds=OPEN_S), clock=clock)
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    manager = HostManager(
        [ProcessProvider(python=str(script), issuer=issuer, start_timeout_s=10)],
        meter=runtime.metric_meter,
        breakers=breakers,
    )
    activities = HostActivities(manager)
    caplog.set_level(logging.INFO, logger="kruntimes.activities.hosts.observe")

    # N creates call the provider and fail; the circuit opens at the Nth
    for n in range(3):
        failure = await failed_create(activities, state_dir, f"req-{n}", f"python-{n}")
        assert failure.reason == FailureReason.OperationFailed
        assert "exited with status 1" in failure.message
        assert runs_of(runs) == n + 1
    assert breakers.state("process", "python") is CircuitState.Open

    # open: a create fails at once, the host command is not run
    failure = await failed_create(activities, state_dir, "req-open", "python-3")
    assert (failure.reason, failure.provider, failure.host) == (
        FailureReason.CircuitOpen,
        "process",
        "python-3",
    )
    assert "3 creates of runtime python failed in a row" in failure.message
    # and says why the last one failed: the Run it refuses is told the cause, not only the circuit
    assert "the last: OperationFailed:" in failure.message and "exited with status 1" in failure.message
    assert runs_of(runs) == 3

    # the delay passed: one trial goes to the provider; it fails, and the circuit opens again
    clock.now += OPEN_S
    assert breakers.state("process", "python") is CircuitState.HalfOpen
    failure = await failed_create(activities, state_dir, "req-trial", "python-4")
    assert failure.reason == FailureReason.OperationFailed and runs_of(runs) == 4
    assert breakers.state("process", "python") is CircuitState.Open
    assert (
        await failed_create(activities, state_dir, "req-again", "python-5")
    ).reason == FailureReason.CircuitOpen
    assert runs_of(runs) == 4

    # the provider works again: the next trial starts a real host, and the circuit closes
    works.touch()
    clock.now += OPEN_S
    created = await scale_out_env("req-ok").run(activities.create_host, spec(state_dir, "python-6"))
    assert created.pid is not None and runs_of(runs) == 5
    assert breakers.state("process", "python") is CircuitState.Closed

    # every operation was counted and timed by provider, runtime, operation and result; the
    # circuit's state is a gauge (no host nor request label: their series would never end)
    updates = buffer.retrieve_updates()
    counted = updates_of(updates, OPERATIONS)
    results = [str(attrs["result"]) for attrs, _ in counted]
    assert results == ["OperationFailed"] * 3 + ["CircuitOpen", "OperationFailed", "CircuitOpen", "Succeeded"]
    assert {(a["operation"], a["provider"], a["runtime"]) for a, _ in counted} == {
        ("Create", "process", "python")
    }
    assert len(updates_of(updates, DURATION)) == len(counted)
    assert [v for _, v in updates_of(updates, CIRCUIT)][-1] == int(CircuitState.Closed)
    assert int(CircuitState.Open) in [v for _, v in updates_of(updates, CIRCUIT)]

    # one structured log line per operation, with the correlation id (the scale-out request)
    lines = [r for r in caplog.records if r.name == "kruntimes.activities.hosts.observe"]
    assert [r.correlationId for r in lines] == [  # type: ignore[attr-defined]
        "req-0",
        "req-1",
        "req-2",
        "req-open",
        "req-trial",
        "req-again",
        "req-ok",
    ]
    ok = lines[-1]
    assert (ok.levelno, ok.provider, ok.runtime, ok.host, ok.result) == (  # type: ignore[attr-defined]
        logging.INFO,
        "process",
        "python",
        "python-6",
        "Succeeded",
    )
    assert ok.requestId == "req-ok" and ok.workflowId == "scaleout/python/req-ok"  # type: ignore[attr-defined]
    assert ok.durationMs > 0  # type: ignore[attr-defined]
    failed = lines[0]
    assert failed.levelno == logging.WARNING and "exited with status 1" in failed.failure  # type: ignore[attr-defined]


def test_a_half_open_circuit_lets_one_trial_through_at_a_time() -> None:
    clock = Clock()
    breakers = CircuitBreakers(ProviderCircuitConfig(failures=2, openSeconds=OPEN_S), clock=clock)
    for _ in range(2):
        assert breakers.admit("p", "r").open_for is None
        breakers.failed("p", "r", trial=False)
    assert breakers.admit("p", "r").open_for == OPEN_S
    assert breakers.admit("p", "other").open_for is None, "each runtime has its own circuit"

    clock.now += OPEN_S
    trial = breakers.admit("p", "r")
    assert trial.trial and trial.open_for is None
    assert breakers.admit("p", "r").open_for == 0.0, "a second create waits for the trial's verdict"
    breakers.abandoned("p", "r", trial=True)  # the trial was cancelled: the next create is one
    assert breakers.admit("p", "r").trial
    breakers.succeeded("p", "r")
    assert breakers.state("p", "r") is CircuitState.Closed
    breakers.failed("p", "r", trial=False)
    assert breakers.state("p", "r") is CircuitState.Closed, "a success starts the count again"


async def test_a_failure_outside_a_scale_out_names_the_workflow_that_asked(
    state_dir: Path, issuer: HostIssuer
) -> None:
    manager = HostManager([ProcessProvider(python="/bin/false", issuer=issuer)])
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_type="HostWorkflow", workflow_id="host/python/python-0")
    with pytest.raises(ProviderError) as caught:
        await env.run(manager.create, spec(state_dir))
    assert caught.value.failure.requestId is None
    assert caught.value.failure.message.endswith("(workflow host/python/python-0)")


def test_the_breaker_setting_has_a_default_and_bounds() -> None:
    assert parse_config({}).providerCircuit == ProviderCircuitConfig(failures=5, openSeconds=30.0)
    config = parse_config({"providerCircuit": {"failures": 2, "openSeconds": 5}})
    assert (config.providerCircuit.failures, config.providerCircuit.openSeconds) == (2, 5.0)
    with pytest.raises(ValueError, match="providerCircuit.failures"):
        parse_config({"providerCircuit": {"failures": 0}})
