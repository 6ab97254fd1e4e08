"""`krt mcp` with the official MCP SDK's client against the shared embedded platform."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import httpx2

from kruntimes.sdk.client import Client
from tests.mcp.conftest import (
    ADMIN_TOKEN,
    CAROL_TOKEN,
    DAVE_TOKEN,
    HttpServer,
    refusal,
    stdio_session,
    structured,
)
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

TOOLS = {
    "run_list",
    "run_get",
    "run_create",
    "run_wait",
    "run_cancel",
    "run_delete",
    "run_history",
    "invoke",
    "invoke_async",
    "invocation_get",
    "functions_apply",
    "functions_get",
    "functions_list",
    "functions_scale",
    "functions_rollout_status",
    "functions_rollback",
    "functions_delete",
    "functions_invoke",
    "hosts_list",
    "host_drain",
    "host_delete",
    "hosts_reconcile",
    "queue_list",
    "queue_pause",
    "queue_resume",
    "queue_drain",
    "schedule_list",
    "schedule_create",
    "schedule_pause",
    "schedule_trigger",
    "schedule_delete",
}
RUN_TOOLS: dict[str, dict[str, Any]] = {
    "run_list": {"namespace": "default"},
    "run_get": {"name": "x"},
    "run_create": {"manifest": manifest("x")},
    "run_wait": {"name": "x", "timeoutSeconds": 1},
    "run_cancel": {"name": "x"},
    "run_delete": {"name": "x"},
    "run_history": {"name": "x"},
    "invoke": {"name": "x", "data": {}},
}
ADMIN_TOOLS: dict[str, dict[str, Any]] = {
    "hosts_list": {},
    "host_drain": {"name": "no-such-host"},
    "host_delete": {"name": "no-such-host"},
    "hosts_reconcile": {},
    "queue_list": {"runtime": "python"},
    "queue_pause": {"runtime": "python"},
    "queue_resume": {"runtime": "python"},
    "queue_drain": {"runtime": "python"},
    "schedule_list": {"namespace": "team-b"},
    "schedule_create": {
        "name": "x",
        "namespace": "team-b",
        "manifest": manifest("x", namespace="team-b", mode={"task": {}}),
        "everySeconds": 3600,
    },
    "schedule_pause": {"name": "x", "namespace": "team-b"},
    "schedule_trigger": {"name": "x", "namespace": "team-b"},
    "schedule_delete": {"name": "x", "namespace": "team-b"},
}


async def test_over_stdio_an_agent_lists_the_tools_creates_waits_invokes_and_deletes_a_run(
    platform: Platform, tmp_path: Path
) -> None:
    async with stdio_session(platform, tmp_path / "mcp.log", identity="agent-1") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert set(tools) == TOOLS
        create = tools["run_create"].input_schema
        # the schemas are the API's models: a manifest is a Run, its spec a RunSpec
        assert {"Run", "RunSpec", "Metadata"} <= set(create["$defs"])
        assert tools["invoke"].input_schema["required"] == ["name"]
        assert tools["run_list"].input_schema["properties"]["phase"]

        name = unique("mcp")
        ready = structured(await mcp.call_tool("run_create", {"manifest": manifest(name), "wait": True}))
        assert ready["status"]["phase"] == "Ready"
        assert ready["metadata"]["creator"] == {"kind": "mcp", "subject": "agent-1"}
        answer = await mcp.call_tool("invoke", {"name": name, "data": {"hi": 1}})
        assert structured(answer)["outputs"]["echo"] == {"hi": 1}
        assert json.loads(answer.content[0].text)["echo"] == {"hi": 1}  # type: ignore[union-attr]
        status = await mcp.read_resource(f"krt://runs/default/{name}/status")
        assert json.loads(status.contents[0].text)["phase"] == "Ready"  # type: ignore[union-attr]
        history = structured(await mcp.call_tool("run_history", {"name": name}))
        assert history["phase"] == "Ready" and history["hosts"] and history["attempt"] == 1
        assert history["phaseReasons"][-1] == "FunctionRegistered"
        deleted = structured(await mcp.call_tool("run_delete", {"name": name}))
        assert deleted["deleted"] is True
        gone = refusal(await mcp.call_tool("run_get", {"name": name}))
        assert gone["reason"] == "RunNotFound"


async def test_a_bad_manifest_is_a_tool_error_naming_the_field_and_nothing_is_created(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("bad")
    bad = manifest(name)
    del bad["spec"]["handler"]
    bad["spec"]["timeoutSeconds"] = -1
    async with stdio_session(platform, tmp_path / "mcp.log") as mcp:
        error = refusal(await mcp.call_tool("run_create", {"manifest": bad}))
        assert error["reason"] == "InvalidArguments"
        assert (
            "manifest.spec.handler" in error["message"] and "manifest.spec.timeoutSeconds" in error["message"]
        )
        assert "Traceback" not in error["message"]
        unknown = refusal(await mcp.call_tool("run_get", {"name": "Not_A_Name"}))
        assert unknown["reason"] == "InvalidArguments" and unknown["message"].startswith("name:")
    async with Client(platform.config) as krt:
        assert name not in {r.metadata.name for r in await krt.list()}


async def test_over_https_a_token_bound_to_another_namespace_is_refused_every_run_and_admin_tool(
    platform: Platform, mcp_http: HttpServer
) -> None:
    async with mcp_http.session(CAROL_TOKEN) as mcp:
        for tool, arguments in {**RUN_TOOLS, **ADMIN_TOOLS}.items():
            error = refusal(await mcp.call_tool(tool, arguments))
            assert error["reason"] == "Forbidden", (tool, error)
        # in its own namespace it is let through (to the platform, which has no such Run)
        assert refusal(await mcp.call_tool("run_get", {"name": "x", "namespace": "team-b"}))["reason"] == (
            "RunNotFound"
        )
    # a token the authorizer does not know: 401 before the MCP layer reads the request
    async with httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(mcp_http.ca))) as http:
        answer = await http.post(mcp_http.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code == 401 and answer.json()["reason"] == "Unauthenticated"


async def test_over_https_two_clients_call_tools_at_once_and_a_mutating_call_is_recorded_with_its_caller(
    platform: Platform, mcp_http: HttpServer
) -> None:
    name = unique("audit")
    async with mcp_http.session(ADMIN_TOKEN) as admin, mcp_http.session(CAROL_TOKEN) as carol:
        created, hosts, listed, dave_refused = await asyncio.gather(
            carol.call_tool("run_create", {"manifest": manifest(name, namespace="team-b")}),
            admin.call_tool("hosts_list", {}),
            admin.call_tool("run_list", {}),
            carol.call_tool("run_list", {"namespace": "team-d"}),
        )
        assert structured(created)["metadata"]["creator"] == {"kind": "mcp", "subject": "carol"}
        assert structured(hosts)["items"] and "items" in structured(listed)
        assert refusal(dave_refused)["reason"] == "Forbidden"
        async with Client(platform.config) as krt:
            run = await krt.get(name, "team-b")
            assert run.metadata.creator is not None and str(run.metadata.creator) == "mcp:carol"
        await eventually(lambda: f"run_create by mcp:carol: run/{name} -n team-b" in mcp_http.log.read_text())
        structured(await carol.call_tool("run_delete", {"name": name, "namespace": "team-b"}))
    assert f"run_delete by mcp:carol: run/{name} -n team-b" in mcp_http.log.read_text()
    assert CAROL_TOKEN not in mcp_http.log.read_text() and ADMIN_TOKEN not in mcp_http.log.read_text()
    assert DAVE_TOKEN not in mcp_http.log.read_text()


async def test_over_https_an_invocation_carries_the_callers_own_token_and_the_gateway_decides_for_them(
    platform: Platform, mcp_http: HttpServer
) -> None:
    """This server binds carol to team-b; the gateway binds her nowhere. Her invoke through MCP is
    the gateway's refusal, for her: the server's own credentials (its client config's token, which
    may invoke anywhere) never invoke for a remote caller. The admin, whom the gateway binds, gets
    the answer."""
    name = unique("fwd")
    async with mcp_http.session(CAROL_TOKEN) as carol, mcp_http.session(ADMIN_TOKEN) as admin:
        created = await carol.call_tool(
            "run_create", {"manifest": manifest(name, namespace="team-b"), "wait": True}
        )
        assert structured(created)["status"]["phase"] == "Ready"
        refused = refusal(await carol.call_tool("invoke", {"name": name, "namespace": "team-b", "data": {}}))
        assert refused["reason"] == "Forbidden" and "user 'carol' may not invoke" in refused["message"], (
            refused
        )
        answer = await admin.call_tool(
            "invoke", {"name": name, "namespace": "team-b", "data": {"by": "root"}}
        )
        assert structured(answer)["outputs"]["echo"] == {"by": "root"}
    assert CAROL_TOKEN not in mcp_http.log.read_text()
