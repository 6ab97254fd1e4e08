"""What `krt` prints: tables with kubectl's layout, Run objects as JSON/YAML, wait progress."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import Condition, RunStatus
from kruntimes.cli.output import Progress, age, describe, hosts_table, render, run_list_document, runs_table
from kruntimes.decisions.scheduling.model import Host, HostState
from kruntimes.sdk.client import HostView, RunObject
from kruntimes.sdk.events import RunEvent
from kruntimes.sdk.runs import prepare
from tests.sdk.stack import manifest

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _run(
    name: str, phase: RunPhase = RunPhase.Ready, host: str | None = "python-0", **spec: Any
) -> RunObject:
    run = prepare(Run.from_dict(manifest(name, **spec)))
    status = RunStatus(phase=phase, attempt=1, assignedHost=host, assignedHostUID=host and "uid")
    if phase is RunPhase.Ready:
        ready = Condition.ready(True, reason="FunctionRegistered", message="registered", at=NOW)
        status = status.with_condition(ready)
    return RunObject.of(run, status, created=NOW - timedelta(seconds=75))


def test_the_run_table_has_kubectl_columns_aligned() -> None:
    text = runs_table([_run("a"), _run("longer-name", RunPhase.Pending, None)], now=NOW)
    assert text.splitlines() == [
        "NAME          NAMESPACE   RUNTIME   MODE       PHASE     REASON               ATTEMPT   HOST       AGE",
        "a             default     python    function   Ready     FunctionRegistered   1         python-0   75s",
        "longer-name   default     python    function   Pending   <none>               1         <none>     75s",
    ]


def test_the_wide_run_table_adds_recoveries_tenant_uid_and_endpoint() -> None:
    run = _run("a")
    header, row = runs_table([run], now=NOW, wide=True).splitlines()
    assert header.split()[-5:] == ["AGE", "RECOVERIES", "TENANT", "UID", "ENDPOINT"]
    assert row.split()[-4:] == ["0", "<none>", run.uid, "<none>"]


def test_describe_shows_status_conditions_and_events_but_no_secret_value() -> None:
    run = _run(
        "a",
        env={"PASSWORD": "hunter2"},
        mode={"task": {"input": {"token": "s3cret"}}},
    )
    events = [
        RunEvent(NOW - timedelta(seconds=70), "Phase", "Scheduled", "", "python-0", 1),
        RunEvent(NOW - timedelta(seconds=60), "HostCallFailed", "HandlerLoadFailed", "register on python-0"),
    ]
    text = describe(run, events, now=NOW)
    fields = dict(line.split(":", 1) for line in text.splitlines() if line[:1].isupper() and ":" in line)
    assert fields["Name"].strip() == "a" and fields["Phase"].strip() == "Ready"
    assert fields["Reason"].strip() == "FunctionRegistered"
    assert fields["Host"].strip() == "python-0" and fields["Attempt"].strip() == "1 of 3"
    assert fields["Env"].strip() == "PASSWORD (values not shown)"
    assert fields["Mode"].strip().startswith("task (input: ")
    assert "hunter2" not in text and "s3cret" not in text
    conditions, events_part = text.split("Conditions:\n")[1].split("Events:\n")
    assert conditions.split("\n")[1].split()[:3] == ["Ready", "True", "FunctionRegistered"]
    rows = [line.split() for line in events_part.strip().splitlines()]
    assert rows[0] == ["AGE", "KIND", "REASON", "HOST", "ATTEMPT", "MESSAGE"]
    assert rows[1] == ["70s", "Phase", "Scheduled", "python-0", "1", "-"]
    assert rows[2][:3] == ["60s", "HostCallFailed", "HandlerLoadFailed"]


def test_age_counts_in_the_largest_unit_held_twice() -> None:
    def ago(seconds: float) -> str:
        return age(NOW - timedelta(seconds=seconds), now=NOW)

    assert [ago(5), ago(119), ago(120), ago(7199), ago(7200), ago(3 * 86400)] == [
        "5s",
        "119s",
        "2m",
        "119m",
        "2h",
        "3d",
    ]
    assert age(None) == "<none>"


def test_json_and_yaml_print_the_run_object() -> None:
    run = _run("a")
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        document = load(render(run.manifest(), output))
        assert list(document) == ["apiVersion", "kind", "metadata", "spec", "status"]
        assert set(document["metadata"]) >= {"name", "namespace", "uid"}
        assert document["status"]["phase"] == "Ready"
    listing = run_list_document([run])
    assert listing["kind"] == "RunList" and listing["items"][0]["metadata"]["name"] == "a"


def test_the_hosts_table_shows_used_of_capacity() -> None:
    host = Host(
        hostId="python-0", hostUid="u", runtime="python", address="127.0.0.1:5000", state=HostState.Ready,
        capacity=8, createdAt=NOW, assignedAt=NOW, readyAt=NOW,
    )  # fmt: skip
    assert hosts_table([HostView(host=host, used=3)]).splitlines() == [
        "HOST       RUNTIME   STATE   SLOTS   ADDRESS",
        "python-0   python    Ready   3/8     127.0.0.1:5000",
    ]


class _Tty(io.StringIO):
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


def _clock(*ticks: float):  # type: ignore[no-untyped-def]
    values = iter(ticks)
    return lambda: next(values)


def test_progress_on_a_terminal_rewrites_one_line() -> None:
    stream = _Tty()
    progress = Progress(stream, label="run/a", clock=_clock(0.0, 0.1, 0.5, 0.9, 1.2))
    for phase in (RunPhase.Pending, RunPhase.Pending, RunPhase.Scheduled, RunPhase.Ready):
        progress(RunStatus(phase=phase))
    progress.done()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    last = text.rsplit("\r", 1)[-1]
    assert last == "✅ run/a: Pending → Scheduled → Ready (1.2s)\x1b[K\n"


def test_progress_off_a_terminal_prints_a_plain_line_per_phase() -> None:
    stream = io.StringIO()
    progress = Progress(stream, label="run/a", clock=_clock(0.0, 0.1, 0.2, 0.3))
    progress(RunStatus(phase=RunPhase.Pending, message="waiting for capacity"))
    progress(RunStatus(phase=RunPhase.Pending, message="waiting for capacity"))
    progress(RunStatus(phase=RunPhase.Failed, message="no runtime"))
    progress.done()
    assert (
        stream.getvalue()
        == "run/a: Pending (0.1s) - waiting for capacity\nrun/a: Failed (0.3s) - no runtime\n"
    )
