"""A Function's traffic split (#43 item 6, the canary): spec.traffic's validation, how `latest`
resolves, how the workflow's plan keeps an older revision's replicas for it, and KrtTraffic's
encoding as the gateway reads it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from kruntimes.api.function import Function, FunctionManifestError
from kruntimes.api.ids import RunUid
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.function import Replica
from kruntimes.decisions.functionlife import older_replicas, plan
from kruntimes.wire.search import parse_traffic, traffic_value

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def function(traffic: object) -> Function:
    return Function.new("web", runtime="python", handler="h:handler", inline={"h.py": "x"}, traffic=traffic)


def test_a_split_of_two_revisions_resolves_latest() -> None:
    fn = function([{"revision": 1, "percent": 80}, {"revision": 0, "percent": 20}])
    assert fn.spec.split(current=2) == {1: 80, 2: 20}
    assert function(None).spec.split(current=2) == {}
    # everything to the current one is no split at all
    assert function([{"revision": 0, "percent": 100}]).spec.split(current=2) == {}
    assert function([{"revision": 2, "percent": 100}]).spec.split(current=2) == {}
    assert function([{"revision": 1, "percent": 100}]).spec.split(current=2) == {1: 100}


def test_traffic_alone_is_no_new_template() -> None:
    plain = function(None)
    split = function([{"revision": 1, "percent": 50}, {"revision": 0, "percent": 50}])
    assert split.spec.same_template(plain.spec)


@pytest.mark.parametrize(
    ("traffic", "said"),
    [
        ([{"revision": 1, "percent": 80}, {"revision": 0, "percent": 30}], "add up to 100"),
        ([{"revision": 1, "percent": 50}, {"revision": 1, "percent": 50}], "at most once"),
        ([{"revision": 1, "percent": 101}, {"revision": 0, "percent": -1}], "spec.traffic"),
        ([{"revision": -1, "percent": 100}], "spec.traffic"),
        ([{"revision": r, "percent": p} for r, p in ((1, 30), (2, 30), (0, 40))], "spec.traffic"),
        ([], "spec.traffic"),
        ([{"revision": "1", "percent": 100}], "spec.traffic"),
    ],
)
def test_a_split_that_does_not_add_up_is_refused(traffic: object, said: str) -> None:
    with pytest.raises(FunctionManifestError) as err:
        function(traffic)
    assert said in str(err.value)


def replica(revision: int, phase: RunPhase = RunPhase.Ready) -> Replica:
    uid = RunUid(str(uuid.uuid4()))
    return Replica(runUid=uid, name=f"f-r{revision}-{uid[:5]}", revision=revision, phase=phase, startedAt=T0)


def test_an_older_revision_in_a_split_keeps_its_share_of_replicas() -> None:
    assert [older_replicas(10, p) for p in (0, 1, 20, 80, 100)] == [0, 1, 2, 8, 10]
    assert older_replicas(0, 50) == 0  # scaled to zero: none
    old, new = [replica(1), replica(1), replica(1)], [replica(2), replica(2)]
    kept = plan(revision=2, wanted=2, replicas=[*old, *new], now=T0, retry_at=None, older={1: 1})
    # rolled out: one old replica stays (the oldest Ready), the surplus goes
    assert kept.rolled_out and set(kept.delete) == {old[1].runUid, old[2].runUid}
    assert kept.start_older == ()
    # its replica gone: another of revision 1 is started
    again = plan(revision=2, wanted=2, replicas=new, now=T0, retry_at=None, older={1: 1})
    assert (again.start, again.start_older, again.delete) == (0, ((1, 1),), ())
    # before the rollout is done the older revision's surplus keeps serving
    coming = [replica(2, RunPhase.Pending)]
    waiting = plan(revision=2, wanted=2, replicas=[*old, *coming], now=T0, retry_at=None, older={1: 1})
    assert not waiting.rolled_out and waiting.delete == () and waiting.start == 1
    # no split: the older revision goes once rolled out, as before
    gone = plan(revision=2, wanted=2, replicas=[*old, *new], now=T0, retry_at=None)
    assert set(gone.delete) == {r.runUid for r in old}


def test_krt_traffic_is_read_back_and_anything_else_is_no_split() -> None:
    assert traffic_value({4: 20, 3: 80}) == "3:80,4:20"
    assert parse_traffic("3:80,4:20") == ((3, 80), (4, 20))
    assert parse_traffic("1:100") == ((1, 100),)
    for bad in ("", "3:80", "3:80,3:20", "a:80,4:20", "3:80,4:20,5:0", "3:-80,4:180", "3=80", "9" * 100):
        assert parse_traffic(bad) == (), bad
