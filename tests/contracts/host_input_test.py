"""The HostWorkflow's input is built in one place for both of its starters (a ScaleOutWorkflow and
the reconciler). For a ScaleOutWorkflow it is, byte for byte, the payload a recorded history
holds (tests/replay/histories/scaleout_fulfilled.json: the ScaleOutWorkflow's own input and the
HostWorkflow it started); each starter's timers go where they always went."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from kruntimes.contracts.host import HostInput, host_input
from kruntimes.contracts.pool import ready_host
from kruntimes.contracts.providers import CreatedHost
from kruntimes.contracts.reconcile import ReconcileInput
from kruntimes.contracts.scaleout import ScaleOutInput
from kruntimes.temporal.connect import DATA_CONVERTER

RECORDED = Path(__file__).parents[1] / "replay" / "histories" / "scaleout_fulfilled.json"


def _payload(value: HostInput) -> Payload:
    (payload,) = DATA_CONVERTER.payload_converter.to_payloads([value])
    return payload


def _recorded() -> tuple[Payload, Payload]:
    """The ScaleOutWorkflow's input and its HostWorkflow's input, as the history recorded them."""
    history = WorkflowHistory.from_json("scaleout", RECORDED.read_text())
    started = next(
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
    )
    (starter,) = started.workflow_execution_started_event_attributes.input.payloads
    [child] = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert child.workflow_type.name == "HostWorkflow"
    (supervised,) = child.input.payloads
    return starter, supervised


def test_a_new_hosts_input_is_byte_for_byte_the_one_its_scale_out_recorded() -> None:
    starter_payload, recorded = _recorded()
    [starter] = DATA_CONVERTER.payload_converter.from_payloads([starter_payload], [ScaleOutInput])
    # The host and its provider's record come from the scale-out's activities: as recorded.
    [as_recorded] = DATA_CONVERTER.payload_converter.from_payloads([recorded], [HostInput])

    built = host_input(starter, host=as_recorded.host, created=as_recorded.created)

    assert _payload(built).SerializeToString() == recorded.SerializeToString()
    assert built.watchIntervalSeconds == starter.heartbeatIntervalSeconds, "watched at its heartbeat interval"


def test_a_reconciled_host_is_watched_at_the_reconcilers_interval() -> None:
    """No recorded history holds a HostWorkflow the reconciler started: its starter's fields go
    where a scale-out's go, the watch at the reconciler's interval."""
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    created = CreatedHost(
        provider="process",
        runtime="python",
        hostId="python-1",
        hostUid="0b5c0f4e-1f7a-4a54-9d8f-2c39d1f0a001",
        address="127.0.0.1:20001",
        createdAt=at,
    )
    host = ready_host(created, capacity=4, at=at, supervised=True)
    starter = ReconcileInput(
        runtime="python",
        poolWorkflowId="pool/python",
        stateDir="/var/lib/krt",
        watchIntervalSeconds=2.0,
        assignmentTimeoutSeconds=9.0,
    )

    built = host_input(starter, host=host, created=created)

    assert built == HostInput(
        host=host,
        created=created,
        poolWorkflowId="pool/python",
        stateDir="/var/lib/krt",
        watchIntervalSeconds=2.0,
        assignmentTimeoutSeconds=9.0,
    )
