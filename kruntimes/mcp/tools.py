"""The tools: each an input model (its JSON schema is the tool's, made from the API's own pydantic
models: a manifest is `Run`, a spec `RunSpec`, a phase `RunPhase`) and a handler over the SDK.

Every input is validated, as a whole, before anything is touched; a handler returns its
structured result (a JSON object) and a short line for the model to read. A mutating tool (create,
cancel, delete, drain) is recorded with its caller: a Run records it as its creator (kind `mcp`),
a host action as its requestedBy in the HostWorkflow's history (as `krt hosts drain` does), and
every one as a line of the `kruntimes.mcp.audit` log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from kruntimes.api._base import validate_document
from kruntimes.api.limits import MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.names import validate_dns1123_label, validate_invocation_id
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import API_VERSION, KIND, Run
from kruntimes.api.spec import RunSpec
from kruntimes.cli.output import host_document
from kruntimes.mcp.access import EVERY_NAMESPACE, Caller
from kruntimes.mcp.errors import INVALID_ARGUMENTS, ToolError
from kruntimes.sdk.client import Client
from kruntimes.sdk.events import RunEvent
from kruntimes.sdk.results import RunObject

audit = logging.getLogger("kruntimes.mcp.audit")

MAX_WAIT_S = 600.0  # a tool call holds its caller at most this long (wait, create --wait, delete)
MAX_LIST = 500  # Runs a list answers with; more: narrow it by namespace or phase
MAX_EVENTS = 50


def _label(field: str) -> AfterValidator:
    return AfterValidator(lambda v: validate_dns1123_label(v, field=field))


Name = Annotated[str, Field(max_length=63, description="the Run's name"), _label("name")]
Namespace = Annotated[
    str, Field(max_length=63, description="the Run's namespace (default: default)"), _label("namespace")
]
WaitSeconds = Annotated[float, Field(gt=0, le=MAX_WAIT_S, description="give up after this many seconds")]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRef(_Input):
    name: Name
    namespace: Namespace = "default"


class RunListInput(_Input):
    namespace: Namespace | None = Field(default=None, description="one namespace (default: every one)")
    phase: RunPhase | None = Field(default=None, description="only Runs in this phase")


class RunCreateInput(_Input):
    """A Run from a whole manifest, or from its name, namespace and spec."""

    manifest: Run | None = Field(
        default=None, description="a Run manifest (apiVersion, kind, metadata, spec)"
    )
    name: Name | None = None
    namespace: Namespace | None = None
    spec: RunSpec | None = Field(default=None, description="the Run's spec, with name (not with manifest)")
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    wait: bool = Field(default=False, description="answer once it is Ready (function) or Succeeded (task)")
    waitTimeoutSeconds: WaitSeconds = 120.0


class RunWaitInput(RunRef):
    phase: RunPhase | None = Field(default=None, description="default: Ready (function), Succeeded (task)")
    timeoutSeconds: WaitSeconds = 120.0


class RunDeleteInput(RunRef):
    timeoutSeconds: WaitSeconds = 120.0


class InvokeInput(RunRef):
    data: Any = Field(default=None, description="the JSON payload the handler is called with")
    invocationId: Annotated[str, AfterValidator(validate_invocation_id)] | None = None
    timeoutSeconds: float | None = Field(default=None, gt=0, le=MAX_INVOKE_TIMEOUT_SECONDS)


class NoInput(_Input):
    pass


class HostDrainInput(_Input):
    name: Annotated[str, Field(min_length=1, max_length=253, description="the host, as hosts_list names it")]
    runtime: Annotated[str, Field(max_length=63), _label("runtime")] | None = None
    message: Annotated[str, Field(max_length=1024, description="why (kept in the host's history)")] = ""


@dataclass(frozen=True)
class Answer:
    structured: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Call:
    """One tool call: its validated input, who asked, and the clients it may use."""

    caller: Caller
    client: Client  # the server's own credentials (invoke, reads)
    creating: Callable[[Caller], Awaitable[Client]]  # a client whose Runs record the caller


Handler = Callable[[Any, Call], Awaitable[Answer]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    model: type[_Input]
    handler: Handler
    mutating: bool
    # what the caller needs: the namespace of the input ("namespace"), or every one (admin)
    scope: Literal["namespace", "admin"]

    def schema(self) -> dict[str, Any]:
        return self.model.model_json_schema()

    def validate(self, arguments: dict[str, Any] | None) -> Any:
        def invalid(problems: list[str]) -> ToolError:
            return ToolError(INVALID_ARGUMENTS, "; ".join(problems))

        return validate_document(
            self.model, arguments or {}, root="<arguments>", relocate=lambda p, n: None, error=invalid
        )


def namespace_of(args: Any) -> str:
    """The namespace a run tool acts in (a list of every namespace: EVERY_NAMESPACE)."""
    if isinstance(args, RunCreateInput):
        if args.manifest is not None:
            return args.manifest.metadata.namespace
        return args.namespace or "default"
    namespace = getattr(args, "namespace", None)
    return EVERY_NAMESPACE if namespace is None else str(namespace)


def _run(run: RunObject) -> dict[str, Any]:
    return run.manifest()


def _line(run: RunObject) -> str:
    status = run.status
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    why = f" ({ready.reason})" if ready is not None and ready.reason not in ("", status.phase.value) else ""
    return f"run/{run.metadata.name} -n {run.metadata.namespace}: {status.phase.value}{why}"


def _record(call: Call, tool: str, what: str) -> None:
    audit.info("%s by %s: %s", tool, call.caller.name, what)


# -- the handlers ------------------------------------------------------------------------------------


async def run_list(args: RunListInput, call: Call) -> Answer:
    runs = await call.client.list(namespace=args.namespace, phase=args.phase)
    shown = runs[:MAX_LIST]
    items = [
        {
            "name": r.metadata.name,
            "namespace": r.metadata.namespace,
            "uid": r.uid,
            "phase": r.status.phase.value,
            "runtime": r.spec.runtime,
            "host": r.status.assignedHost or None,
        }
        for r in shown
    ]
    more = f" (the first {MAX_LIST} of {len(runs)})" if len(runs) > len(shown) else ""
    text = f"{len(runs)} Run(s){more}" + "".join(f"\n{_line(r)}" for r in shown[:20])
    return Answer({"items": items, "total": len(runs)}, text)


async def run_get(args: RunRef, call: Call) -> Answer:
    run = await call.client.get(args.name, args.namespace)
    return Answer(_run(run), _line(run))


async def run_create(args: RunCreateInput, call: Call) -> Answer:
    if args.manifest is not None:
        given = [f for f in ("name", "namespace", "spec") if getattr(args, f) is not None] + (
            ["labels"] if args.labels else []
        )
        if given:
            raise ToolError(INVALID_ARGUMENTS, f"manifest takes the whole Run; drop {', '.join(given)}")
        run = args.manifest
    else:
        missing = [f for f in ("name", "spec") if getattr(args, f) is None]
        if missing:
            raise ToolError(INVALID_ARGUMENTS, f"{' and '.join(missing)} required (or a whole manifest)")
        assert args.spec is not None and args.name is not None
        run = Run.from_dict(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {
                    "name": args.name,
                    "namespace": args.namespace or "default",
                    "labels": args.labels,
                },
                "spec": args.spec.model_dump(mode="json", exclude_none=True),
            }
        )
    client = await call.creating(call.caller)
    _record(call, "run_create", f"run/{run.metadata.name} -n {run.metadata.namespace}")
    created = await client.create(run)
    if args.wait:
        created = await call.client.wait(
            run.metadata.name, run.metadata.namespace, timeout=args.waitTimeoutSeconds
        )
    return Answer(_run(created), _line(created) + ("" if args.wait else " (created)"))


async def run_wait(args: RunWaitInput, call: Call) -> Answer:
    run = await call.client.wait(args.name, args.namespace, until=args.phase, timeout=args.timeoutSeconds)
    return Answer(_run(run), _line(run))


async def run_cancel(args: RunRef, call: Call) -> Answer:
    _record(call, "run_cancel", f"run/{args.name} -n {args.namespace}")
    await call.client.cancel(args.name, args.namespace)
    return Answer(
        {"name": args.name, "namespace": args.namespace, "cancelRequested": True}, "cancel requested"
    )


async def run_delete(args: RunDeleteInput, call: Call) -> Answer:
    _record(call, "run_delete", f"run/{args.name} -n {args.namespace}")
    final = await call.client.delete(args.name, args.namespace, timeout=args.timeoutSeconds)
    return Answer(
        {"name": args.name, "namespace": args.namespace, "deleted": True, "finalPhase": final.phase.value},
        f"run/{args.name} deleted (it was {final.phase.value})",
    )


def _event(event: RunEvent) -> dict[str, Any]:
    return {
        "at": event.at.isoformat(),
        "kind": event.kind,
        "reason": event.reason,
        "message": event.message,
        "host": event.host or None,
        "attempt": event.attempt,
    }


async def run_history(args: RunRef, call: Call) -> Answer:
    """What the Run went through, from its history: phases, attempts, hosts, reasons. The SDK's
    events hold no secret (a failed host call is named by its failure's type only)."""
    run = await call.client.get(args.name, args.namespace)
    events = (await call.client.events(args.name, args.namespace))[-MAX_EVENTS:]
    # a phase event carries the reason the Run wrote with it (FunctionRegistered, HostLost, ...)
    phases = [e.reason for e in events if e.kind == "Phase"]
    hosts = sorted({e.host for e in events if e.host})
    summary = {
        "name": args.name,
        "namespace": args.namespace,
        "phase": run.status.phase.value,
        "attempt": run.status.attempt,
        "hosts": hosts,
        "phaseReasons": phases,
        "reasons": sorted({e.reason for e in events if e.kind != "Phase"}),
        "events": [_event(e) for e in events],
    }
    text = (
        f"run/{args.name}: {' -> '.join(phases) or run.status.phase.value}; "
        f"attempt {run.status.attempt}; hosts: {', '.join(hosts) or 'none'}"
    )
    return Answer(summary, text)


async def invoke(args: InvokeInput, call: Call) -> Answer:
    data = json.dumps(args.data, ensure_ascii=False).encode()
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ToolError(INVALID_ARGUMENTS, f"data: over {MAX_PAYLOAD_BYTES} bytes as JSON")
    result = await call.client.invoke(
        args.name,
        data,
        namespace=args.namespace,
        invocation_id=args.invocationId,
        timeout=args.timeoutSeconds,
    )
    text = json.dumps(result.outputs, ensure_ascii=False)
    return Answer(result.model_dump(mode="json"), text if len(text) <= 2000 else text[:2000] + "…")


async def hosts_list(args: NoInput, call: Call) -> Answer:
    views = await call.client.hosts()
    items = [host_document(v) for v in views]
    lines = [f"{v.host.hostId} ({v.host.runtime}) {v.host.state} used {v.used}" for v in views]
    return Answer({"items": items}, f"{len(views)} host(s)" + "".join(f"\n{x}" for x in lines))


async def host_drain(args: HostDrainInput, call: Call) -> Answer:
    _record(call, "host_drain", f"host/{args.name}")
    result = await call.client.drain_host(
        args.name, runtime=args.runtime, message=args.message, requested_by=call.caller.name
    )
    done = "drained" if result.accepted else "not drained"
    return Answer(
        result.model_dump(mode="json"), f"host {result.hostId} ({result.runtime}): {done}, {result.state}"
    )


TOOLS: tuple[Tool, ...] = (
    Tool(
        "run_list",
        "List the Runs, of one namespace or all, optionally of one phase.",
        RunListInput,
        run_list,
        False,
        "namespace",
    ),
    Tool("run_get", "A Run's manifest and status.", RunRef, run_get, False, "namespace"),
    Tool(
        "run_create",
        "Create a Run from a manifest, or from name, namespace and spec; optionally wait "
        "until it is Ready (function) or Succeeded (task).",
        RunCreateInput,
        run_create,
        True,
        "namespace",
    ),
    Tool(
        "run_wait",
        "Wait until a Run reaches a phase (default Ready or Succeeded); a Run that ends "
        "otherwise is an error (RunFailed).",
        RunWaitInput,
        run_wait,
        False,
        "namespace",
    ),
    Tool(
        "run_cancel",
        "Ask a Run to stop (it stays listed until deleted).",
        RunRef,
        run_cancel,
        True,
        "namespace",
    ),
    Tool(
        "run_delete",
        "Cancel a Run if needed, clean it up and remove it.",
        RunDeleteInput,
        run_delete,
        True,
        "namespace",
    ),
    Tool(
        "run_history",
        "What a Run went through: its phases, attempts, hosts and reasons (no secret).",
        RunRef,
        run_history,
        False,
        "namespace",
    ),
    Tool(
        "invoke",
        "Invoke a Ready function Run once through the gateway and return its answer; never retried.",
        InvokeInput,
        invoke,
        False,
        "namespace",
    ),
    Tool(
        "hosts_list",
        "The runtime hosts the pools hold, with the run slots used on each (admin).",
        NoInput,
        hosts_list,
        False,
        "admin",
    ),
    Tool(
        "host_drain",
        "Take no new Run on a host and move its Runs off it; it is deleted once empty "
        "(admin; recorded in the host's history with who asked).",
        HostDrainInput,
        host_drain,
        True,
        "admin",
    ),
)
BY_NAME = {tool.name: tool for tool in TOOLS}
