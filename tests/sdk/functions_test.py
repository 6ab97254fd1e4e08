"""The SDK's Functions against the whole platform: apply → Ready → invoked through the gateway's
Function URL → a change rolls out a new revision → rollback → delete; apply's outcomes and
conflicts; and every call on a Function that is not there."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kruntimes.api.function import Function, FunctionPhase
from kruntimes.api.ids import Namespace
from kruntimes.api.spec import Creator
from kruntimes.contracts.names import function_invoke_url
from kruntimes.sdk.client import Client, FunctionConflict, FunctionNotFound, KruntimesError
from kruntimes.sdk.functions import rolled_out
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

VERSIONED = "import os\ndef handle(p):\n    return {'version': os.environ['VERSION'], 'echo': p}\n"


def function(name: str, *, version: str = "1", namespace: str = "default", **spec: Any) -> Function:
    document = manifest(name, source=VERSIONED, env={"VERSION": version}, **spec)
    document["metadata"] = {**document["metadata"], "namespace": namespace}
    return Function.from_dict({**document, "kind": "Function"})


@contextlib.asynccontextmanager
async def deleted_after(krt: Client, name: str, namespace: str = "default") -> AsyncIterator[None]:
    """Delete the Function when the test ends, however it ends (its replicas are Runs the
    platform fixture would otherwise delete under it, and it would start them again)."""
    try:
        yield
    finally:
        with contextlib.suppress(FunctionNotFound):
            await krt.functions.delete(name, namespace, timeout=120)


async def test_a_function_is_applied_invoked_at_its_url_rolled_out_rolled_back_and_deleted(
    krt: Client, platform: Platform
) -> None:
    name = unique("fn")
    async with deleted_after(krt, name):
        applied = await krt.functions.apply(function(name))
        assert applied.action == "created" and applied.function.uid
        uid = applied.function.uid
        assert applied.function.metadata.creator is None, "the platform's config names no identity"

        ready = await krt.functions.wait_ready(name, timeout=90)
        assert ready.status.phase is FunctionPhase.Ready and ready.status.revision == 1
        assert ready.status.replicas.ready == ready.status.replicas.wanted == 1
        url = function_invoke_url(
            platform.config.gatewayUrl or "", namespace=Namespace("default"), function_uid=uid
        )
        assert ready.status.endpoint is not None and ready.status.endpoint.url == url
        answer = await krt.functions.invoke(name, {"hi": 1})
        assert answer.ok and answer.outputs == {"version": "1", "echo": {"hi": 1}}
        [replica] = await krt.functions.replicas(name)
        assert replica.revision == 1 and replica.phase == "Ready" and replica.name.startswith(f"{name}-r1-")
        run = await krt.get(replica.name)
        assert run.metadata.labels["kruntimes.io/function"] == name, "a replica is a Run the Function labels"

        again = await krt.functions.apply(function(name))
        assert again.action == "unchanged" and again.function.status.revision == 1

        changed = await krt.functions.apply(function(name, version="2"))
        assert changed.action == "configured" and changed.function.uid == uid
        status = await krt.functions.rollout_status(name, timeout=90)
        assert rolled_out(status) and status.revision == 2
        answer = await krt.functions.invoke(name, {"hi": 2})
        assert answer.outputs["version"] == "2", "every answer after the rollout is the new revision's"
        got = await krt.functions.get(name)
        assert got.spec.env == {"VERSION": "2"} and got.uid == uid, "get shows the current manifest"
        second = await krt.functions.replicas(name)
        assert [r.revision for r in second] == [2], "the old revision's replica is deleted"

        back = await krt.functions.rollback(name)
        assert back.status.revision == 3 and back.spec.env == {"VERSION": "1"}
        status = await krt.functions.rollout_status(name, timeout=90)
        assert status.revision == 3
        assert (await krt.functions.invoke(name, None)).outputs["version"] == "1"
        replicas = {
            replica.name,
            *(r.name for r in second),
            *(r.name for r in await krt.functions.replicas(name)),
        }

        listed = await krt.functions.list("default")
        assert name in [f.name for f in listed]
        await krt.functions.delete(name, timeout=120)
        with pytest.raises(FunctionNotFound):
            await krt.functions.get(name)
        assert name not in [f.name for f in await krt.functions.list("default")]

        async def replicas_gone() -> bool:
            names = {r.name for r in await krt.list("default")}
            return not names & replicas

        await eventually(replicas_gone, within=30, what="the Function's replica Runs deleted with it")


async def test_apply_keeps_the_running_uid_refuses_another_and_a_scale_change_is_no_revision(
    platform: Platform,
) -> None:
    name = unique("fnu")
    async with Client(platform.config._replace(identity="team-a-ci")) as krt, deleted_after(krt, name):
        created = await krt.functions.apply(function(name, scale={"min": 1, "max": 3}))
        assert created.function.metadata.creator == Creator(kind="sdk", subject="team-a-ci")
        scaled = await krt.functions.apply(function(name, scale={"min": 1, "max": 5}))
        assert scaled.action == "configured" and scaled.function.uid == created.function.uid
        assert scaled.function.status.revision == 1, "scale alone is no new revision"
        assert scaled.function.spec.scale.max == 5
        other = function(name)._replace(metadata=function(name).metadata._replace(uid=str(uuid.uuid4())))
        with pytest.raises(FunctionConflict, match="exists with uid"):
            await krt.functions.apply(other)
        with pytest.raises(FunctionConflict, match="no previous revision"):
            await krt.functions.rollback(name)
        with pytest.raises(FunctionConflict, match="outside the Function's scale 1..5"):
            await krt.functions.scale(name, 9)
        assert (await krt.functions.scale(name, 2, reason="a test")).wanted == 2
        ready = await krt.functions.wait_ready(name, timeout=90)
        assert ready.status.replicas.ready == ready.status.replicas.wanted == 2
        replicas = await krt.functions.replicas(name)
        assert len({r.name for r in replicas}) == 2
        run = await krt.get(replicas[0].name)
        assert run.metadata.creator == Creator(kind="sdk", subject="team-a-ci"), (
            "its replicas are the creator's"
        )


async def test_every_call_on_a_function_that_is_not_there_is_function_not_found(krt: Client) -> None:
    name, namespace = unique("nofn"), unique("ns")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: krt.functions.get(name, namespace),
        lambda: krt.functions.status(name, namespace),
        lambda: krt.functions.describe(name, namespace),
        lambda: krt.functions.delete(name, namespace),
        lambda: krt.functions.rollback(name, namespace),
        lambda: krt.functions.scale(name, 2, namespace),
        lambda: krt.functions.wait_ready(name, namespace, timeout=5),
        lambda: krt.functions.invoke(name, {}, namespace=namespace),
        lambda: krt.functions.get("Not_A_Name", namespace),
    ]
    for call in calls:
        with pytest.raises(FunctionNotFound) as caught:
            await call()
        assert caught.value.namespace == namespace and str(caught.value).startswith("function ")
        assert isinstance(caught.value, KruntimesError)
    assert await krt.functions.list(namespace) == []
    assert await krt.functions.list("Not_A_Namespace") == []
