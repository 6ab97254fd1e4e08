"""The bounded FIFO: which queued runs take a slot when capacity appears, and leaving the queue."""

from __future__ import annotations

from kruntimes.decisions.scheduling.admission import next_from_queue, withdraw
from kruntimes.decisions.scheduling.model import AssignToInstance, HostState

from .builders import dedicated, fill, host, hybrid, request, reservation


def placed(queue, hosts, reservations=()):
    return [
        (p.request.runUid, p.assignment.hostId)
        for p in next_from_queue(queue=queue, hosts=hosts, reservations=reservations)
    ]


def test_an_empty_queue_places_nothing():
    assert placed([], [host("h1")]) == []


def test_the_head_of_the_queue_gets_the_only_free_slot():
    assert placed([request("q0"), request("q1")], [host("h1", capacity=1)]) == [("q0", "h1")]


def test_queued_runs_are_placed_in_fifo_order_until_capacity_runs_out():
    queue = [request(f"q{i}") for i in range(5)]
    hosts = [host("h1", capacity=2), host("h2", capacity=1)]
    # Least loaded first: after q0, h1 and h2 both have one free slot and h2 runs fewer runs.
    assert placed(queue, hosts) == [("q0", "h1"), ("q1", "h2"), ("q2", "h1")]


def test_placements_spread_over_hosts_in_candidate_order():
    queue = [request(f"q{i}") for i in range(4)]
    hosts = [host("h1", capacity=2), host("h2", capacity=2)]
    assert placed(queue, hosts) == [("q0", "h1"), ("q1", "h2"), ("q2", "h1"), ("q3", "h2")]


def test_existing_reservations_are_respected():
    h1 = host("h1", capacity=2)
    assert placed([request("q0"), request("q1")], [h1], fill(h1, 1)) == [("q0", "h1")]


def test_a_run_whose_tenant_has_no_capacity_does_not_block_other_tenants_behind_it():
    queue = [request("q0", tenant="tenant-a"), request("q1"), request("q2", tenant="tenant-a")]
    assert placed(queue, [host("shared", capacity=5)]) == [("q1", "shared")]


def test_each_tenant_gets_only_the_capacity_it_can_see():
    queue = [request("q0", tenant="tenant-a"), request("q1"), request("q2", tenant="tenant-a")]
    hosts = [host("shared", capacity=5), dedicated("a-1", "tenant-a", capacity=1)]
    assert placed(queue, hosts) == [("q0", "a-1"), ("q1", "shared")]


def test_earlier_runs_of_different_tenants_win_shared_slots_they_compete_for():
    queue = [request("q0", tenant="tenant-b"), request("q1"), request("q2", tenant="tenant-b")]
    assert placed(queue, [host("shared", capacity=2)]) == [("q0", "shared"), ("q1", "shared")]


def test_a_hybrid_run_takes_its_own_host_before_the_shared_one():
    queue = [request("q0", tenant="tenant-b"), request("q1")]
    hosts = [host("shared", capacity=1), hybrid("b-1", "tenant-b", capacity=1)]
    assert placed(queue, hosts) == [("q0", "b-1"), ("q1", "shared")]


def test_hosts_that_are_not_ready_take_no_queued_runs():
    hosts = [host("h1", state=HostState.Assigned), host("h2", state=HostState.Draining)]
    assert placed([request("q0")], hosts) == []


def test_a_queued_run_that_already_holds_a_slot_is_not_placed_twice():
    h1 = host("h1", capacity=3)
    assert placed([request("q0"), request("q1")], [h1], [reservation("q0", h1)]) == [("q1", "h1")]


def test_a_run_queued_twice_is_placed_once():
    assert placed([request("q0"), request("q0"), request("q1")], [host("h1", capacity=3)]) == [
        ("q0", "h1"),
        ("q1", "h1"),
    ]


def test_a_queued_run_of_an_unknown_tenant_is_skipped():
    assert placed([request("q0", tenant="tenant-unknown"), request("q1")], [host("h1")]) == [("q1", "h1")]


def test_placements_carry_the_host_uid():
    h1 = host("h1", uid="uid-7")
    (placement,) = next_from_queue(queue=[request("q0")], hosts=[h1], reservations=[])
    assert placement.assignment == AssignToInstance(hostId="h1", hostUid="uid-7")
    assert placement.request == request("q0")


def test_a_released_slot_goes_to_the_head_of_the_queue():
    h1 = host("h1", capacity=1)
    held = [reservation("done", h1)]
    queue = [request("q0"), request("q1")]
    assert placed(queue, [h1], held) == []
    assert placed(queue, [h1], []) == [("q0", "h1")]


def test_withdrawing_a_run_keeps_the_order_of_the_others():
    queue = [request("q0"), request("q1"), request("q2")]
    assert [q.runUid for q in withdraw(queue=queue, run_uid="q1")] == ["q0", "q2"]


def test_withdrawing_a_run_that_is_not_queued_changes_nothing():
    queue = (request("q0"),)
    assert withdraw(queue=queue, run_uid="absent") == queue
