"""The tools: each an input model (its JSON schema is the tool's, made from the API's own pydantic
models: a manifest is `Run` or `Function`, a spec `RunSpec` or `FunctionSpec`, a phase `RunPhase`)
and a handler over the SDK.

Every input is validated, as a whole, before anything is touched; a handler returns its
structured result (a JSON object) and a short line for the model to read. A mutating tool is
recorded with its caller: a Run or a Function records it as its creator (kind `mcp`), a schedule's
Runs as theirs (kind `schedule`), a Function's scale as its reason in the Function's history, a host
action as its requestedBy in the HostWorkflow's history and a queue
action in the pool's (as `krt hosts drain` and `krt queue pause` do), and every one as a line of
the `kruntimes.mcp.audit` log.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from kruntimes.api._base import validate_document
from kruntimes.api.function import FUNCTION_KIND, Function, FunctionSpec, FunctionStatus
from kruntimes.api.limits import (
    MAX_FUNCTION_NAME_CHARS,
    MAX_FUNCTION_REPLICAS,
    MAX_INVOKE_TIMEOUT_SECONDS,
    MAX_PAYLOAD_BYTES,
)
from kruntimes.api.names import validate_dns1123_label, validate_invocation_id
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import API_VERSION, KIND, Run
from kruntimes.api.spec import MAX_CALLBACK_URL_CHARS, RunSpec
from kruntimes.api.status import Endpoint
from kruntimes.cli.output import host_document, reconcile_line
from kruntimes.mcp.access import EVERY_NAMESPACE, FUNCTIONS, RUNS, Caller, Kind, Target
from kruntimes.mcp.errors import INVALID_ARGUMENTS, ToolError
from kruntimes.mcp.invokers import Invokers
from kruntimes.sdk.client import Client
from kruntimes.sdk.events import RunEvent
from kruntimes.sdk.functions import rolled_out
from kruntimes.sdk.invocations import Invocations
from kruntimes.sdk.invoke import endpoint_of
from kruntimes.sdk.results import FunctionObject, InvokeResult, RunObject
from kruntimes.sdk.schedules import (
    MAX_INTERVAL,
    MAX_NOTE_LENGTH,
    MIN_INTERVAL,
    OVERLAPS,
    Overlap,
    ScheduleView,
)

if TYPE_CHECKING:
    from kruntimes.sdk.runs import Runs

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


class InvokeAsyncInput(InvokeInput):
    function: bool = Field(default=False, description="name is a Function's (default: a Run's)")
    callbackUrl: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CALLBACK_URL_CHARS,
        description="https URL the status is POSTed to when it ends, in place of the target's callback "
        "(an origin the gateway allows the namespace)",
    )


class InvocationGetInput(RunRef):
    invocationId: Annotated[str, AfterValidator(validate_invocation_id)]
    function: bool = Field(default=False, description="name is a Function's (default: a Run's)")
    waitSeconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WAIT_S,
        description="wait up to this long for it to end (default: answer now)",
    )


class NoInput(_Input):
    pass


FunctionName = Annotated[
    str, Field(max_length=MAX_FUNCTION_NAME_CHARS, description="the Function's name"), _label("name")
]
FunctionNamespace = Annotated[
    str, Field(max_length=63, description="the Function's namespace (default: default)"), _label("namespace")
]


class FunctionRef(_Input):
    name: FunctionName
    namespace: FunctionNamespace = "default"


class FunctionListInput(_Input):
    namespace: FunctionNamespace | None = Field(
        default=None, description="one namespace (default: every one)"
    )


class FunctionApplyInput(_Input):
    """A Function from a whole manifest, or from its name, namespace and spec: created, or the
    running one changed (a new revision when the replicas' template changed)."""

    manifest: Function | None = Field(
        default=None, description="a Function manifest (apiVersion, kind Function, metadata, spec)"
    )
    name: FunctionName | None = None
    namespace: FunctionNamespace | None = None
    spec: FunctionSpec | None = Field(
        default=None,
        description="the Function's spec (a function Run's, and scale), with name (not with manifest)",
    )
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    wait: bool = Field(default=False, description="answer once every wanted replica of it is Ready")
    waitTimeoutSeconds: WaitSeconds = 120.0


class FunctionGetInput(FunctionRef):
    replicas: bool = Field(default=False, description="also each replica Run (name, uid, revision, phase)")


class FunctionScaleInput(FunctionRef):
    replicas: int = Field(
        ge=0, le=MAX_FUNCTION_REPLICAS, description="replicas wanted, within spec.scale.min..max"
    )
    message: Annotated[
        str, Field(max_length=200, description="why (kept in the Function's history with who asked)")
    ] = ""


class FunctionRolloutInput(FunctionRef):
    wait: bool = Field(
        default=True, description="until the current revision is rolled out (false: where it is now)"
    )
    timeoutSeconds: WaitSeconds = 300.0


class FunctionRollbackInput(FunctionRef):
    wait: bool = Field(default=False, description="answer once the new revision is rolled out")
    waitTimeoutSeconds: WaitSeconds = 300.0


class FunctionDeleteInput(FunctionRef):
    timeoutSeconds: WaitSeconds = 120.0


class FunctionInvokeInput(FunctionRef):
    data: Any = Field(default=None, description="the JSON payload the handler is called with")
    invocationId: Annotated[str, AfterValidator(validate_invocation_id)] | None = None
    timeoutSeconds: float | None = Field(default=None, gt=0, le=MAX_INVOKE_TIMEOUT_SECONDS)


HostName = Annotated[str, Field(min_length=1, max_length=253, description="the host, as hosts_list names it")]
RuntimeName = Annotated[str, Field(max_length=63, description="the runtime (its pool)"), _label("runtime")]
Why = Annotated[str, Field(max_length=1024, description="why (kept in the history with who asked)")]


class HostActionInput(_Input):
    name: HostName
    runtime: RuntimeName | None = None
    message: Why = ""


class ReconcileInput(_Input):
    runtime: RuntimeName | None = Field(default=None, description="only this runtime (default: every one)")


class QueueInput(_Input):
    runtime: RuntimeName


class QueueActionInput(QueueInput):
    message: Why = ""


ScheduleName = Annotated[str, Field(max_length=63, description="the schedule's name"), _label("name")]
Note = Annotated[str, Field(max_length=MAX_NOTE_LENGTH, description="a note shown with the schedule")]


class ScheduleListInput(_Input):
    namespace: Namespace | None = Field(default=None, description="one namespace (default: every one)")


class ScheduleRef(_Input):
    name: ScheduleName
    namespace: Annotated[
        str,
        Field(max_length=63, description="the schedule's namespace (default: default)"),
        _label("namespace"),
    ] = "default"


class ScheduleCreateInput(ScheduleRef):
    """A schedule starting the task Run `manifest` (its name is the schedule's to set: each start
    is the Run `<name>-<yyyymmddhhmmss>`) on a cron expression or an interval."""

    manifest: Run = Field(description="the task Run each start creates (spec.mode.task)")
    cron: str | None = Field(
        default=None, max_length=200, description="a cron expression, UTC (5, 6 or 7 fields, or @hourly...)"
    )
    everySeconds: float | None = Field(
        default=None,
        ge=MIN_INTERVAL.total_seconds(),
        le=MAX_INTERVAL.total_seconds(),
        description="start one every this many seconds (instead of cron)",
    )
    overlap: Overlap = Field(default="skip", description=f"while the last Run runs: {', '.join(OVERLAPS)}")
    paused: bool = Field(default=False, description="create it paused")
    note: Note = ""


class SchedulePauseInput(ScheduleRef):
    paused: bool = Field(default=True, description="false: unpause it")
    note: Note = ""


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
    invokers: Invokers  # the gateway sessions of the callers' own tokens (HTTP)


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
    kind: Kind = RUNS  # what a namespace tool's access review names

    def schema(self) -> dict[str, Any]:
        return self.model.model_json_schema()

    def validate(self, arguments: dict[str, Any] | None) -> Any:
        def invalid(problems: list[str]) -> ToolError:
            return ToolError(INVALID_ARGUMENTS, "; ".join(problems))

        return validate_document(
            self.model, arguments or {}, root="<arguments>", relocate=lambda p, n: None, error=invalid
        )


# What each namespace tool does to its Run or Function, as Kubernetes verbs: in a cluster the
# caller needs each on the exact object (an apply creates or changes: both). Any other tool reads
# (`get`; a listing `list`).
VERBS: dict[str, tuple[str, ...]] = {
    "run_list": ("list",),
    "run_create": ("create",),
    "run_cancel": ("update",),
    "run_delete": ("delete",),
    "functions_list": ("list",),
    "functions_apply": ("create", "update"),
    "functions_scale": ("update",),
    "functions_rollback": ("update",),
    "functions_delete": ("delete",),
}


def target_of(tool: Tool, args: Any) -> Target:
    """What a call acts on, for the access check: every namespace for an admin tool; else the
    Run or Function the input names (its namespace as a whole for a listing; every namespace for
    a listing of all), with what the tool does to it (VERBS)."""
    if tool.scope == "admin":
        return Target(EVERY_NAMESPACE)
    verbs = VERBS.get(tool.name, ("get",))
    if getattr(args, "function", False):  # an invocation tool's target is a Function
        return Target(str(args.namespace), str(args.name), FUNCTIONS, verbs)
    if isinstance(args, RunCreateInput | FunctionApplyInput):
        if args.manifest is not None:
            meta = args.manifest.metadata
            return Target(meta.namespace, meta.name, tool.kind, verbs)
        return Target(args.namespace or "default", args.name or "", tool.kind, verbs)
    namespace = getattr(args, "namespace", None)
    if namespace is None:
        return Target(EVERY_NAMESPACE, "", tool.kind, verbs)
    return Target(str(namespace), str(getattr(args, "name", "")), tool.kind, verbs)


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


def _from_fields(args: RunCreateInput | FunctionApplyInput, *, what: str, kind: str) -> dict[str, Any]:
    """The manifest a create or apply call names by its fields (name, namespace, labels, spec);
    a whole manifest given with any of them is refused."""
    if args.manifest is not None:
        given = [f for f in ("name", "namespace", "spec") if getattr(args, f) is not None] + (
            ["labels"] if args.labels else []
        )
        raise ToolError(INVALID_ARGUMENTS, f"manifest takes the whole {what}; drop {', '.join(given)}")
    missing = [f for f in ("name", "spec") if getattr(args, f) is None]
    if missing or args.spec is None:
        raise ToolError(INVALID_ARGUMENTS, f"{' and '.join(missing)} required (or a whole manifest)")
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": args.name, "namespace": args.namespace or "default", "labels": args.labels},
        "spec": args.spec.model_dump(mode="json", exclude_none=True),
    }


def _manifest_only(args: RunCreateInput | FunctionApplyInput) -> bool:
    """None of the fields that would build a manifest (a whole one is given instead)."""
    return all(getattr(args, f) is None for f in ("name", "namespace", "spec")) and not args.labels


async def run_create(args: RunCreateInput, call: Call) -> Answer:
    if args.manifest is not None and _manifest_only(args):
        run = args.manifest
    else:
        run = Run.from_dict(_from_fields(args, what="Run", kind=KIND))
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


def _payload(data: Any) -> bytes:
    body = json.dumps(data, ensure_ascii=False).encode()
    if len(body) > MAX_PAYLOAD_BYTES:
        raise ToolError(INVALID_ARGUMENTS, f"data: over {MAX_PAYLOAD_BYTES} bytes as JSON")
    return body


def _answered(result: InvokeResult) -> Answer:
    text = json.dumps(result.outputs, ensure_ascii=False)
    return Answer(result.model_dump(mode="json"), text if len(text) <= 2000 else text[:2000] + "…")


async def _as_caller(
    call: Call, endpoint: Endpoint, data: bytes, *, invocation_id: str | None, timeout: float | None
) -> InvokeResult:
    """One POST to `endpoint` at the gateway with the caller's own bearer token (HTTP), so the
    gateway decides again, for the caller, as if they had called it themselves: this server's
    credentials never invoke for a remote caller."""
    assert call.caller.token is not None
    async with call.invokers.of(call.caller.token) as invoker:
        return await invoker.send(endpoint, data, invocation_id=invocation_id, timeout=timeout)


async def invoke(args: InvokeInput, call: Call) -> Answer:
    data = _payload(args.data)
    if call.caller.token is None:  # stdio: the local user's config, as `krt invoke`
        result = await call.client.invoke(
            args.name,
            data,
            namespace=args.namespace,
            invocation_id=args.invocationId,
            timeout=args.timeoutSeconds,
        )
        return _answered(result)
    # the Client has the Runs' status and get that endpoint_of reads
    endpoint = await endpoint_of(args.name, namespace=args.namespace, runs=cast("Runs", call.client))
    return _answered(
        await _as_caller(call, endpoint, data, invocation_id=args.invocationId, timeout=args.timeoutSeconds)
    )


async def _invocations(call: Call, stack: contextlib.AsyncExitStack) -> Invocations:
    """The invocation calls as this caller makes them: stdio, the config's token (as `krt invoke
    --async`); HTTP, the caller's own token, so the gateway decides again for them."""
    if call.caller.token is None:
        return call.client.invocations
    invoker = await stack.enter_async_context(call.invokers.of(call.caller.token))
    return call.client.invocations.through(invoker)


async def invoke_async(args: InvokeAsyncInput, call: Call) -> Answer:
    data = _payload(args.data)
    async with contextlib.AsyncExitStack() as stack:
        invocations = await _invocations(call, stack)
        accepted = await invocations.submit(
            args.name,
            data,
            namespace=args.namespace,
            function=args.function,
            invocation_id=args.invocationId,
            timeout=args.timeoutSeconds,
            callback_url=args.callbackUrl,
        )
    return Answer(
        accepted.model_dump(mode="json"),
        f"invocation {accepted.invocationId} accepted ({accepted.state.value}); "
        "invocation_get reads it by that id",
    )


async def invocation_get(args: InvocationGetInput, call: Call) -> Answer:
    async with contextlib.AsyncExitStack() as stack:
        invocations = await _invocations(call, stack)
        kwargs: dict[str, Any] = {"namespace": args.namespace, "function": args.function}
        if args.waitSeconds is None:
            status = await invocations.get(args.name, args.invocationId, **kwargs)
        else:
            status = await invocations.wait(args.name, args.invocationId, timeout=args.waitSeconds, **kwargs)
    error = f": {status.error.reason}" if status.error is not None else ""
    return Answer(status.document(), f"invocation {status.invocationId} {status.state.value}{error}")


# -- Functions -----------------------------------------------------------------------------------


def _function_line(fn: FunctionObject) -> str:
    status = fn.status
    replicas = status.replicas
    return (
        f"function/{fn.name} -n {fn.namespace}: {status.phase.value}, revision {status.revision}, "
        f"{replicas.ready}/{replicas.wanted} replicas ready"
    )


def _status_line(name: str, status: FunctionStatus) -> str:
    done = "rolled out" if rolled_out(status) else f"rolling out (observed {status.observedRevision})"
    return (
        f"function/{name}: revision {status.revision} {done}, "
        f"{status.replicas.ready}/{status.replicas.wanted} replicas ready, {status.replicas.total} in all"
    )


async def functions_apply(args: FunctionApplyInput, call: Call) -> Answer:
    if args.manifest is not None and _manifest_only(args):
        function = args.manifest
    else:
        function = Function.from_dict(_from_fields(args, what="Function", kind=FUNCTION_KIND))
    name, namespace = function.metadata.name, function.metadata.namespace
    client = await call.creating(call.caller)  # the Function records the caller as its creator
    _record(call, "functions_apply", f"function/{name} -n {namespace}")
    applied = await client.functions.apply(function)
    fn = applied.function
    if args.wait:
        fn = await call.client.functions.wait_ready(name, namespace, timeout=args.waitTimeoutSeconds)
    return Answer(
        {"action": applied.action, "function": fn.manifest()}, f"{_function_line(fn)} ({applied.action})"
    )


async def functions_get(args: FunctionGetInput, call: Call) -> Answer:
    if not args.replicas:
        fn = await call.client.functions.get(args.name, args.namespace)
        return Answer(fn.manifest(), _function_line(fn))
    described = await call.client.functions.describe(args.name, args.namespace)
    replicas = [r.model_dump(mode="json") for r in described.replicas]
    fn = described.function
    lines = "".join(f"\n{r['name']} r{r['revision']} {r['phase']}" for r in replicas[:20])
    return Answer({**fn.manifest(), "replicaRuns": replicas}, _function_line(fn) + lines)


async def functions_list(args: FunctionListInput, call: Call) -> Answer:
    found = await call.client.functions.list(args.namespace)
    shown = found[:MAX_LIST]
    items = [
        {
            "name": f.name,
            "namespace": f.namespace,
            "uid": f.uid,
            "runtime": f.spec.runtime,
            "phase": f.status.phase.value,
            "revision": f.status.revision,
            "ready": f.status.replicas.ready,
            "wanted": f.status.replicas.wanted,
            "url": f.status.endpoint.url if f.status.endpoint is not None else None,
        }
        for f in shown
    ]
    more = f" (the first {MAX_LIST} of {len(found)})" if len(found) > len(shown) else ""
    text = f"{len(found)} Function(s){more}" + "".join(f"\n{_function_line(f)}" for f in shown[:20])
    return Answer({"items": items, "total": len(found)}, text)


async def functions_scale(args: FunctionScaleInput, call: Call) -> Answer:
    _record(call, "functions_scale", f"function/{args.name} -n {args.namespace} to {args.replicas}")
    # the reason is the Update's argument: the Function's history keeps who asked
    reason = f"by {call.caller.name}" + (f": {args.message}" if args.message else "")
    result = await call.client.functions.scale(args.name, args.replicas, args.namespace, reason=reason)
    return Answer(
        {"name": args.name, "namespace": args.namespace, **result.model_dump(mode="json")},
        f"function/{args.name}: {result.previous} -> {result.wanted} replicas wanted",
    )


async def functions_rollout_status(args: FunctionRolloutInput, call: Call) -> Answer:
    status = await call.client.functions.rollout_status(
        args.name, args.namespace, wait=args.wait, timeout=args.timeoutSeconds
    )
    return Answer(
        {
            "name": args.name,
            "namespace": args.namespace,
            "rolledOut": rolled_out(status),
            "status": status.model_dump(mode="json", exclude_none=True),
        },
        _status_line(args.name, status),
    )


async def functions_rollback(args: FunctionRollbackInput, call: Call) -> Answer:
    _record(call, "functions_rollback", f"function/{args.name} -n {args.namespace}")
    fn = await call.client.functions.rollback(args.name, args.namespace)
    if args.wait:
        await call.client.functions.rollout_status(args.name, args.namespace, timeout=args.waitTimeoutSeconds)
        fn = await call.client.functions.get(args.name, args.namespace)
    return Answer(fn.manifest(), _function_line(fn) + " (rolled back)")


async def functions_delete(args: FunctionDeleteInput, call: Call) -> Answer:
    _record(call, "functions_delete", f"function/{args.name} -n {args.namespace}")
    await call.client.functions.delete(args.name, args.namespace, timeout=args.timeoutSeconds)
    return Answer(
        {"name": args.name, "namespace": args.namespace, "deleted": True}, f"function/{args.name} deleted"
    )


async def functions_invoke(args: FunctionInvokeInput, call: Call) -> Answer:
    data = _payload(args.data)
    if call.caller.token is None:  # stdio: the local user's config, as `krt function invoke`
        result = await call.client.functions.invoke(
            args.name,
            data,
            namespace=args.namespace,
            invocation_id=args.invocationId,
            timeout=args.timeoutSeconds,
        )
        return _answered(result)
    endpoint = await call.client.functions.endpoint(args.name, args.namespace)
    return _answered(
        await _as_caller(call, endpoint, data, invocation_id=args.invocationId, timeout=args.timeoutSeconds)
    )


async def hosts_list(args: NoInput, call: Call) -> Answer:
    views = await call.client.hosts()
    items = [host_document(v) for v in views]
    lines = [f"{v.host.hostId} ({v.host.runtime}) {v.host.state} used {v.used}" for v in views]
    return Answer({"items": items}, f"{len(views)} host(s)" + "".join(f"\n{x}" for x in lines))


async def host_drain(args: HostActionInput, call: Call) -> Answer:
    _record(call, "host_drain", f"host/{args.name}")
    result = await call.client.drain_host(
        args.name, runtime=args.runtime, message=args.message, requested_by=call.caller.name
    )
    done = "drained" if result.accepted else "not drained"
    return Answer(
        result.model_dump(mode="json"), f"host {result.hostId} ({result.runtime}): {done}, {result.state}"
    )


async def host_delete(args: HostActionInput, call: Call) -> Answer:
    _record(call, "host_delete", f"host/{args.name}")
    result = await call.client.delete_host(
        args.name, runtime=args.runtime, message=args.message, requested_by=call.caller.name
    )
    done = "deleted" if result.accepted else "not deleted"
    return Answer(
        result.model_dump(mode="json"), f"host {result.hostId} ({result.runtime}): {done}, {result.state}"
    )


async def hosts_reconcile(args: ReconcileInput, call: Call) -> Answer:
    _record(call, "hosts_reconcile", f"runtime {args.runtime or '*'}")
    reports = await call.client.reconcile(args.runtime)
    return Answer(
        {"items": [r.model_dump(mode="json") for r in reports]},
        "\n".join(reconcile_line(r) for r in reports) or "no runtime reconciled",
    )


def _queue_line(runtime: str, paused: bool, queued: int, by: str = "") -> str:
    state = f"paused{f' by {by}' if by else ''}" if paused else "admitting"
    return f"runtime {runtime}: {state}, {queued} queued"


async def queue_list(args: QueueInput, call: Call) -> Answer:
    view = await call.client.queue(args.runtime)
    return Answer(
        view.model_dump(mode="json"), _queue_line(view.runtime, view.paused, len(view.queued), view.by)
    )


def _queue_action(verb: Literal["pause", "resume", "drain"]) -> Handler:
    async def act(args: QueueActionInput, call: Call) -> Answer:
        _record(call, f"queue_{verb}", f"runtime {args.runtime}")
        method = {
            "pause": call.client.pause_queue,
            "resume": call.client.resume_queue,
            "drain": call.client.drain_queue,
        }
        result = await method[verb](args.runtime, message=args.message, requested_by=call.caller.name)
        return Answer(
            result.model_dump(mode="json"), _queue_line(result.runtime, result.paused, result.queued)
        )

    return act


def _schedule_line(view: ScheduleView) -> str:
    when = f"cron {view.cron}" if view.cron else f"every {view.document()['every']}"
    return f"schedule/{view.name} -n {view.namespace}: {when}{' (paused)' if view.paused else ''}"


async def schedule_list(args: ScheduleListInput, call: Call) -> Answer:
    views = (await call.client.schedules.list(args.namespace))[:MAX_LIST]
    return Answer(
        {"items": [v.document() for v in views]},
        f"{len(views)} schedule(s)" + "".join(f"\n{_schedule_line(v)}" for v in views[:20]),
    )


async def schedule_create(args: ScheduleCreateInput, call: Call) -> Answer:
    if (args.cron is None) == (args.everySeconds is None):
        raise ToolError(INVALID_ARGUMENTS, "give exactly one of cron and everySeconds")
    every = timedelta(seconds=args.everySeconds) if args.everySeconds is not None else None
    # a client with the caller's identity: the schedule's Runs record it (kind `schedule`)
    client = await call.creating(call.caller)
    _record(call, "schedule_create", f"schedule/{args.name} -n {args.namespace}")
    view = await client.schedules.create(
        args.name,
        args.manifest,
        namespace=args.namespace,
        cron=args.cron,
        every=every,
        overlap=args.overlap,
        paused=args.paused,
        note=args.note,
    )
    return Answer(view.document(), _schedule_line(view) + " (created)")


async def schedule_pause(args: SchedulePauseInput, call: Call) -> Answer:
    verb = "paused" if args.paused else "unpaused"
    _record(call, "schedule_pause", f"schedule/{args.name} -n {args.namespace} {verb}")
    act = call.client.schedules.pause if args.paused else call.client.schedules.unpause
    await act(args.name, args.namespace, note=args.note or f"{verb} by {call.caller.name}")
    view = await call.client.schedules.get(args.name, args.namespace)
    return Answer(view.document(), _schedule_line(view))


async def schedule_trigger(args: ScheduleRef, call: Call) -> Answer:
    _record(call, "schedule_trigger", f"schedule/{args.name} -n {args.namespace}")
    await call.client.schedules.trigger(args.name, args.namespace)
    return Answer(
        {"name": args.name, "namespace": args.namespace, "triggered": True},
        f"schedule/{args.name} triggered (its Run is {args.name}-<yyyymmddhhmmss>)",
    )


async def schedule_delete(args: ScheduleRef, call: Call) -> Answer:
    _record(call, "schedule_delete", f"schedule/{args.name} -n {args.namespace}")
    await call.client.schedules.delete(args.name, args.namespace)
    return Answer(
        {"name": args.name, "namespace": args.namespace, "deleted": True},
        f"schedule/{args.name} deleted (its Runs are left as they are)",
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
        "invoke_async",
        "Submit an async invocation of a function Run (or with function: a Function): answered once it "
        "is recorded, before it runs; it runs once per invocationId. Read it with invocation_get.",
        InvokeAsyncInput,
        invoke_async,
        False,
        "namespace",
    ),
    Tool(
        "invocation_get",
        "An async invocation's state (Queued, Running, Succeeded, Failed, Unknown), attempts, result or "
        "error; optionally wait up to waitSeconds for it to end.",
        InvocationGetInput,
        invocation_get,
        False,
        "namespace",
    ),
    Tool(
        "functions_apply",
        "Create a Function (a function Run's spec served by scale.min..max replicas behind one URL) from "
        "a manifest, or from name, namespace and spec, or change the running one (a new revision when "
        "the replicas' template changed); optionally wait until it is Ready.",
        FunctionApplyInput,
        functions_apply,
        True,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_get",
        "A Function's manifest (its current revision's spec) and status; optionally its replica Runs.",
        FunctionGetInput,
        functions_get,
        False,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_list",
        "List the Functions, of one namespace or all.",
        FunctionListInput,
        functions_list,
        False,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_scale",
        "Set the replicas a Function wants, within its spec.scale.min..max (recorded in its history "
        "with who asked); the autoscaler moves it from there.",
        FunctionScaleInput,
        functions_scale,
        True,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_rollout_status",
        "A Function's rollout: wait until its current revision is rolled out (every wanted replica "
        "Ready, none of an older revision left), or where it is now (wait false).",
        FunctionRolloutInput,
        functions_rollout_status,
        False,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_rollback",
        "Go back to a Function's previous revision's template, as a new revision (rolled out like any).",
        FunctionRollbackInput,
        functions_rollback,
        True,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_delete",
        "Drain and delete every replica of a Function, then the Function (its name and URL are free).",
        FunctionDeleteInput,
        functions_delete,
        True,
        "namespace",
        FUNCTIONS,
    ),
    Tool(
        "functions_invoke",
        "Invoke a Function once through the gateway (which picks a Ready replica) and return its "
        "answer; never retried.",
        FunctionInvokeInput,
        functions_invoke,
        False,
        "namespace",
        FUNCTIONS,
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
        HostActionInput,
        host_drain,
        True,
        "admin",
    ),
    Tool(
        "host_delete",
        "Stop a host now; its Runs register elsewhere once it is proven gone "
        "(admin; recorded in the host's history with who asked).",
        HostActionInput,
        host_delete,
        True,
        "admin",
    ),
    Tool(
        "hosts_reconcile",
        "Collect orphans now (of every runtime, or one) and report what was repaired (admin).",
        ReconcileInput,
        hosts_reconcile,
        True,
        "admin",
    ),
    Tool(
        "queue_list",
        "A runtime's admission: paused or not (by whom, why) and its queued Runs, first first (admin).",
        QueueInput,
        queue_list,
        False,
        "admin",
    ),
    Tool(
        "queue_pause",
        "Pause a runtime's admission: new Runs queue, none is placed until resumed "
        "(admin; recorded in the pool's history with who asked).",
        QueueActionInput,
        _queue_action("pause"),
        True,
        "admin",
    ),
    Tool(
        "queue_resume",
        "Resume a runtime's admission: its queued Runs are placed, scaled out for, or rejected (admin).",
        QueueActionInput,
        _queue_action("resume"),
        True,
        "admin",
    ),
    Tool(
        "queue_drain",
        "End the Runs queued for a runtime (reason QueueDrained, with the message) (admin).",
        QueueActionInput,
        _queue_action("drain"),
        True,
        "admin",
    ),
    Tool(
        "schedule_list",
        "The schedules (task Runs started on a cron expression or an interval), of one namespace "
        "or all (admin).",
        ScheduleListInput,
        schedule_list,
        False,
        "admin",
    ),
    Tool(
        "schedule_create",
        "Create a schedule starting a task Run (the manifest) on a cron expression or every N seconds; "
        "each start is the Run <name>-<yyyymmddhhmmss> (admin).",
        ScheduleCreateInput,
        schedule_create,
        True,
        "admin",
    ),
    Tool(
        "schedule_pause",
        "Pause a schedule (or unpause it: paused false); triggers still start Runs (admin).",
        SchedulePauseInput,
        schedule_pause,
        True,
        "admin",
    ),
    Tool(
        "schedule_trigger",
        "Start one Run of a schedule now, under its overlap policy, paused or not (admin).",
        ScheduleRef,
        schedule_trigger,
        True,
        "admin",
    ),
    Tool(
        "schedule_delete",
        "Delete a schedule; the Runs it started are left as they are (admin).",
        ScheduleRef,
        schedule_delete,
        True,
        "admin",
    ),
)
BY_NAME = {tool.name: tool for tool in TOOLS}
