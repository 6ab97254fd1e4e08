"""Where a pod watch's events go: one that may mean a lost host becomes a provider report to that
host's HostWorkflow, naming the pod's uid; the others go nowhere."""

from __future__ import annotations

import pytest

from kruntimes.activities.hosts.events import LOSS, HostEvent, HostEventKind, HostWorkflowRoute
from kruntimes.api.limits import MAX_STATUS_MESSAGE_BYTES
from kruntimes.contracts.host import ProviderReport
from kruntimes.contracts.names import SIGNAL_PROVIDER_REPORT, host_workflow_id

UID = "5f0c6f44-3c2a-4d0e-9a57-0d6e8f1f2b11"


@pytest.mark.parametrize("kind", sorted(LOSS))
def test_a_loss_is_a_provider_report_to_the_hosts_workflow_naming_the_incarnation(kind) -> None:
    event = HostEvent(kind, "kubernetes", "python", "python-0", UID, message="the node went away")
    workflow_id, signal, report = HostWorkflowRoute()(event)
    assert (workflow_id, signal) == (host_workflow_id("python", "python-0"), SIGNAL_PROVIDER_REPORT)
    assert isinstance(report, ProviderReport)
    assert (report.lost, report.ready, report.hostUid) == (True, False, UID)
    assert report.reason == f"Kubernetes{kind}" and report.message == "the node went away"


def test_a_ready_pod_and_an_event_without_a_host_go_nowhere() -> None:
    route = HostWorkflowRoute()
    assert route(HostEvent(HostEventKind.Ready, "kubernetes", "python", "python-0", UID)) is None
    assert route(HostEvent(HostEventKind.Deleted, "kubernetes", "python", "", UID)) is None


def test_a_long_message_is_bounded_in_the_report() -> None:
    event = HostEvent(HostEventKind.Evicted, "kubernetes", "python", "python-0", UID, message="x" * 100_000)
    _, _, report = HostWorkflowRoute()(event)
    assert isinstance(report, ProviderReport) and len(report.message.encode()) <= MAX_STATUS_MESSAGE_BYTES
