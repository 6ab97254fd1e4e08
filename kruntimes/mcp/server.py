"""The MCP server: the official SDK's low-level `Server` over the tools of kruntimes.mcp.tools,
and two resources (a Run's status, the hosts' table). The transports are the SDK's: stdio
(`serve_stdio`) and streamable HTTP (`http_app`, which kruntimes.workers.mcp serves over TLS).

A call goes: the tool by name; its arguments validated whole (nothing touched yet); the caller
asked for the authority the tool needs (the Run or Function the input names, its namespace for a
listing, or every namespace for a host, queue or schedule tool); then the handler. Any refusal is
an MCP tool error (isError) with a stable reason and one line; a handler's unexpected exception
is logged here, and the caller sees only its type.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext

from kruntimes.api.names import validate_dns1123_label
from kruntimes.mcp.access import EVERY_NAMESPACE, Access, Caller, Target
from kruntimes.mcp.errors import INVALID_ARGUMENTS, ToolError, tool_error
from kruntimes.mcp.invokers import Invokers
from kruntimes.mcp.tools import (
    BY_NAME,
    TOOLS,
    Answer,
    Call,
    FunctionApplyInput,
    RunCreateInput,
    ScheduleCreateInput,
    hosts_list,
    target_of,
)
from kruntimes.sdk.client import Client

log = logging.getLogger(__name__)

NAME = "kruntimes"
HOSTS_URI = "krt://hosts"
RUN_STATUS_TEMPLATE = "krt://runs/{namespace}/{name}/status"
_RUN_STATUS = re.compile(r"krt://runs/([^/]{1,63})/([^/]{1,63})/status")
# what may end a Run or lose queued work (an agent's client asks before such a call)
DESTRUCTIVE = frozenset(
    {
        "run_delete",
        "run_cancel",
        "functions_delete",
        "host_drain",
        "host_delete",
        "queue_pause",
        "queue_drain",
        "schedule_delete",
    }
)
INSTRUCTIONS = (
    "kruntimes runs user functions on a pool of runtime hosts. A Run is a function (invoke it once "
    "Ready) or a task (it runs once). Create one with run_create, wait for it with run_wait, call "
    "it with invoke, remove it with run_delete. A Function (functions_apply) is a function Run's "
    "spec served by replicas behind one URL: functions_invoke calls it. Errors carry a stable reason."
)


class Platform:
    """The SDK clients the tools use: the server's own (its config's credentials), and one per
    creator identity for run_create, sharing its Temporal connection."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._creating: dict[str | None, Client] = {}
        self.invokers = Invokers(client.config)

    async def creating(self, caller: Caller) -> Client:
        found = self._creating.get(caller.identity)
        if found is None:
            temporal = await self.client.temporal()
            config = self.client.config._replace(identity=caller.identity)
            found = Client(config, temporal=temporal, creator_kind="mcp")
            self._creating[caller.identity] = found
        return found

    async def close(self) -> None:
        for client in self._creating.values():
            await client.close()
        await self.invokers.close()
        await self.client.close()


def _result(answer: Answer) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer.text)], structured_content=answer.structured
    )


def _error(error: ToolError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{error.reason}: {error.message}")],
        structured_content={"reason": error.reason, "message": error.message},
        is_error=True,
    )


def _check_source(args: Any, access: Access) -> None:
    """Over HTTP a Run's source.path would name a directory of the server's machine, not the
    caller's: only inline sources are taken."""
    if not access.remote or not isinstance(args, RunCreateInput | ScheduleCreateInput | FunctionApplyInput):
        return
    spec = args.manifest.spec if args.manifest is not None else args.spec
    if spec is not None and spec.source.path is not None:
        where = "manifest.spec" if args.manifest is not None else "spec"
        raise ToolError(INVALID_ARGUMENTS, f"{where}.source.path: over HTTP send source.inline instead")


def build(platform: Platform, access: Access) -> Server[Any]:
    """The low-level MCP server of the tools and resources, acting through `platform`'s clients
    with what `access` grants each caller."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=tool.name,
                    description=tool.description,
                    input_schema=tool.schema(),
                    annotations=types.ToolAnnotations(
                        read_only_hint=not tool.mutating,
                        destructive_hint=tool.name in DESTRUCTIVE,
                    ),
                )
                for tool in TOOLS
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:
            return _error(ToolError("UnknownTool", f"no tool {params.name[:64]!r}; tools/list lists them"))
        try:
            args = tool.validate(dict(params.arguments or {}))
            caller = await access.caller(ctx.request, target_of(tool, args))
            _check_source(args, access)
            call = Call(
                caller=caller, client=platform.client, creating=platform.creating, invokers=platform.invokers
            )
            return _result(await tool.handler(args, call))
        except Exception as e:
            error = tool_error(e)
            if error.reason == "Internal":
                log.exception("tool %s failed", tool.name)
            return _error(error)

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name="hosts",
                    uri=HOSTS_URI,
                    description="the runtime hosts and the run slots used on each (admin)",
                    mime_type="application/json",
                )
            ]
        )

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="run-status",
                    uri_template=RUN_STATUS_TEMPLATE,
                    description="a Run's status (phase, conditions, endpoint, host, attempt)",
                    mime_type="application/json",
                )
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == HOSTS_URI:
            caller = await _resource_caller(ctx, Target(EVERY_NAMESPACE))
            call = Call(
                caller=caller, client=platform.client, creating=platform.creating, invokers=platform.invokers
            )
            document: Any = (await hosts_list(None, call)).structured  # type: ignore[arg-type]
        else:
            match = _RUN_STATUS.fullmatch(uri)
            if match is None:
                raise ValueError(f"no resource {uri[:100]!r}: {HOSTS_URI} or {RUN_STATUS_TEMPLATE}")
            namespace, name = match.groups()
            validate_dns1123_label(namespace, field="namespace")
            validate_dns1123_label(name, field="name")
            await _resource_caller(ctx, Target(namespace, name))
            document = (await platform.client.status(name, namespace)).model_dump(
                mode="json", exclude_none=True
            )
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(document))
            ]
        )

    async def _resource_caller(ctx: ServerRequestContext[Any], target: Target) -> Caller:
        try:
            return await access.caller(ctx.request, target)
        except ToolError as e:
            raise PermissionError(f"{e.reason}: {e.message}") from None

    return Server(
        NAME,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


async def serve_stdio(platform: Platform, access: Access) -> None:
    """Serve one client on stdin and stdout until it closes them."""
    from mcp.server.stdio import stdio_server

    server = build(platform, access)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


@asynccontextmanager
async def http_app(platform: Platform, access: Access, *, host: str) -> AsyncIterator[Any]:
    """The streamable HTTP app (ASGI) at /mcp, stateless (each request stands alone, so a token
    is checked on every one), running its session manager while in use."""
    server = build(platform, access)
    app = server.streamable_http_app(stateless_http=True, json_response=True, host=host)
    async with server.session_manager.run():
        yield app
