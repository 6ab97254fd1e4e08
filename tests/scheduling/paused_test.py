"""Admission while an operator paused the runtime: the run queues, nothing is placed or scaled out."""

from __future__ import annotations

from kruntimes.decisions.scheduling.admission import admit
from kruntimes.decisions.scheduling.model import AssignToInstance, QueueGlobally, Reject, RejectReason

from .builders import RUNTIME, host, request, reservation


def _paused(req, *, hosts=(), reservations=(), queue=(), max_queue=10):  # type: ignore[no-untyped-def]
    return admit(
        request=req,
        hosts=hosts,
        reservations=reservations,
        queue=queue,
        pending_scale_outs=(),
        runtime=RUNTIME,
        max_queue=max_queue,
        max_hosts=4,
        paused=True,
    )


def test_a_run_with_a_free_slot_queues_while_paused():
    assert _paused(request("r1"), hosts=[host("h1")]) == QueueGlobally(position=0)


def test_a_run_with_no_capacity_queues_without_a_scale_out_while_paused():
    assert _paused(request("r2"), queue=[request("r1")]) == QueueGlobally(position=1)


def test_a_full_queue_rejects_while_paused():
    decision = _paused(request("r2"), queue=[request("r1")], max_queue=1)
    assert isinstance(decision, Reject) and decision.reason is RejectReason.QueueFull


def test_a_run_that_holds_a_slot_keeps_it_while_paused():
    on = host("h1")
    assert _paused(request("r1"), hosts=[on], reservations=[reservation("r1", on)]) == AssignToInstance(
        hostId="h1", hostUid="h1-uid"
    )


def test_a_tenant_without_a_policy_is_rejected_while_paused():
    decision = _paused(request("r1", tenant="nobody"))
    assert isinstance(decision, Reject) and decision.reason is RejectReason.TenantNotAllowed


def test_the_same_run_admitted_again_keeps_its_place_while_paused():
    assert _paused(request("r1"), queue=[request("r0"), request("r1")]) == QueueGlobally(position=1)


def test_a_full_queue_while_paused_says_the_runtime_is_paused_and_its_limit():
    decision = _paused(request("r2"), queue=[request("r1")], max_queue=1)
    assert isinstance(decision, Reject)
    assert decision.message == f"admission to {RUNTIME!r} is paused; its queue holds its limit of 1"
