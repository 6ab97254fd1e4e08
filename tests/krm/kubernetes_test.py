"""FunctionConfigs from Kubernetes: kmock's emulated API server on 127.0.0.1, changed while the
feed watches. kmock does not keep resourceVersions; the tests that need one script it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kmock import KubernetesEmulator, ResourceInfo, Response  # type: ignore[attr-defined]

from kruntimes.krm import errors, kubernetes
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.store import Store
from tests.krm.conftest import eventually, function_config, request

NS = "kruntimes"
COLLECTION = f"/apis/kruntimes.io/v1alpha1/namespaces/{NS}/functionconfigs"
IMAGE = "example.com/fn/labels:v1.0.0"


def config(name: str, path: str) -> dict:
    document = function_config(name, prefixes=["example.com/fn/labels"], path=path, tags=["1.x"])
    document["metadata"]["namespace"] = NS
    return document


def lines(*events: dict) -> bytes:
    """A watch stream's body: one JSON event per line."""
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def binary_of(store: Store) -> str | None:
    try:
        return store.binary(IMAGE, "").path.name
    except errors.NotFound:
        return None


async def api(kmock: KubernetesEmulator, method: str, path: str, body: dict | None = None) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with session.request(method, f"{kmock.url}{path}", json=body, headers=headers) as response:
            assert response.status < 300, await response.text()


@pytest.fixture
async def feed(kmock: KubernetesEmulator, functions) -> AsyncIterator[kubernetes.KubernetesFeed]:
    # Known to the emulator before any object exists, so an empty list is an empty list, not 404.
    kmock.resources["kruntimes.io/v1alpha1/functionconfigs"] = ResourceInfo(
        kind="FunctionConfig", namespaced=True
    )
    client = await kubernetes.connect(host=str(kmock.url))
    feed = kubernetes.KubernetesFeed(
        Store(functions_dir=functions), client, namespace=NS, backoff=(0.05, 0.2)
    )
    yield feed
    await client.close()


async def run(feed: kubernetes.KubernetesFeed) -> asyncio.Task[None]:
    return asyncio.create_task(feed.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_changes_in_the_cluster_take_effect_without_restart(kmock, feed) -> None:
    await api(kmock, "POST", COLLECTION, config("labels", "set-labels"))
    task = await run(feed)
    try:
        evaluator = ExecEvaluator(feed.store)
        await eventually(lambda: binary_of(feed.store) == "set-labels", what="the listed config")
        await evaluator.evaluate(request(IMAGE))

        await api(kmock, "PATCH", f"{COLLECTION}/labels", {"spec": {"binaryExecutor": {"path": "exit-1"}}})
        await eventually(lambda: binary_of(feed.store) == "exit-1", what="the watched change")
        with pytest.raises(errors.FunctionFailed):
            await evaluator.evaluate(request(IMAGE))

        await api(kmock, "DELETE", f"{COLLECTION}/labels")
        await eventually(lambda: binary_of(feed.store) is None, what="the watched deletion")
        assert feed.lists == 1
    finally:
        await stop(task)


async def test_an_invalid_object_is_reported_and_its_last_valid_version_kept(kmock, feed) -> None:
    await api(kmock, "POST", COLLECTION, config("labels", "set-labels"))
    task = await run(feed)
    try:
        await eventually(lambda: binary_of(feed.store) == "set-labels")
        await api(kmock, "PATCH", f"{COLLECTION}/labels", {"spec": {"binaryExecutor": {"tags": ["nope!"]}}})
        await eventually(lambda: bool(feed.store.errors()), what="the error is reported")
        assert "spec.binaryExecutor.tags" in next(iter(feed.store.errors().values()))
        assert binary_of(feed.store) == "set-labels"
    finally:
        await stop(task)


async def test_the_watch_resumes_from_the_last_resource_version(kmock, feed) -> None:
    # A list at version 7, then a watch that ends after one event at version 9: the next watch
    # must ask for version 9, not list again.
    listing = {"kind": "FunctionConfigList", "metadata": {"resourceVersion": "7"}, "items": []}
    kmock["list"][:1] << Response(status=200, payload=listing)
    added = config("labels", "echo")
    added["metadata"]["resourceVersion"] = "9"
    kmock["watch"][:1] << Response(status=200, payload=lines({"type": "ADDED", "object": added}))
    task = await run(feed)
    try:
        await eventually(lambda: len(list(kmock["watch"])) >= 2, what="a second watch")
        first, second = list(kmock["watch"])[:2]
        assert first.params.get("resourceVersion") == "7"
        assert second.params.get("resourceVersion") == "9"
        assert binary_of(feed.store) == "echo"
        assert feed.lists == 1
    finally:
        await stop(task)


async def test_a_gone_resource_version_lists_again(kmock, feed) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    kmock["watch"][:1] << Response(status=200, payload=lines(gone))
    task = await run(feed)
    try:
        await api(kmock, "POST", COLLECTION, config("labels", "echo"))
        await eventually(lambda: feed.lists >= 2, what="a relist after 410")
        await eventually(lambda: binary_of(feed.store) == "echo")
    finally:
        await stop(task)


async def test_a_failing_watch_is_restarted_after_a_backoff(kmock, feed) -> None:
    kmock["watch"][:2] << Response(status=500, payload={"kind": "Status", "code": 500})
    task = await run(feed)
    try:
        await eventually(lambda: len(list(kmock["watch"])) >= 3, what="the third watch")
        await api(kmock, "POST", COLLECTION, config("labels", "echo"))
        await eventually(lambda: binary_of(feed.store) == "echo", what="events after the restart")
        assert feed.lists == 1, "it resumed from the list's version instead of listing again"
    finally:
        await stop(task)
