"""The pod watch against the test cluster: host events, resuming from a resourceVersion after a
dropped connection, relisting after 410 Gone, other control planes' pods ignored."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kruntimes.activities.hosts.events import HostEventKind, HostEventQueue
from kruntimes.activities.hosts.kubernetes_watch import PodWatch
from tests.kubernetes.conftest import NAMESPACE, spec
from tests.support.waiting import eventually


def kinds(queue: HostEventQueue, seen: list) -> list[HostEventKind]:
    while not queue._queue.empty():
        seen.append(queue._queue.get_nowait())
    return [e.kind for e in seen]


@contextlib.asynccontextmanager
async def watching(env) -> AsyncIterator[tuple[PodWatch, HostEventQueue]]:
    """A PodWatch of control plane cp-a's pods running into a new queue; cancelled after."""
    queue = HostEventQueue()
    watch = PodWatch(env.api, namespace=NAMESPACE, control_plane="cp-a", on_event=queue, backoff=(0.05, 0.2))
    task = asyncio.create_task(watch.run())
    try:
        yield watch, queue
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_ready_then_deleted_is_reported_for_our_pods_only(env) -> None:
    async with watching(env) as (watch, queue):
        ours, theirs = env.provider(), env.provider(control_plane="cp-b")
        host = await ours.create(spec())
        await theirs.create(spec())
        seen: list = []
        await eventually(lambda: HostEventKind.Ready in kinds(queue, seen), what="Ready")
        assert seen[0].host_uid == host.hostUid and seen[0].host_id == "python-0"
        await ours.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
        await eventually(lambda: HostEventKind.Deleted in kinds(queue, seen), what="Deleted")
        await eventually(lambda: len(env.pods()) == 1, what="only their pod is left")
        assert {e.host_uid for e in seen} == {host.hostUid}, "the other control plane's pod is never reported"
        deleted = [e.message for e in seen if e.kind is HostEventKind.Deleted]
        await eventually(
            lambda: kinds(queue, seen).count(HostEventKind.Deleted) == 2, what="deleting, then gone"
        )
        deleted = [e.message for e in seen if e.kind is HostEventKind.Deleted]
        assert deleted == ["the pod is being deleted", "the pod is gone"]


async def test_evicted_failed_and_not_ready_are_reported(env) -> None:
    async with watching(env) as (watch, queue):
        provider = env.provider()
        await provider.create(spec("python-0"))
        await provider.create(spec("python-1"))
        await provider.create(spec("python-2"))
        names = {p["metadata"]["labels"]["kruntimes.io/host-id"]: p["metadata"]["name"] for p in env.pods()}
        seen: list = []
        await eventually(lambda: kinds(queue, seen).count(HostEventKind.Ready) == 3)
        await env.kubelet.evict(names["python-0"])
        env.kubelet.process(names["python-1"]).kill()
        await env.kubelet._patch_status(
            next(r for r in env.kubelet._runs.values() if r.name == names["python-2"]),
            {"conditions": [{"type": "Ready", "status": "False"}]},
        )
        expected = {
            "python-0": HostEventKind.Evicted,
            "python-1": HostEventKind.Failed,  # a NotReady may come first: the probe fails as it dies
            "python-2": HostEventKind.NotReady,
        }

        def reported() -> bool:
            kinds(queue, seen)
            return all(any(e.host_id == h and e.kind is k for e in seen[3:]) for h, k in expected.items())

        await eventually(reported, what="evicted, failed, not ready")
        assert not any(e.host_id == "python-2" and e.kind is HostEventKind.Failed for e in seen)


async def test_the_watch_resumes_from_its_resource_version_after_a_dropped_connection(env) -> None:
    async with watching(env) as (watch, queue):
        provider = env.provider()
        await eventually(lambda: watch.watches >= 1 and env.cluster._watchers, what="the watch is open")
        first = await provider.create(spec("python-0"))
        seen: list = []
        await eventually(lambda: HostEventKind.Ready in kinds(queue, seen))
        version = env.cluster.version
        env.cluster.drop_watches()
        await provider.delete(runtime="python", host_id="python-0", host_uid=first.hostUid)  # while cut off
        await eventually(lambda: HostEventKind.Deleted in kinds(queue, seen), what="Deleted after the drop")
        watches = [r for r in env.cluster["watch"] if r.namespace == NAMESPACE]
        resumed = [r.params.get("resourceVersion") for r in watches[1:]]
        assert resumed and int(resumed[0]) >= version - 1, resumed
        assert watch.lists == 1, "it resumed instead of listing again"


async def test_a_gone_resource_version_lists_again_and_reports_what_vanished(env) -> None:
    async with watching(env) as (watch, queue):
        provider = env.provider()
        host = await provider.create(spec())
        seen: list = []
        await eventually(lambda: HostEventKind.Ready in kinds(queue, seen))
        env.cluster.gone_below = 10**9  # every version the watch knows is compacted away
        env.cluster.drop_watches()
        await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
        await eventually(lambda: not env.pods())
        await eventually(lambda: watch.lists >= 2, what="a relist after 410")
        env.cluster.gone_below = 0
        await eventually(
            lambda: HostEventKind.Deleted in kinds(queue, seen), what="the vanished pod is reported"
        )


async def test_a_failing_watch_is_restarted_after_a_backoff(env) -> None:
    from kmock import Response, namespace  # type: ignore[attr-defined]

    # only the provider's watch of its namespace; the kubelet watches every namespace
    env.cluster["watch", namespace(NAMESPACE)][:2] << Response(
        status=500, payload={"kind": "Status", "code": 500}
    )
    async with watching(env) as (watch, queue):
        await eventually(lambda: watch.watches >= 3, what="the third watch")
        await env.provider().create(spec())
        seen: list = []
        await eventually(lambda: HostEventKind.Ready in kinds(queue, seen), what="events after the restart")
        assert watch.lists == 1
