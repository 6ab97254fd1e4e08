"""The Function operations: apply, get, list, describe, delete, rollback, scale, wait_ready,
rollout_status and invoke. A Function is the FunctionWorkflow `function/{namespace}/{name}`: it
runs until the Function is deleted, its manifest with its status is its `function` query (the
status alone its `status` query and the memo it writes), its replicas its `replicas` query, and a
change is one of its Updates (`apply`, `rollback`, `scale`, `delete`). Invoking never touches
Temporal but to read the endpoint: one POST to the Function's URL at the gateway, which picks a
replica.

    async with Client.from_config() as krt:
        applied = await krt.functions.apply(Function.from_yaml(text))   # created | configured | unchanged
        await krt.functions.wait_ready(applied.function.name)           # every wanted replica Ready
        answer = await krt.functions.invoke("hello", {"name": "x"})
        await krt.functions.delete("hello")

Temporal's errors are mapped onto the SDK's (FunctionNotFound, FunctionConflict, ConfigError,
WaitTimeout) here, over the Run operations' own mapping (kruntimes.sdk.runs).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kruntimes.api.function import Function, FunctionPhase, FunctionStatus
from kruntimes.api.ids import Namespace
from kruntimes.api.names import validate_dns1123_label
from kruntimes.api.spec import Creator
from kruntimes.api.status import Endpoint
from kruntimes.contracts.function import (
    FUNCTION_STATUS_MEMO,
    QUERY_FUNCTION,
    ApplyResult,
    FunctionInput,
    ReplicaView,
    ScaleInput,
    ScaleResult,
)
from kruntimes.contracts.names import (
    QUERY_REPLICAS,
    QUERY_STATUS,
    UPDATE_APPLY,
    UPDATE_DELETE,
    UPDATE_ROLLBACK,
    UPDATE_SCALE,
    function_invoke_url,
    function_of_workflow_id,
    function_workflow_id,
)
from kruntimes.sdk.errors import (
    FunctionConflict,
    FunctionNotFound,
    KruntimesError,
    NotReady,
    RunNotFound,
    WaitTimeout,
)
from kruntimes.sdk.results import FunctionApplied, FunctionObject, InvokeResult
from kruntimes.sdk.watch import POLL_INTERVAL_S, TaskWatch

if TYPE_CHECKING:
    import temporalio.client

    from kruntimes.sdk.invoke import Invoker
    from kruntimes.sdk.runs import Runs

WORKFLOW_TYPE = "FunctionWorkflow"
QUERY_TIMEOUT = timedelta(seconds=10)
# What a worker answers to a query its code does not have (an older worker: its history is read).
UNKNOWN_QUERY = "expected but not found"
MAX_WAIT_S = 600.0  # a wait or delete without a timeout still ends after this long
LIST_PAGE_SIZE = 100
_LIST_CONCURRENCY = 16

FunctionTarget = str | Function
StatusCallback = Callable[[FunctionStatus], None]


@dataclass(frozen=True)
class FunctionDescription:
    """A Function and each replica it owns now (any revision: a rollout has two)."""

    function: FunctionObject
    replicas: list[ReplicaView]


def rolled_out(status: FunctionStatus) -> bool:
    """Whether the Function's current revision is rolled out: every wanted replica of it Ready,
    and no replica of an older one left but those a traffic split keeps (kubectl's `rollout
    status` done)."""
    replicas = status.replicas
    return (
        status.phase is FunctionPhase.Ready
        and status.revision > 0
        and status.observedRevision == status.revision
        and replicas.ready >= replicas.wanted
        and (replicas.total <= replicas.wanted or bool(status.traffic))
    )


def ready(status: FunctionStatus) -> bool:
    """Whether the Function answers as it should: Ready, every wanted replica of its current
    revision Ready (older replicas may still be draining)."""
    return (
        status.phase is FunctionPhase.Ready
        and status.revision > 0
        and status.observedRevision == status.revision
        and status.replicas.ready >= status.replicas.wanted
    )


MAX_ENDPOINTS_KEPT = 1024  # Functions whose endpoints one client remembers


class Functions:
    """The Function operations of one platform, over the Run operations' Temporal connection
    (`runs`: its config, creator and errors) and the client's invoke session (`invoker`)."""

    def __init__(self, runs: Runs, invoker: Invoker) -> None:
        self._runs = runs
        self._invoker = invoker
        # (namespace, name) → the Function's endpoint, once known: invoking needs no query (and
        # so no worker) after the first; a 404 from the gateway (the Function re-created with
        # another uid) forgets it
        self._endpoints: collections.OrderedDict[tuple[str, str], Endpoint] = collections.OrderedDict()

    # -- plumbing ------------------------------------------------------------------------------------

    async def _handle(self, name: str, namespace: str) -> temporalio.client.WorkflowHandle[Any, Any]:
        _check_name(name, namespace)
        client = await self._runs.temporal()
        return client.get_workflow_handle(function_workflow_id(Namespace(namespace), name))

    async def _rpc(self, call: Any, *, namespace: str, name: str) -> Any:
        """Await a Temporal call, mapping its errors onto ours (a Function's, not a Run's)."""
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.exceptions import ApplicationError

        try:
            return await self._runs._rpc(call, namespace=namespace, name=name, what="function")
        except RunNotFound as e:
            raise FunctionNotFound.named(namespace, name) from e
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            # FUNCTION_CONFLICT (another uid), or a change the Function refuses (a rollback with
            # no earlier revision, replicas outside scale.min..max): the caller's 409 either way
            if isinstance(cause, ApplicationError):
                raise FunctionConflict(namespace, name, cause.message) from e
            raise KruntimesError(f"function {name!r} in namespace {namespace!r} refused: {cause}") from e

    async def _running(self, name: str, namespace: str) -> tuple[Any, Any]:
        """The Function's running workflow (a handle bound to its run) and its description;
        FunctionNotFound when it has ended (deleted) or never was."""
        from temporalio.client import WorkflowExecutionStatus

        handle = await self._handle(name, namespace)
        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise FunctionNotFound.named(namespace, name)
        return handle, description

    async def _status(self, handle: Any, *, namespace: str, name: str) -> FunctionStatus:
        status: FunctionStatus = await self._rpc(
            handle.query(QUERY_STATUS, result_type=FunctionStatus, rpc_timeout=QUERY_TIMEOUT),
            namespace=namespace,
            name=name,
        )
        return status

    async def _update(
        self, handle: Any, update: str, *args: Any, result_type: Any, namespace: str, name: str
    ) -> Any:
        return await self._rpc(
            handle.execute_update(update, *args, result_type=result_type), namespace=namespace, name=name
        )

    # -- apply ---------------------------------------------------------------------------------------

    async def apply(self, function: Function) -> FunctionApplied:
        """Create the Function, or change the running one (its `apply` Update: a new revision
        when the replicas' template changed; `scale` or labels alone change no revision); one
        whose spec and labels are those it holds is left alone ("unchanged"). A missing
        metadata.uid is made (uuid4) for a new Function and kept from the running one; another
        uid than the running one's raises FunctionConflict (a deleted and re-created Function is
        another one). The creator is this client's, as for Runs."""
        from temporalio.exceptions import WorkflowAlreadyStartedError

        given_uid = function.metadata.uid
        function = prepare(function, creator=self._runs.creator())
        name, namespace = function.metadata.name, function.metadata.namespace
        _check_name(name, namespace)
        for _ in range(2):  # a create racing ours: apply to what it created
            try:
                handle, description = await self._running(name, namespace)
            except FunctionNotFound:
                handle = None
            if handle is not None:
                from kruntimes.wire import search

                uid = _first_attr(description, search.FUNCTION)
                if given_uid is not None and uid and given_uid != uid:
                    raise FunctionConflict(
                        namespace,
                        name,
                        f"it exists with uid {uid}, not {given_uid}; delete it first to make another",
                    )
                if uid:
                    function = function._replace(metadata=function.metadata._replace(uid=uid))
                held = await self._function(handle, description, namespace=namespace, name=name)
                if held.spec == function.spec and held.metadata.labels == function.metadata.labels:
                    return FunctionApplied(  # nothing to send
                        FunctionObject.of(
                            held, held.status or FunctionStatus(), created=description.start_time
                        ),
                        "unchanged",
                    )
                this = (await self._runs.temporal()).get_workflow_handle(handle.id, run_id=description.run_id)
                try:
                    await self._update(
                        this, UPDATE_APPLY, function, result_type=ApplyResult, namespace=namespace, name=name
                    )
                except FunctionNotFound:
                    continue  # deleted (or continued as new) meanwhile: look again
                return FunctionApplied(await self.get(name, namespace), "configured")
            if given_uid is None:  # a new Function gets a new uid, whatever an earlier try made
                function = function._replace(metadata=function.metadata._replace(uid=str(uuid.uuid4())))
            try:
                await self._start(function)
            except WorkflowAlreadyStartedError:
                continue
            return FunctionApplied(
                FunctionObject.of(function, FunctionStatus(), created=datetime.now(UTC)), "created"
            )
        raise FunctionConflict(
            namespace, name, "it was created and deleted while this apply ran; apply again"
        )

    async def _start(self, function: Function) -> None:
        from kruntimes.sdk.runtimes import check_runtime
        from kruntimes.wire import search_typed, summaries

        name, namespace = function.metadata.name, function.metadata.namespace
        client = await self._runs.temporal()
        await self._rpc(check_runtime(client, function.spec.runtime), namespace=namespace, name=name)
        uid = function.metadata.uid or ""
        endpoint = self._endpoint_url(namespace, uid)
        creator = function.metadata.creator
        by = f" by {creator}" if creator is not None else ""
        await self._rpc(
            client.start_workflow(
                WORKFLOW_TYPE,
                FunctionInput(function=function),
                id=function_workflow_id(Namespace(namespace), name),
                task_queue=self._runs.config.taskQueue,
                search_attributes=search_typed.function_at_start(function),
                static_summary=summaries.summary(f"function {function.spec.runtime} {namespace}/{name}{by}"),
                static_details=summaries.details(
                    f"Function **{namespace}/{name}** (uid `{uid}`)"
                    + (f"\n\nInvoked at `{endpoint}`" if endpoint else "")
                ),
            ),
            namespace=namespace,
            name=name,
        )

    def _endpoint_url(self, namespace: str, uid: str) -> str | None:
        gateway = self._runs.config.gatewayUrl
        if not gateway or not uid:
            return None
        return function_invoke_url(gateway, namespace=Namespace(namespace), function_uid=uid)

    # -- reads ---------------------------------------------------------------------------------------

    async def get(self, name: str, namespace: str = "default") -> FunctionObject:
        """The Function as it is: its manifest (the current revision's spec) and its status."""
        handle, description = await self._running(name, namespace)
        function = await self._function(handle, description, namespace=namespace, name=name)
        return FunctionObject.of(
            function, function.status or FunctionStatus(), created=description.start_time
        )

    async def status(self, name: str, namespace: str = "default") -> FunctionStatus:
        """The Function's status only (one query)."""
        handle = await self._handle(name, namespace)
        return await self._status(handle, namespace=namespace, name=name)

    async def replicas(self, name: str, namespace: str = "default") -> builtins.list[ReplicaView]:
        """Every replica Run the Function owns now: its name, uid, revision and phase."""
        handle = await self._handle(name, namespace)
        views: builtins.list[ReplicaView] = await self._rpc(
            handle.query(QUERY_REPLICAS, result_type=list[ReplicaView], rpc_timeout=QUERY_TIMEOUT),
            namespace=namespace,
            name=name,
        )
        return sorted(views, key=lambda r: (r.revision, r.name))

    async def describe(self, name: str, namespace: str = "default") -> FunctionDescription:
        """The Function and its replicas (what `krt function describe` shows)."""
        function = await self.get(name, namespace)
        return FunctionDescription(function, await self.replicas(name, namespace))

    async def list(self, namespace: str | None = None) -> builtins.list[FunctionObject]:
        """The Functions of a namespace (or every one), by namespace and name, from the
        visibility index (a Function just deleted may be listed a moment longer; one that is gone
        by the time it is read is left out)."""
        from kruntimes.wire import search

        if namespace is not None:
            try:
                validate_dns1123_label(namespace, field="namespace")
            except ValueError:
                return []  # no Function can live there
        client = await self._runs.temporal()
        names: builtins.list[tuple[str, str]] = []

        async def collect() -> None:
            query = search.functions_listed(namespace=namespace)
            async for execution in client.list_workflows(query, page_size=LIST_PAGE_SIZE):
                found = function_of_workflow_id(execution.id)
                if found is not None and found not in names:
                    names.append(found)

        await self._rpc(collect(), namespace=namespace or "*", name="*")
        limit = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(ns: str, name: str) -> FunctionObject | None:
            async with limit:
                try:
                    return await self.get(name, ns)
                except FunctionNotFound:
                    return None

        found = await asyncio.gather(*(one(ns, n) for ns, n in names))
        return sorted((f for f in found if f is not None), key=lambda f: (f.namespace, f.name))

    async def _function(self, handle: Any, description: Any, *, namespace: str, name: str) -> Function:
        """The Function as its workflow holds it now, with its status: its `function` query (one
        call). A workflow that cannot answer it (closed, or run by a worker older than the query)
        is read from its history and its memo instead."""
        from temporalio.client import WorkflowExecutionStatus, WorkflowQueryFailedError

        if description.status == WorkflowExecutionStatus.RUNNING:
            client = await self._runs.temporal()
            this = client.get_workflow_handle(handle.id, run_id=description.run_id)
            try:
                function: Function = await self._rpc(
                    this.query(QUERY_FUNCTION, result_type=Function, rpc_timeout=QUERY_TIMEOUT),
                    namespace=namespace,
                    name=name,
                )
                return function
            except WorkflowQueryFailedError as e:
                if UNKNOWN_QUERY not in str(e):
                    raise KruntimesError(f"function {name!r} in namespace {namespace!r}: {e}") from e
        function = await self._manifest(handle, description, namespace=namespace, name=name)
        status = await _memo_status(description)
        if status is None:
            status = await self._status(handle, namespace=namespace, name=name)
        return function._replace(status=status)

    async def _manifest(self, handle: Any, description: Any, *, namespace: str, name: str) -> Function:
        """The Function as its workflow's history says it is now: the manifest it was last
        applied with (the started input, then each accepted `apply` Update), with the current
        revision's spec when a rollback made it."""
        client = await self._runs.temporal()
        this = client.get_workflow_handle(handle.id, run_id=description.run_id)
        function: Function = await self._rpc(
            _current_manifest(this, client.data_converter), namespace=namespace, name=name
        )
        return function

    # -- changes -------------------------------------------------------------------------------------

    async def rollback(self, name: str, namespace: str = "default") -> FunctionObject:
        """Go back to the previous revision's template, as a new revision (its replicas start,
        then the current ones are drained and deleted). FunctionConflict when there is none."""
        handle, _ = await self._running(name, namespace)
        await self._update(handle, UPDATE_ROLLBACK, result_type=ApplyResult, namespace=namespace, name=name)
        return await self.get(name, namespace)

    async def scale(
        self, name: str, replicas: int, namespace: str = "default", *, reason: str = ""
    ) -> ScaleResult:
        """Set the replicas wanted, within the Function's scale.min..scale.max (FunctionConflict
        outside them); the autoscaler moves it from there."""
        handle, _ = await self._running(name, namespace)
        result: ScaleResult = await self._update(
            handle,
            UPDATE_SCALE,
            ScaleInput(replicas=replicas, reason=reason),
            result_type=ScaleResult,
            namespace=namespace,
            name=name,
        )
        return result

    async def delete(
        self, name: str, namespace: str = "default", *, timeout: float | None = 120.0, wait: bool = True
    ) -> None:
        """Delete the Function: its `delete` Update drains and deletes every replica, then the
        workflow ends and is removed from Temporal (the name is free for a new Function, with a
        new uid and URL). With ``wait`` it returns once `list` no longer shows it; ``timeout``
        bounds the whole delete (WaitTimeout). FunctionNotFound if there is none."""
        from temporalio.client import WorkflowFailureError

        from kruntimes.wire import search

        bound = timeout if timeout is not None else MAX_WAIT_S
        handle, description = await self._running(name, namespace)
        client = await self._runs.temporal()
        this = client.get_workflow_handle(handle.id, run_id=description.run_id)
        try:
            async with asyncio.timeout(bound):
                with contextlib.suppress(FunctionNotFound):  # ended meanwhile: its end is awaited below
                    await self._update(this, UPDATE_DELETE, result_type=None, namespace=namespace, name=name)
                with contextlib.suppress(WorkflowFailureError, FunctionNotFound):
                    await self._rpc(handle.result(follow_runs=True), namespace=namespace, name=name)
                ended = await self._rpc(handle.describe(), namespace=namespace, name=name)
                await self._runs._forget(handle.id, ended.run_id, namespace=namespace, name=name)
                if wait:
                    uid = _first_attr(description, search.FUNCTION)
                    if uid:
                        await self._runs._unlisted(
                            search.functions_listed(function_uid=uid), namespace=namespace, name=name
                        )
        except TimeoutError as e:
            raise WaitTimeout(
                f"function {name!r} in namespace {namespace!r} was not deleted within {bound:g} s: "
                "its replicas may still be draining (`krt function describe`)"
            ) from e

    # -- waiting -------------------------------------------------------------------------------------

    async def wait_ready(
        self,
        name: str,
        namespace: str = "default",
        *,
        timeout: float | None = 120.0,
        on_status: StatusCallback | None = None,
    ) -> FunctionObject:
        """Wait until the Function is Ready: every wanted replica of its current revision Ready
        (replicas of an older revision may still drain). WaitTimeout after ``timeout`` seconds,
        saying where it is; FunctionNotFound if it is deleted meanwhile."""
        await self._until(name, namespace, ready, timeout=timeout, on_status=on_status, what="Ready")
        return await self.get(name, namespace)

    async def rollout_status(
        self,
        name: str,
        namespace: str = "default",
        *,
        wait: bool = True,
        timeout: float | None = 300.0,
        on_status: StatusCallback | None = None,
    ) -> FunctionStatus:
        """The Function's rollout: with ``wait``, once its current revision is rolled out (every
        wanted replica of it Ready, none of an older revision left; WaitTimeout after
        ``timeout``); without, its status now (`rolled_out(status)` says whether it is done)."""
        if not wait:
            return await self.status(name, namespace)
        return await self._until(
            name, namespace, rolled_out, timeout=timeout, on_status=on_status, what="rolled out"
        )

    async def _until(
        self,
        name: str,
        namespace: str,
        done: Callable[[FunctionStatus], bool],
        *,
        timeout: float | None,
        on_status: StatusCallback | None,
        what: str,
    ) -> FunctionStatus:
        """Query the status after each completed workflow task of the Function (its status
        changes only then: a long poll of its history, no timer) until `done(status)`."""
        bound = timeout if timeout is not None else MAX_WAIT_S
        deadline = time.monotonic() + bound
        handle, description = await self._running(name, namespace)
        watch: TaskWatch | None = TaskWatch(
            handle, after=description.raw_description.workflow_execution_info.history_length
        )
        status = await self._status(handle, namespace=namespace, name=name)
        while True:
            if on_status is not None:
                on_status(status)
            if done(status):
                return status
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"function {name!r} in namespace {namespace!r} is not {what} after {bound:g} s: "
                    f"{status.phase.value}, revision {status.revision}, "
                    f"{status.replicas.ready}/{status.replicas.wanted} replicas ready"
                    + (f": {status.message}" if status.message else "")
                )
            try:
                if watch is None:  # the last one ended (continued as new) or failed: a new one
                    _, description = await self._running(name, namespace)
                    watch = TaskWatch(
                        handle, after=description.raw_description.workflow_execution_info.history_length
                    )
                await asyncio.wait_for(watch.next(), remaining)
                if watch.ended:  # continued as new (or deleted: the status query says so)
                    watch = None
            except TimeoutError:
                pass  # the deadline check above raises
            except FunctionNotFound:
                raise
            except Exception:  # the long poll failed (a transient RPC error): watch again shortly
                watch = None
                await asyncio.sleep(POLL_INTERVAL_S)
            status = await self._status(handle, namespace=namespace, name=name)

    # -- invoke --------------------------------------------------------------------------------------

    async def endpoint(self, target: FunctionTarget, namespace: str = "default") -> Endpoint:
        """Where the Function is invoked: its status's endpoint (one query), or its URL from its
        uid and the gateway the config names. NotReady while it has none."""
        if isinstance(target, Function):
            name, namespace = target.metadata.name, target.metadata.namespace
            known = target.status.endpoint if target.status is not None else None
            if known is not None:
                return known
        else:
            name = target
        status = await self.status(name, namespace)
        if status.endpoint is not None:
            return status.endpoint
        from kruntimes.wire.reasons import GatewayReason

        raise NotReady(  # what the gateway would answer: no replica has been Ready yet
            503,
            GatewayReason.NO_READY_REPLICA.value,
            f"function {name!r} has no endpoint yet ({status.phase.value})",
            invocation_id="",
            retry_after=1.0,
        )

    async def invoke(
        self,
        target: FunctionTarget,
        data: Any = None,
        *,
        namespace: str = "default",
        invocation_id: str | None = None,
        timeout: float | None = None,
    ) -> InvokeResult:
        """Invoke the Function once through the gateway (which picks a Ready replica); never
        retried. ``target``: its name, or a Function from `get`/`apply`. The answers and errors
        are a Run's (kruntimes.Client.invoke): Busy when every replica is full and the gateway's
        queue too, NotReady when no replica is Ready, FunctionNotFound for another uid."""
        key: tuple[str, str]
        if isinstance(target, Function):
            key = (target.metadata.namespace, target.metadata.name)
        else:
            _check_name(target, namespace)
            key = (namespace, target)
        cached = self._endpoints.get(key)
        endpoint = cached or await self.endpoint(target, namespace)
        try:
            answer = await self._invoker.send(endpoint, data, invocation_id=invocation_id, timeout=timeout)
        except FunctionNotFound:
            self._endpoints.pop(key, None)
            if cached is None:
                raise
            # the gateway knows no Function at the remembered uid (it never ran there): ask again
            endpoint = await self.endpoint(target, namespace)
            answer = await self._invoker.send(endpoint, data, invocation_id=invocation_id, timeout=timeout)
        self._endpoints[key] = endpoint
        self._endpoints.move_to_end(key)
        while len(self._endpoints) > MAX_ENDPOINTS_KEPT:
            self._endpoints.popitem(last=False)
        return answer


# --- what apply sends ---------------------------------------------------------------------------


def prepare(function: Function, *, creator: Creator | None = None) -> Function:
    """What apply sends: `creator` as the Function's creator (whatever the manifest said) and an
    absolute source.path; the uid is apply's to settle (the running one's, or a new one)."""
    metadata, spec = function.metadata, function.spec
    if metadata.creator != creator:
        metadata = metadata._replace(creator=creator)
    path = spec.source.path
    if path is not None and not Path(path).is_absolute():
        spec = spec._replace(source=spec.source._replace(path=str(Path(path).resolve())))
    if metadata is function.metadata and spec is function.spec and function.status is None:
        return function
    return Function(apiVersion=function.apiVersion, kind=function.kind, metadata=metadata, spec=spec)


async def _current_manifest(handle: Any, converter: Any) -> Function:
    """The Function this run of its workflow holds: its started input (after a continue-as-new,
    with the current revision's spec), then each `apply` Update that completed without failure,
    in order (a rollback's revision: the spec of the revision it went back to)."""
    from temporalio.api.enums.v1 import EventType

    function: Function | None = None
    revisions: builtins.list[Any] = []  # the specs kept, oldest first: what a rollback returns to
    accepted: dict[str, tuple[str, Any]] = {}  # update id → (name, payloads)
    async for event in handle.fetch_history_events():
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            [started] = await converter.decode(
                event.workflow_execution_started_event_attributes.input.payloads, [FunctionInput]
            )
            function = started.function
            if started.state is not None:
                revisions = [r.spec for r in started.state.revisions]
                function = function._replace(spec=revisions[-1])
            else:
                revisions = [function.spec]
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            accepted[request.meta.update_id] = (request.input.name, request.input.args.payloads)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED and function is not None:
            attributes = event.workflow_execution_update_completed_event_attributes
            name, payloads = accepted.pop(attributes.meta.update_id, ("", None))
            if attributes.outcome.HasField("failure") or name not in (UPDATE_APPLY, UPDATE_ROLLBACK):
                continue
            [result] = await converter.decode(attributes.outcome.success.payloads, [ApplyResult])
            if name == UPDATE_APPLY and payloads is not None:
                [applied] = await converter.decode(payloads, [Function])
                function = function._replace(metadata=applied.metadata, spec=applied.spec)
                if result.changed and not revisions[-1].same_template(applied.spec):
                    revisions.append(applied.spec)
                elif revisions:
                    revisions[-1] = applied.spec
            elif name == UPDATE_ROLLBACK and result.changed and len(revisions) >= 2:
                back = revisions[-2]._replace(scale=function.spec.scale)  # scale is not a revision's
                revisions.append(back)
                function = function._replace(spec=back)
    if function is None:
        raise KruntimesError(f"workflow {handle.id} does not hold a Function")
    return function


# --- helpers ------------------------------------------------------------------------------------


def _check_name(name: str, namespace: str) -> None:
    try:
        validate_dns1123_label(name, field="name")
        validate_dns1123_label(namespace, field="namespace")
    except ValueError as e:
        raise FunctionNotFound.named(namespace, name) from e


async def _memo_status(description: Any) -> FunctionStatus | None:
    """The status the workflow last wrote to its memo, if it wrote one."""
    with contextlib.suppress(KeyError):
        status: FunctionStatus = await description.memo_value(FUNCTION_STATUS_MEMO, type_hint=FunctionStatus)
        return status
    return None


def _first_attr(description: Any, key: str) -> str:
    values = (description.search_attributes or {}).get(key) or [""]
    return str(values[0])
