"""slots_digest: the pool and a HostWorkflow agree on a host's slots without sending them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from kruntimes.contracts.run import HostSlots, Slot, slots_digest

AT = datetime(2026, 12, 3, 14, 0, 0, 123456, tzinfo=UTC)
A = Slot(runUid="a", workflowId="run/ns/a", tenant=None, reservedAt=AT)
B = Slot(runUid="b", workflowId="run/ns/b", tenant="t1", reservedAt=AT + timedelta(seconds=1))


def test_the_same_slots_in_any_order_give_the_same_digest() -> None:
    assert slots_digest("h1", [A, B]) == slots_digest("h1", [B, A])


def test_the_digest_survives_the_data_converter_round_trip() -> None:
    sent = HostSlots(hostUid="h1", slots=[A, B])
    received = HostSlots.model_validate_json(sent.model_dump_json())
    assert slots_digest("h1", received.slots) == slots_digest("h1", sent.slots)


def test_the_same_instant_in_another_zone_is_the_same_slot() -> None:
    elsewhere = A.model_copy(update={"reservedAt": AT.astimezone(timezone(timedelta(hours=2)))})
    assert slots_digest("h1", [elsewhere]) == slots_digest("h1", [A])


def test_any_change_changes_the_digest() -> None:
    base = slots_digest("h1", [A, B])
    changed = [
        slots_digest("h2", [A, B]),  # another host incarnation
        slots_digest("h1", [A]),  # a slot fewer
        slots_digest("h1", []),
        slots_digest("h1", [A, B.model_copy(update={"tenant": "t2"})]),
        slots_digest("h1", [A, B.model_copy(update={"workflowId": "run/ns/c"})]),
        slots_digest("h1", [A, B.model_copy(update={"reservedAt": AT})]),
        slots_digest("h1", [A, B.model_copy(update={"runUid": "c"})]),
    ]
    assert base not in changed
    assert len(set(changed)) == len(changed)
