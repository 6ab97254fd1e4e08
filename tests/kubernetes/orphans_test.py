"""Orphans and two control planes on one namespace: each lists, deletes and collects only its own
pods; a pod no pool knows is deleted once it stayed unknown for the grace period."""

from __future__ import annotations

from kruntimes.activities.hosts.kubernetes import OrphanCollector
from tests.kubernetes.conftest import spec
from tests.support.waiting import eventually


def uids(env) -> set[str]:
    return {p["metadata"]["uid"] for p in env.pods()}


async def test_two_control_planes_on_one_namespace_never_touch_each_others_pods(env) -> None:
    a, b = env.provider(control_plane="cp-a"), env.provider(control_plane="cp-b")
    host_a, host_b = await a.create(spec()), await b.create(spec())  # the same runtime and host id
    assert host_a.hostUid != host_b.hostUid and uids(env) == {host_a.hostUid, host_b.hostUid}
    assert [ref.uid for ref in await a.list_pods()] == [host_a.hostUid]
    assert [ref.uid for ref in await b.list_pods()] == [host_b.hostUid]

    # b's delete of "python-0" names b's pod: a's pod of the same host id is not b's to delete
    assert await b.delete(runtime="python", host_id="python-0", host_uid=host_a.hostUid) is False
    assert await a.lost([("python", "python-0", host_a.hostUid)]) == set()

    swept = await OrphanCollector(a, grace_s=0).sweep(known=set())  # a's pools know nothing
    assert [ref.uid for ref in swept.deleted] == [host_a.hostUid]
    await eventually(lambda: uids(env) == {host_b.hostUid}, what="only a's pod is collected")
    assert await b.probe(host_b)
    assert await a.lost([("python", "python-0", host_a.hostUid)]) == {host_a.hostUid}


async def test_an_unknown_pod_is_collected_only_after_the_grace_and_a_known_one_never(env) -> None:
    provider = env.provider()
    known = await provider.create(spec("python-0"))
    unknown = await provider.create(spec("python-1"))
    collector = OrphanCollector(provider, grace_s=3600)
    swept = await collector.sweep(known={known.hostUid})
    assert swept.deleted == [] and [ref.uid for ref in swept.waiting] == [unknown.hostUid]
    collector.grace_s = 0
    swept = await collector.sweep(known={known.hostUid})
    assert [ref.uid for ref in swept.deleted] == [unknown.hostUid]
    await eventually(lambda: uids(env) == {known.hostUid}, what="the orphan is gone, the known pod stays")


async def test_the_reconcilers_collection_takes_one_runtime_and_spares_the_pods_being_created(env) -> None:
    from kruntimes.activities.hosts.base import HostManager
    from tests.kubernetes.conftest import runtime

    provider = env.provider(runtimes={"python": runtime(), "bash": runtime()})
    manager = HostManager([provider])
    known = await provider.create(spec("python-0"))
    orphan = await provider.create(spec("python-1"))
    creating = await provider.create(spec("python-2"))
    other = await provider.create(spec("bash-0", runtime="bash"))

    deleted = await manager.collect_orphans(
        runtime="python", known={known.hostUid}, creating={"python-2"}, grace_s=0
    )

    assert deleted == ["python-1"]
    expected = {known.hostUid, creating.hostUid, other.hostUid}
    await eventually(lambda: uids(env) == expected, what="only the orphan of that runtime collected")
    assert orphan.hostUid not in uids(env)
    assert await manager.collect_orphans(runtime="other", known=set(), creating=set(), grace_s=0) == []
    # a grace not yet over spares a new orphan; once over, it goes
    assert await manager.collect_orphans(runtime="bash", known=set(), creating=set(), grace_s=3600) == []
    assert other.hostUid in uids(env)
    assert await manager.collect_orphans(runtime="bash", known=set(), creating=set(), grace_s=0) == ["bash-0"]
