"""The Run operations over Temporal: create, apply, get, status, list, wait, cancel, delete, and
the pools' hosts. A Run is the RunWorkflow `run/{namespace}/{name}`; its status is the workflow's
`status` query while it runs and, once it has closed, its result (Succeeded, Cancelled) or the
details of its failure (Failed, Timeout). A closed Run stays readable for its
ttlSecondsAfterFinished, then Temporal forgets it; `delete` forgets it at once.

Temporal's errors are mapped onto the SDK's (kruntimes.sdk.errors) in `Runs._rpc`. temporalio is
imported on first use, so importing the SDK stays cheap.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from kruntimes.api.ids import Namespace, RunUid
from kruntimes.api.names import validate_dns1123_label
from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import Run
from kruntimes.api.spec import Creator, CreatorKind
from kruntimes.api.status import RunStatus
from kruntimes.contracts.names import (
    QUERY_STATUS,
    SIGNAL_CANCEL,
    SIGNAL_DELETE_NOW,
    UPDATE_DELETE,
    retention_workflow_id,
    run_workflow_id,
)
from kruntimes.contracts.pool import PoolState
from kruntimes.contracts.run import RunInput
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import (
    ConfigError,
    KruntimesError,
    RunAlreadyExists,
    RunFailed,
    RunNotFound,
    SpecConflict,
    WaitTimeout,
)
from kruntimes.sdk.events import RunEvent, read_events
from kruntimes.sdk.results import Applied, HostView, RunObject
from kruntimes.sdk.watch import POLL_INTERVAL_S, PhaseWatch, TaskWatch

if TYPE_CHECKING:
    import temporalio.client


QUERY_TIMEOUT = timedelta(seconds=10)
_LIST_CONCURRENCY = 16
LIST_PAGE_SIZE = 100  # Runs per visibility page
MAX_LIST_PAGE_SIZE = 1000
MAX_DELETE_WAIT_S = 300.0  # a delete without a timeout still waits this long at most
UNLISTED_POLL_S = 0.1  # how often a delete looks whether visibility still lists the Run

StatusCallback = Callable[[RunStatus], None]


class Runs:
    """The Run operations of one platform over one Temporal connection (made on first use).

    Every argument is explicit here; the public defaults are the facade's (kruntimes.Client).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        temporal: temporalio.client.Client | None = None,
        creator_kind: CreatorKind = "sdk",
    ) -> None:
        self.config = config
        self.creator_kind: CreatorKind = creator_kind
        self._temporal = temporal
        self._connecting = asyncio.Lock()
        self._served: set[str] = set()  # runtimes create found served

    def creator(self, kind: CreatorKind | None = None) -> Creator | None:
        """Who the Runs this client starts record as their creator (`kind`: this client's own
        unless given): its config's identity, or None when it has none."""
        if self.config.identity is None:
            return None
        return Creator(kind=kind or self.creator_kind, subject=self.config.identity)

    async def temporal(self) -> temporalio.client.Client:
        """The Temporal client (pydantic data converter), connected on first use."""
        async with self._connecting:
            if self._temporal is None:
                from kruntimes.temporal.connect import connect

                try:
                    self._temporal = await connect(self.config.temporal_settings())
                except (ValueError, OSError) as e:  # a TLS, API key or codec key file
                    raise ConfigError(f"the Temporal connection settings cannot be used: {e}") from e
                except Exception as e:
                    raise self._unavailable() from e
            return self._temporal

    def _unavailable(self) -> ConfigError:
        return ConfigError(f"cannot reach Temporal at {self.config.temporalAddress}: is `krt up` running?")

    async def _handle(self, name: str, namespace: str) -> temporalio.client.WorkflowHandle[Any, Any]:
        _check_name(name, namespace)
        client = await self.temporal()
        return client.get_workflow_handle(run_workflow_id(Namespace(namespace), name), result_type=RunStatus)

    async def _rpc(self, call: Any, *, namespace: str, name: str, what: str = "run") -> Any:
        """Await a Temporal call, mapping its errors onto ours (`what`: the object the call is
        about, as the messages name it; a missing one is RunNotFound, for the caller to map)."""
        from temporalio.client import RPCError, RPCTimeoutOrCancelledError
        from temporalio.service import RPCStatusCode

        try:
            return await call
        except RPCTimeoutOrCancelledError as e:
            raise ConfigError(
                f"Temporal at {self.config.temporalAddress} did not answer for {what} {namespace}/{name}: "
                "is the kruntimes worker running (`krt status`)?"
            ) from e
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFound(namespace, name) from e
            if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise self._unavailable() from e
            if e.status == RPCStatusCode.FAILED_PRECONDITION and "poller" in str(e):
                raise ConfigError(
                    f"no kruntimes worker serves Temporal at {self.config.temporalAddress}: "
                    "is `krt up` running?"
                ) from e
            raise KruntimesError(f"Temporal refused the request for {what} {namespace}/{name}: {e}") from e

    # -- Runs ----------------------------------------------------------------------------------------

    async def create(self, run: Run) -> RunObject:
        """Start the Run on the configured task queue; RunAlreadyExists while one of that name runs."""
        from temporalio.exceptions import WorkflowAlreadyStartedError

        from kruntimes.sdk.runtimes import check_runtime
        from kruntimes.sdk.starting import start_run

        run = prepare(run, creator=self.creator())
        name, namespace = run.metadata.name, run.metadata.namespace
        _check_name(name, namespace)
        client = await self.temporal()
        if run.spec.runtime not in self._served:  # a runtime, once served, is not asked again
            await self._rpc(check_runtime(client, run.spec.runtime), namespace=namespace, name=name)
            self._served.add(run.spec.runtime)
        try:
            await self._rpc(
                start_run(client, run, task_queue=self.config.taskQueue, gateway_url=self.config.gatewayUrl),
                namespace=namespace,
                name=name,
            )
        except WorkflowAlreadyStartedError as e:
            raise RunAlreadyExists(namespace, name) from e
        return RunObject.of(run, RunStatus(), created=datetime.now(UTC))

    async def apply(self, run: Run) -> Applied:
        """Create the Run unless a running one of that name has the same spec (then: a no-op)."""
        given_uid = run.metadata.uid
        run = prepare(run, creator=self.creator())
        name, namespace = run.metadata.name, run.metadata.namespace
        for _ in range(2):  # a create racing ours: compare with what it created
            try:
                existing = await self.get(name, namespace)
            except RunNotFound:
                existing = None
            if existing is not None and not existing.closed:
                conflicts = differences(existing, run, uid=given_uid)
                if conflicts:
                    raise SpecConflict(namespace, name, conflicts)
                return Applied(existing, created=False)
            try:
                return Applied(await self.create(run), created=True)
            except RunAlreadyExists:
                continue
        raise RunAlreadyExists(namespace, name)

    async def get(self, name: str, namespace: str, *, patient: bool = False) -> RunObject:
        """The Run's manifest (its workflow's input) and status. `patient`: a status query that
        timed out (it waits behind a task in flight) gives the Pending status instead of an error."""
        from temporalio.client import WorkflowExecutionStatus

        handle = await self._handle(name, namespace)
        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        run = await self._manifest(handle, namespace=namespace, name=name)
        if description.status == WorkflowExecutionStatus.RUNNING and patient:
            status = await self._status(handle, namespace=namespace, name=name, patient=True) or RunStatus()
        elif description.status == WorkflowExecutionStatus.RUNNING:
            status = await self._query(handle, namespace=namespace, name=name)
        else:
            status = await self._final(handle, description, namespace=namespace, name=name)
        return RunObject.of(
            run,
            status,
            created=description.start_time,
            closed=description.status != WorkflowExecutionStatus.RUNNING,
        )

    async def status(self, name: str, namespace: str) -> RunStatus:
        """The Run's status only (one query; a closed Run's final result)."""
        handle = await self._handle(name, namespace)
        return await self._status(handle, namespace=namespace, name=name)

    async def list(self, namespace: str | None, phase: RunPhase | str | None) -> builtins.list[RunObject]:
        """The existing Runs found in the visibility index (running, and finished within their
        ttlSecondsAfterFinished), each read with `get`, by name."""
        runs: builtins.list[RunObject] = []
        async for page in self.pages(namespace, phase, page_size=LIST_PAGE_SIZE):
            runs.extend(page)
        return sorted(runs, key=lambda r: (r.metadata.namespace, r.metadata.name))

    async def pages(
        self,
        namespace: str | None,
        phase: RunPhase | str | None,
        *,
        page_size: int,
        first_page_size: int | None = None,
    ) -> AsyncIterator[builtins.list[RunObject]]:
        """The existing Runs one visibility page at a time (newest first; each page read with
        `get`, by name, and sorted so): the first page (`first_page_size`, if smaller) costs one
        page of Runs, however many there are. A running Run is its running RunWorkflow; a
        finished one, its running RetentionWorkflow (a child of the closed RunWorkflow); a
        deleted one neither (kruntimes.wire.search.LISTED). One name is listed once."""
        from kruntimes.wire import search

        if not 1 <= page_size <= MAX_LIST_PAGE_SIZE:
            raise ValueError(f"page_size must be within 1..{MAX_LIST_PAGE_SIZE}")
        if namespace is not None:
            try:
                validate_dns1123_label(namespace, field="namespace")
            except ValueError:
                return  # no Run can live there
        wanted = RunPhase(phase) if phase is not None else None
        client = await self.temporal()
        executions = client.list_workflows(
            search.listed(namespace=namespace, phase=wanted), page_size=page_size
        )
        limit = asyncio.Semaphore(_LIST_CONCURRENCY)
        seen: set[str] = set()  # the Runs' workflow ids listed so far

        async def one(workflow_id: str) -> RunObject | None:
            _, ns, name = workflow_id.split("/", 2)
            async with limit:
                try:
                    return await self.get(name, ns)
                except RunNotFound:  # deleted since visibility was written
                    return None

        size = min(first_page_size or page_size, page_size)
        while True:
            await self._rpc(executions.fetch_next_page(page_size=size), namespace=namespace or "*", name="*")
            size = page_size
            ids = []
            for execution in executions.current_page or ():
                run_id = _run_workflow_of(execution)
                if run_id is not None and run_id not in seen:
                    seen.add(run_id)
                    ids.append(run_id)
            found = await asyncio.gather(*(one(i) for i in ids))
            runs = [r for r in found if r is not None]
            if wanted is not None:  # visibility lags the query a little
                runs = [r for r in runs if r.status.phase == wanted]
            if runs:
                yield sorted(runs, key=lambda r: (r.metadata.namespace, r.metadata.name))
            if executions.next_page_token is None:
                return

    async def wait(
        self,
        name: str,
        namespace: str,
        *,
        until: RunPhase | Iterable[RunPhase] | None,
        timeout: float | None,
        interval: float,
        on_status: StatusCallback | None,
    ) -> RunObject:
        """Query the status after each completed workflow task (TaskWatch) until it is wanted.

        The watch starts from the history's length read before each status query: a task that
        completes after the query answered is always seen. A query waits behind a task in
        flight (a Run's first task registers it, and a loaded worker may take a while): one that
        times out is not an answer, the watch goes on and the next completed task asks again."""
        handle = await self._handle(name, namespace)
        # Waiting for phases that are always indexed, only the tasks that index a phase matter.
        if until is not None and not isinstance(until, RunPhase | str):
            until = tuple(until)
        indexed = until is None or all(
            RunPhase(p) in _INDEXED for p in ((until,) if isinstance(until, RunPhase | str) else until)
        )
        if indexed and on_status is None:
            return await self._wait_indexed(
                handle, namespace=namespace, name=name, until=until, timeout=timeout
            )
        tasks: TaskWatch | None = await self._watch(
            handle, namespace=namespace, name=name, phases_only=indexed
        )
        run = await self.get(name, namespace, patient=True)
        wanted = _wanted(run, until)
        deadline = None if timeout is None else time.monotonic() + timeout
        status = run.status
        while True:
            if on_status is not None:
                on_status(status)
            if status.phase in wanted or status.phase is RunPhase.Succeeded:
                return run._replace(status=status)
            if is_terminal(status.phase):
                raise RunFailed(run._replace(status=status))
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._wait_timeout(name, namespace, timeout, until, run, status.phase.value)
            if tasks is None:
                tasks = await self._watch(handle, namespace=namespace, name=name, phases_only=indexed)
            try:
                await asyncio.wait_for(tasks.next(), remaining)
            except TimeoutError:
                pass  # the deadline check above raises
            except Exception:  # the long poll failed (a transient RPC error): poll again shortly
                await asyncio.sleep(interval)
                tasks = await self._watch(handle, namespace=namespace, name=name, phases_only=indexed)
            status = await self._status(handle, namespace=namespace, name=name, patient=True) or status

    async def _wait_indexed(
        self,
        handle: Any,
        *,
        namespace: str,
        name: str,
        until: RunPhase | Iterable[RunPhase] | None,
        timeout: float | None,
    ) -> RunObject:
        """`wait` for phases the Run always indexes, with no one watching the steps between: the
        Run's history is read from its first event (the manifest) and long-polled, and the status
        is read only when the Run indexes a phase waited for or a terminal one: the status it wrote
        to its memo in that task (no query: a query waits behind whatever task of the Run the
        worker runs first), else queried. A create and its wait cost one history stream, however
        many phases the Run passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = RunPhase.Pending.value  # the last phase the history indexed
        watch: PhaseWatch | None = None
        run: Run | None = None
        created: datetime | None = None
        closed = False
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._wait_timeout(name, namespace, timeout, until, run, last)
            if watch is None:
                watch = PhaseWatch(handle)
            try:
                indexed = await asyncio.wait_for(
                    self._rpc(watch.next(), namespace=namespace, name=name), remaining
                )
            except TimeoutError:
                continue  # the deadline check above raises
            except RunNotFound:
                raise
            except Exception:  # the long poll failed (a transient RPC error): read it again
                watch = None
                await asyncio.sleep(POLL_INTERVAL_S)
                continue
            if run is None and watch.started is not None:
                run = await self._decoded_manifest(watch.started, handle)
                created = watch.started.event_time.ToDatetime(tzinfo=UTC)
            if indexed is None:  # closed or continued as new: ask the workflow
                current = await self.get(name, namespace, patient=True)
                run, created, closed = current, current.created, current.closed
                status = current.status
                watch = None
            else:
                last = indexed
                wanted = _wanted(run, until) if run is not None else frozenset()
                phase = RunPhase(indexed) if indexed in RunPhase.__members__ else None
                if phase is not None and phase not in wanted and not is_terminal(phase):
                    continue
                found = await self._written_status(watch.status)
                if found is None:  # a Run that writes no status memo: ask it
                    found = await self._status(handle, namespace=namespace, name=name, patient=True)
                while found is None:  # the query waited behind a task in flight: ask again
                    if deadline is not None and time.monotonic() >= deadline:
                        raise self._wait_timeout(name, namespace, timeout, until, run, last)
                    found = await self._status(handle, namespace=namespace, name=name, patient=True)
                status = found
            if run is None:
                raise RunNotFound(namespace, name)
            if status.phase in _wanted(run, until) or status.phase is RunPhase.Succeeded:
                return RunObject.of(run, status, created=created, closed=closed)
            if is_terminal(status.phase):
                raise RunFailed(RunObject.of(run, status, created=created, closed=closed))

    @staticmethod
    def _wait_timeout(
        name: str,
        namespace: str,
        timeout: float | None,
        until: RunPhase | Iterable[RunPhase] | None,
        run: Run | None,
        last: str,
    ) -> WaitTimeout:
        wanted = _wanted(run, until) if run is not None else frozenset({RunPhase.Ready})
        names = " or ".join(sorted(p.value for p in wanted))
        phase = RunPhase(last) if last in RunPhase.__members__ else RunPhase.Pending
        return WaitTimeout(
            f"run {name!r} in namespace {namespace!r} is still {phase.value} after "
            f"{timeout:g} s (waiting for {names})",
            phase=phase,
        )

    async def _watch(self, handle: Any, *, namespace: str, name: str, phases_only: bool = False) -> TaskWatch:
        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        return TaskWatch(
            handle,
            after=description.raw_description.workflow_execution_info.history_length,
            phases_only=phases_only,
        )

    async def events(self, name: str, namespace: str) -> builtins.list[RunEvent]:
        handle = await self._handle(name, namespace)
        client = await self.temporal()
        return list(await self._rpc(read_events(handle, client), namespace=namespace, name=name))

    async def cancel(self, name: str, namespace: str) -> None:
        """Signal cancel; a closed Run is left as it is."""
        handle = await self._handle(name, namespace)
        try:
            await self._rpc(handle.signal(SIGNAL_CANCEL), namespace=namespace, name=name)
        except RunNotFound:
            await self._rpc(handle.describe(), namespace=namespace, name=name)  # closed: a no-op

    async def delete(self, name: str, namespace: str, *, timeout: float | None, wait: bool) -> RunStatus:
        """The delete update (cancel if needed, clean up, close) or, for a finished Run, its
        RetentionWorkflow's delete_now; the Run's last status. Both index KrtPhase=Deleted
        before the execution is deleted from Temporal. `wait`: return once no listing shows the
        Run (visibility is eventually consistent). RunNotFound if it was deleted already."""
        from kruntimes.wire import search

        handle = await self._handle(name, namespace)
        try:
            async with asyncio.timeout(timeout if timeout is not None else MAX_DELETE_WAIT_S):
                final, uid = await self._delete(handle, namespace=namespace, name=name)
                if wait and uid:
                    await self._unlisted(search.listed(run_uid=uid), namespace=namespace, name=name)
                return final
        except TimeoutError as e:
            raise WaitTimeout(
                f"run {name!r} in namespace {namespace!r} was not deleted within "
                f"{timeout if timeout is not None else MAX_DELETE_WAIT_S:g} s: "
                "is the kruntimes worker running (`krt status`)?"
            ) from e

    async def _delete(self, handle: Any, *, namespace: str, name: str) -> tuple[RunStatus, str]:
        """Delete the Run's current execution; its last status and uid."""
        from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowUpdateFailedError

        from kruntimes.wire import search

        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        client = await self.temporal()
        this = client.get_workflow_handle(handle.id, run_id=description.run_id, result_type=RunStatus)
        uid = _first_attr(description, search.RUN_UID)
        final: RunStatus | None = None
        if description.status == WorkflowExecutionStatus.RUNNING:
            try:
                await self._rpc(this.execute_update(UPDATE_DELETE), namespace=namespace, name=name)
                try:  # it closes right after the update: its result is the final status
                    final = await self._rpc(this.result(), namespace=namespace, name=name)
                except WorkflowFailureError as e:
                    final = _failed_status(e.cause)
            except (RunNotFound, WorkflowUpdateFailedError):
                description = await self._rpc(this.describe(), namespace=namespace, name=name)  # it ended
        if final is None:
            final = await self._final(this, description, namespace=namespace, name=name)  # NotFound if gone
        if uid:
            # A Run that finished before the update came: its retention lists it until told.
            retention = client.get_workflow_handle(retention_workflow_id(RunUid(uid)))
            with contextlib.suppress(RunNotFound):
                await self._rpc(retention.signal(SIGNAL_DELETE_NOW), namespace=namespace, name=name)
        await self._forget(handle.id, description.run_id, namespace=namespace, name=name)
        return final, uid

    async def _unlisted(self, query: str, *, namespace: str, name: str) -> None:
        """Until that visibility query counts nothing (the caller bounds the wait)."""
        client = await self.temporal()
        while True:
            counted = await self._rpc(client.count_workflows(query), namespace=namespace, name=name)
            if counted.count == 0:
                return
            await asyncio.sleep(UNLISTED_POLL_S)

    async def _forget(self, workflow_id: str, run_id: str | None, *, namespace: str, name: str) -> None:
        """Delete that closed execution from Temporal (a later Run of the name is another one)."""
        from temporalio.api.common.v1 import WorkflowExecution
        from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest

        client = await self.temporal()
        request = DeleteWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""),
        )
        with contextlib.suppress(RunNotFound):  # deleted meanwhile (its retention ran out)
            await self._rpc(
                client.workflow_service.delete_workflow_execution(request), namespace=namespace, name=name
            )

    async def hosts(self) -> builtins.list[HostView]:
        """Every runtime host the pools hold (each pool's `pool` query), with the run slots used."""
        client = await self.temporal()
        pools: builtins.list[str] = []

        async def collect() -> None:
            query = "WorkflowType='RuntimePoolWorkflow' AND ExecutionStatus='Running'"
            async for execution in client.list_workflows(query):
                pools.append(execution.id)

        await self._rpc(collect(), namespace="*", name="*")

        from kruntimes.temporal.connect import query_pool

        async def pool(workflow_id: str) -> PoolState | None:
            try:
                state: PoolState = await self._rpc(
                    query_pool(client, workflow_id, rpc_timeout=QUERY_TIMEOUT),
                    namespace="*",
                    name=workflow_id,
                )
            except RunNotFound:
                return None
            return state

        views: builtins.list[HostView] = []
        for state in await asyncio.gather(*(pool(p) for p in pools)):
            if state is None:
                continue
            for host in state.hosts:
                used = sum(1 for r in state.reservations if r.hostUid == host.hostUid)
                views.append(HostView(host=host, used=used))
        return sorted(views, key=lambda v: (v.host.runtime, v.host.hostId))

    # -- workflow reads ------------------------------------------------------------------------------

    async def _manifest(self, handle: Any, *, namespace: str, name: str) -> Run:
        """The Run the workflow was started with (its first history event's input)."""

        async def first() -> Any:
            async for event in handle.fetch_history_events(page_size=1):
                return event
            return None

        event = await self._rpc(first(), namespace=namespace, name=name)
        if event is None or not event.HasField("workflow_execution_started_event_attributes"):
            raise RunNotFound(namespace, name)
        return await self._decoded_manifest(event, handle)

    async def _decoded_manifest(self, event: Any, handle: Any) -> Run:
        """The Run in a WorkflowExecutionStarted event's input."""
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        client = await self.temporal()
        try:
            [run_input] = await client.data_converter.decode(payloads, [RunInput])
        except Exception as e:
            raise KruntimesError(f"workflow {handle.id} does not hold a Run: {type(e).__name__}") from e
        run: Run = run_input.run
        return run

    async def _written_status(self, payload: Any) -> RunStatus | None:
        """The status a Run wrote to its history with a phase (PhaseWatch.status), decoded; None
        if it wrote none, or one this client cannot read (then the Run is asked)."""
        if payload is None:
            return None
        client = await self.temporal()
        try:
            [status] = await client.data_converter.decode([payload], [RunStatus])
        except Exception:  # not one this client can read: the query's answer says why
            return None
        return status if isinstance(status, RunStatus) else None

    async def _query(self, handle: Any, *, namespace: str, name: str) -> RunStatus:
        status: RunStatus = await self._rpc(
            handle.query(QUERY_STATUS, result_type=RunStatus, rpc_timeout=QUERY_TIMEOUT),
            namespace=namespace,
            name=name,
        )
        return status

    @overload
    async def _status(self, handle: Any, *, namespace: str, name: str) -> RunStatus: ...
    @overload
    async def _status(self, handle: Any, *, namespace: str, name: str, patient: bool) -> RunStatus | None: ...

    async def _status(
        self, handle: Any, *, namespace: str, name: str, patient: bool = False
    ) -> RunStatus | None:
        """The status (a query; a closed Run's final status). `patient`: None when the query
        timed out."""
        from temporalio.client import RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError
        from temporalio.service import RPCStatusCode

        if patient:
            try:
                status: RunStatus = await handle.query(
                    QUERY_STATUS, result_type=RunStatus, rpc_timeout=QUERY_TIMEOUT
                )
                return status
            except RPCTimeoutOrCancelledError:
                return None
            except RPCError as e:
                # The query's own timeout: DEADLINE_EXCEEDED from the server, CANCELLED ("Timeout
                # expired") when the client's rpc_timeout ran out first. Asking again at once
                # would wait behind the same task: no answer yet.
                if e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                    return None
            except WorkflowQueryFailedError:
                pass
        try:
            return await self._query(handle, namespace=namespace, name=name)
        except (RunNotFound, WorkflowQueryFailedError):
            description = await self._rpc(handle.describe(), namespace=namespace, name=name)
            return await self._final(handle, description, namespace=namespace, name=name)

    async def _final(self, handle: Any, description: Any, *, namespace: str, name: str) -> RunStatus:
        """The status of a closed Run: its result, or a Failed status saying how it ended."""
        from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

        from kruntimes.wire import search

        if description.status == WorkflowExecutionStatus.RUNNING:
            return await self._query(handle, namespace=namespace, name=name)
        if await self._deleted(description, namespace=namespace, name=name):
            raise RunNotFound(namespace, name)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            with contextlib.suppress(WorkflowFailureError):
                result: RunStatus = await self._rpc(handle.result(), namespace=namespace, name=name)
                return result
        if description.status == WorkflowExecutionStatus.FAILED:
            try:
                await self._rpc(handle.result(), namespace=namespace, name=name)
            except WorkflowFailureError as e:
                failed = _failed_status(e.cause)
                if failed is not None:
                    return failed
        how = description.status.name.lower().replace("_", " ") if description.status else "closed"
        last = _first_attr(description, search.PHASE)
        phase = (
            RunPhase(last)
            if last in RunPhase.__members__ and is_terminal(RunPhase(last))
            else RunPhase.Failed
        )
        return RunStatus(phase=phase, message=f"the Run's workflow was {how}")

    async def _deleted(self, description: Any, *, namespace: str, name: str) -> bool:
        """Whether this closed execution is a deleted Run (its RetentionWorkflow ended: the
        ttlSecondsAfterFinished ran out or it was deleted; or it says KrtPhase=Deleted), though
        Temporal still answers for it a while. A closed Run without one (terminated) is not."""
        from temporalio.client import WorkflowExecutionStatus

        from kruntimes.wire import search

        uid = _first_attr(description, search.RUN_UID)
        if not uid:
            return False
        client = await self.temporal()
        retention = client.get_workflow_handle(retention_workflow_id(RunUid(uid)))
        try:
            kept = await self._rpc(retention.describe(), namespace=namespace, name=name)
        except RunNotFound:
            return False
        if _first_attr(description, search.PHASE) == search.DELETED:
            return True
        return bool(
            kept.status != WorkflowExecutionStatus.RUNNING
            or _first_attr(kept, search.PHASE) == search.DELETED
        )


def _run_workflow_of(execution: Any) -> str | None:
    """The RunWorkflow id a listed execution stands for: its own, or its parent's (a retention)."""
    workflow_id = execution.parent_id if execution.workflow_type == "RetentionWorkflow" else execution.id
    if not workflow_id or not workflow_id.startswith("run/") or workflow_id.count("/") != 2:
        return None
    return str(workflow_id)


# --- what create sends and apply compares -------------------------------------------------------


def prepare(run: Run, *, creator: Creator | None = None) -> Run:
    """What create sends: a uid (uuid4) when missing, an absolute source.path, and `creator` as
    the Run's creator (whatever the manifest said: who starts it is the client's to say)."""
    metadata, spec = run.metadata, run.spec
    if metadata.uid is None:
        metadata = metadata._replace(uid=str(uuid.uuid4()))
    if metadata.creator != creator:
        metadata = metadata._replace(creator=creator)
    path = spec.source.path
    if path is not None and not Path(path).is_absolute():
        spec = spec._replace(source=spec.source._replace(path=str(Path(path).resolve())))
    if metadata is run.metadata and spec is run.spec and run.status is None:
        return run
    return Run(apiVersion=run.apiVersion, kind=run.kind, metadata=metadata, spec=spec)


def differences(existing: Run, wanted: Run, *, uid: str | None) -> list[str]:
    """What ``wanted`` would change on ``existing``; ``uid``: the one the caller gave, if any."""
    fields = []
    if uid is not None and uid != existing.metadata.uid:
        fields.append("metadata.uid")
    if wanted.metadata.labels != existing.metadata.labels:
        fields.append("metadata.labels")
    if wanted.spec != existing.spec:
        fields.extend(
            f"spec.{key}"
            for key in type(wanted.spec).model_fields
            if getattr(wanted.spec, key) != getattr(existing.spec, key)
        )
    return fields


# --- helpers ------------------------------------------------------------------------------------


def _check_name(name: str, namespace: str) -> None:
    try:
        validate_dns1123_label(name, field="name")
        validate_dns1123_label(namespace, field="namespace")
    except ValueError as e:
        raise RunNotFound(namespace, name) from e


def _failed_status(cause: BaseException | None) -> RunStatus | None:
    """The final status a Failed Run carries in its failure's details (an ApplicationError whose
    type is the reason)."""
    from temporalio.exceptions import ApplicationError

    if not isinstance(cause, ApplicationError) or not cause.details:
        return None
    try:
        return RunStatus.model_validate(cause.details[0])
    except ValueError:
        return None


def _first_attr(description: Any, key: str) -> str:
    values = (description.search_attributes or {}).get(key) or [""]
    return str(values[0])


# Phases a Run always indexes (KrtPhase) in the task that enters them.
_INDEXED = frozenset(
    {RunPhase.Ready, RunPhase.Succeeded, RunPhase.Failed, RunPhase.Timeout, RunPhase.Cancelled}
)


def _wanted(run: Run, until: RunPhase | Iterable[RunPhase] | None) -> frozenset[RunPhase]:
    if until is None:
        return frozenset({RunPhase.Succeeded if run.spec.mode.kind == "task" else RunPhase.Ready})
    if isinstance(until, RunPhase | str):
        return frozenset({RunPhase(until)})
    return frozenset(RunPhase(p) for p in until)
