"""`krt mcp`'s Function tools over HTTPS with the official MCP SDK's client, against the shared
embedded platform: the tools listed with the API's schemas; apply → Ready → invoke (with the
caller's own token at the gateway) → scale → delete, each change recorded with who asked; and a
token bound to another namespace refused every one of them."""

from __future__ import annotations

import contextlib
from typing import Any

from kruntimes.api.ids import Namespace
from kruntimes.contracts.function import ScaleInput
from kruntimes.contracts.names import UPDATE_SCALE, function_workflow_id
from kruntimes.sdk.client import Client, FunctionNotFound
from tests.mcp.conftest import ADMIN_TOKEN, CAROL_TOKEN, HttpServer, refusal, structured
from tests.sdk.stack import Platform, manifest, unique

FUNCTION_TOOLS = {
    "functions_apply",
    "functions_get",
    "functions_list",
    "functions_scale",
    "functions_rollout_status",
    "functions_rollback",
    "functions_delete",
    "functions_invoke",
}


async def scale_reasons(krt: Client, name: str) -> list[str]:
    """The reason of each `scale` Update the Function's workflow accepted, from its history."""
    from temporalio.api.enums.v1 import EventType

    temporal = await krt.temporal()
    handle = temporal.get_workflow_handle(function_workflow_id(Namespace("default"), name))
    reasons = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == UPDATE_SCALE:
                [scale] = await temporal.data_converter.decode(request.input.args.payloads, [ScaleInput])
                reasons.append(scale.reason)
    return reasons


def function(name: str, *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    document = manifest(name, **spec)
    return {**document, "kind": "Function", "metadata": {**document["metadata"], "namespace": namespace}}


async def test_an_agent_applies_a_function_invokes_it_scales_it_and_deletes_it(
    platform: Platform, mcp_http: HttpServer
) -> None:
    name = unique("mcpfn")
    async with mcp_http.session(ADMIN_TOKEN) as mcp, Client(platform.config) as krt:
        try:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(tools) >= FUNCTION_TOOLS
            # the schemas are the API's models: a manifest is a Function, its spec a FunctionSpec
            assert {"Function", "FunctionSpec", "ScaleSpec"} <= set(
                tools["functions_apply"].input_schema["$defs"]
            )
            assert tools["functions_scale"].input_schema["required"] == ["name", "replicas"]
            delete = tools["functions_delete"].annotations
            assert delete is not None and delete.destructive_hint is True
            get = tools["functions_get"].annotations
            assert get is not None and get.read_only_hint is True

            document = function(name, scale={"min": 1, "max": 2})
            applied = structured(await mcp.call_tool("functions_apply", {"manifest": document, "wait": True}))
            assert applied["action"] == "created"
            fn = applied["function"]
            assert (fn["status"]["phase"], fn["status"]["replicas"]["ready"]) == ("Ready", 1)
            assert fn["metadata"]["creator"] == {"kind": "mcp", "subject": "root"}
            again = structured(await mcp.call_tool("functions_apply", {"manifest": document}))
            assert again["action"] == "unchanged"
            no_previous = refusal(await mcp.call_tool("functions_rollback", {"name": name}))
            assert no_previous["reason"] == "FunctionConflict", no_previous

            answer = await mcp.call_tool("functions_invoke", {"name": name, "data": {"hi": 1}})
            assert structured(answer)["outputs"]["echo"] == {"hi": 1}
            listed = structured(await mcp.call_tool("functions_list", {"namespace": "default"}))
            [item] = [f for f in listed["items"] if f["name"] == name]
            assert item["uid"] == fn["metadata"]["uid"] and item["url"] == fn["status"]["endpoint"]["url"]

            scaled = structured(
                await mcp.call_tool("functions_scale", {"name": name, "replicas": 2, "message": "load"})
            )
            assert (scaled["previous"], scaled["wanted"]) == (1, 2)
            outside = refusal(await mcp.call_tool("functions_scale", {"name": name, "replicas": 3}))
            assert outside["reason"] == "FunctionConflict"
            rollout = structured(
                await mcp.call_tool("functions_rollout_status", {"name": name, "timeoutSeconds": 90})
            )
            assert rollout["rolledOut"] is True and rollout["status"]["replicas"]["ready"] == 2
            got = structured(await mcp.call_tool("functions_get", {"name": name, "replicas": True}))
            assert len({r["name"] for r in got["replicaRuns"]}) == 2
            assert await scale_reasons(krt, name) == ["by mcp:root: load"], "the history says who scaled it"

            deleted = structured(await mcp.call_tool("functions_delete", {"name": name}))
            assert deleted["deleted"] is True
            gone = refusal(await mcp.call_tool("functions_get", {"name": name}))
            assert gone["reason"] == "FunctionNotFound"
        finally:
            with contextlib.suppress(
                FunctionNotFound
            ):  # its replicas are Runs the platform fixture would delete
                await krt.functions.delete(name, timeout=120)
    log = mcp_http.log.read_text()
    assert f"functions_apply by mcp:root: function/{name} -n default" in log
    assert f"functions_scale by mcp:root: function/{name} -n default to 2" in log
    assert f"functions_delete by mcp:root: function/{name} -n default" in log


async def test_a_token_bound_to_another_namespace_is_refused_every_function_tool(
    platform: Platform, mcp_http: HttpServer
) -> None:
    arguments: dict[str, dict[str, Any]] = {
        "functions_apply": {"manifest": function("x")},
        "functions_get": {"name": "x"},
        "functions_list": {"namespace": "default"},
        "functions_scale": {"name": "x", "replicas": 1},
        "functions_rollout_status": {"name": "x", "wait": False},
        "functions_rollback": {"name": "x"},
        "functions_delete": {"name": "x"},
        "functions_invoke": {"name": "x", "data": {}},
    }
    assert set(arguments) == FUNCTION_TOOLS
    async with mcp_http.session(CAROL_TOKEN) as carol:
        for tool, given in arguments.items():
            error = refusal(await carol.call_tool(tool, given))
            assert error["reason"] == "Forbidden", (tool, error)
        assert refusal(await carol.call_tool("functions_list", {}))["reason"] == "Forbidden"
        # in her own namespace she is let through (to the platform, which has no such Function)
        own = refusal(await carol.call_tool("functions_get", {"name": "x", "namespace": "team-b"}))
        assert own["reason"] == "FunctionNotFound"
        # over HTTP a source path would be this server's directory, not the caller's
        path = function("x", namespace="team-b")
        path["spec"]["source"] = {"path": "/etc"}
        local = refusal(await carol.call_tool("functions_apply", {"manifest": path}))
        assert local["reason"] == "InvalidArguments" and local["message"].startswith(
            "manifest.spec.source.path"
        )
    async with Client(platform.config) as krt:
        assert "x" not in [f.name for f in await krt.functions.list()]
