"""The kruntimes Python SDK: create, watch, invoke and remove Runs.

    async with Client.from_config() as krt:          # client.json from `krt up`, or KRT_* variables
        run = await krt.create(Run.from_yaml(text))   # metadata.uid set when missing
        run = await krt.wait(run.metadata.name)       # Ready (function) or Succeeded (task)
        answer = await krt.invoke(run, {"name": "x"}) # over HTTPS through the gateway
        await krt.delete(run.metadata.name)

The control plane is Temporal (a Run is the RunWorkflow `run/{namespace}/{name}`), so an app may
equally start RunWorkflow with the plain Temporal SDK; this client adds the conventions (uids,
absolute source paths, typed errors) and the invoke path, which never touches Temporal.

Errors::

    KruntimesError
     ├── ConfigError        Temporal or the gateway cannot be reached, or the config is unusable
     ├── RunNotFound        no Run of that name in that namespace
     ├── RunAlreadyExists   create: a Run of that name is running
     ├── SpecConflict       apply: a running Run of that name has another spec (spec is immutable)
     ├── WaitTimeout        wait/delete: the wanted phase did not come in time
     ├── RunFailed          wait: the Run ended (Failed, Timeout, Cancelled) instead; .phase .message
     └── InvokeError        an invocation was refused or failed; .status .reason .invocation_id
          ├── Busy               429: the function runs another invocation; .retry_after
          ├── FunctionNotFound   404: no such function (unknown, finished, or not a function Run)
          ├── NotReady           503: known but not ready now; .retry_after
          ├── Unauthorized       401/403: the token is missing, unknown, or not allowed here
          ├── PayloadRejected    400/413: bad invocation id, timeout, JSON, or a body over 1 MiB
          ├── OutcomeUnknown     502/504, or the connection broke after sending: the function
          │                      may have run; the SDK never retries it
          └── InvocationFailed   200 with HandlerError/InvalidOutput; .result holds the answer

Library errors (temporalio, aiohttp) are wrapped with ``raise ... from e`` and never leak.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field

from kruntimes import clientconfig
from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.names import validate_dns1123_label
from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import Run
from kruntimes.api.status import Endpoint, RunStatus
from kruntimes.clientconfig import ClientConfig
from kruntimes.lifecycle import (
    QUERY_POOL,
    QUERY_STATUS,
    SIGNAL_CANCEL,
    UPDATE_DELETE,
    PoolState,
    RunInput,
    run_workflow_id,
)
from kruntimes.scheduling.model import Host

if TYPE_CHECKING:
    import aiohttp
    import temporalio.client

__all__ = [
    "Applied",
    "Busy",
    "Client",
    "ConfigError",
    "FunctionNotFound",
    "HostView",
    "InvocationFailed",
    "InvokeError",
    "InvokeResult",
    "KruntimesError",
    "NotReady",
    "OutcomeUnknown",
    "PayloadRejected",
    "RunAlreadyExists",
    "RunFailed",
    "RunNotFound",
    "RunObject",
    "SpecConflict",
    "Unauthorized",
    "WaitTimeout",
]

INVOCATION_HEADER = "X-Kruntime-Invocation-ID"
TIMEOUT_HEADER = "X-Kruntime-Timeout"
QUERY_TIMEOUT = timedelta(seconds=10)
POLL_INTERVAL_S = 0.1
# How long past the invocation timeout the SDK waits for the gateway's own answer (504).
ANSWER_MARGIN_S = 15.0
_LIST_CONCURRENCY = 16


# --- errors -------------------------------------------------------------------------------------


class KruntimesError(Exception):
    """Every error the SDK raises."""


class ConfigError(KruntimesError):
    pass


class RunNotFound(KruntimesError):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"run {name!r} not found in namespace {namespace!r}")
        self.namespace = namespace
        self.name = name


class RunAlreadyExists(KruntimesError):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"run {name!r} already exists in namespace {namespace!r}")
        self.namespace = namespace
        self.name = name


class SpecConflict(KruntimesError):
    def __init__(self, namespace: str, name: str, fields: list[str]) -> None:
        super().__init__(
            f"run {name!r} in namespace {namespace!r} exists with another {', '.join(fields)}; "
            "a Run's spec is immutable"
        )
        self.namespace = namespace
        self.name = name
        self.fields = tuple(fields)


class WaitTimeout(KruntimesError):
    def __init__(self, message: str, *, phase: RunPhase | None = None) -> None:
        super().__init__(message)
        self.phase = phase


class RunFailed(KruntimesError):
    def __init__(self, run: RunObject) -> None:
        status = run.status
        detail = f": {status.message}" if status.message else ""
        super().__init__(f"run {run.metadata.name!r} ended {status.phase.value}{detail}")
        self.run = run
        self.phase = status.phase
        self.message = status.message


class InvokeError(KruntimesError):
    def __init__(self, status: int, reason: str, message: str, *, invocation_id: str) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.status = status
        self.reason = reason
        self.message = message
        self.invocation_id = invocation_id


class Busy(InvokeError):
    def __init__(
        self, status: int, reason: str, message: str, *, invocation_id: str, retry_after: float
    ) -> None:
        super().__init__(status, reason, message, invocation_id=invocation_id)
        self.retry_after = retry_after


class FunctionNotFound(InvokeError):
    pass


class NotReady(InvokeError):
    def __init__(
        self, status: int, reason: str, message: str, *, invocation_id: str, retry_after: float
    ) -> None:
        super().__init__(status, reason, message, invocation_id=invocation_id)
        self.retry_after = retry_after


class Unauthorized(InvokeError):
    pass


class PayloadRejected(InvokeError):
    pass


class OutcomeUnknown(InvokeError):
    pass


class InvocationFailed(InvokeError):
    def __init__(self, result: InvokeResult) -> None:
        error = result.error or {}
        message = ": ".join(str(error[k]) for k in ("type", "message") if error.get(k))
        super().__init__(200, result.status, message, invocation_id=result.invocationId)
        self.result = result


# --- results ------------------------------------------------------------------------------------


class RunObject(Run):
    """A Run as the platform holds it: the manifest it was created with, and its current status."""

    status: RunStatus = Field(default_factory=RunStatus)
    # When its workflow started, and whether it has ended (deleted or expired): not manifest fields.
    created: datetime | None = Field(default=None, exclude=True)
    closed: bool = Field(default=False, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def uid(self) -> str:
        return self.metadata.uid or ""

    def manifest(self) -> dict[str, Any]:
        """The Run object as `krt ... -o json` prints it: apiVersion, kind, metadata, spec, status."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class Applied:
    run: RunObject
    created: bool  # False: an identical Run was already there


class Captured(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    data: str = ""
    truncated: bool = False
    totalBytes: int = 0


class InvokeResult(BaseModel):
    """The gateway's answer to one invocation that ran (HTTP 200)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    invocationId: str
    status: str  # Succeeded | HandlerError | InvalidOutput
    outputs: Any = None
    stdout: Captured = Field(default_factory=Captured)
    stderr: Captured = Field(default_factory=Captured)
    durationMs: float = 0.0
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "Succeeded"


@dataclass(frozen=True)
class HostView:
    host: Host
    used: int  # run slots reserved on it


# --- the client ---------------------------------------------------------------------------------

StatusCallback = Callable[[RunStatus], None]
InvokeTarget = str | Run | RunStatus | Endpoint


class Client:
    """An async client of one kruntimes platform. One Temporal connection (made on first use)
    and one HTTPS session (keep-alive) per Client; close it, or use it as a context manager."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        temporal: temporalio.client.Client | None = None,
    ) -> None:
        self.config = config if config is not None else ClientConfig()
        self._temporal = temporal
        self._connecting = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    @classmethod
    def from_config(cls, config: ClientConfig | None = None) -> Client:
        """A client of the platform `krt up` describes (client.json, then KRT_* variables)."""
        return cls(config if config is not None else clientconfig.load())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- Temporal ----------------------------------------------------------------------------------

    async def temporal(self) -> temporalio.client.Client:
        """The Temporal client (pydantic data converter), connected on first use."""
        async with self._connecting:
            if self._temporal is None:
                from kruntimes.temporal import connect

                address = self.config.temporalAddress
                try:
                    self._temporal = await connect(address, self.config.temporalNamespace)
                except Exception as e:
                    raise ConfigError(f"cannot reach Temporal at {address}: is `krt up` running?") from e
            return self._temporal

    def _unavailable(self) -> ConfigError:
        return ConfigError(f"cannot reach Temporal at {self.config.temporalAddress}: is `krt up` running?")

    async def _handle(self, name: str, namespace: str) -> temporalio.client.WorkflowHandle[Any, Any]:
        _check_name(name, namespace)
        client = await self.temporal()
        return client.get_workflow_handle(run_workflow_id(namespace, name), result_type=RunStatus)

    async def _rpc(self, call: Any, *, namespace: str, name: str) -> Any:
        """Await a Temporal call, mapping its errors onto ours."""
        from temporalio.client import RPCError, RPCTimeoutOrCancelledError
        from temporalio.service import RPCStatusCode

        try:
            return await call
        except RPCTimeoutOrCancelledError as e:
            raise ConfigError(
                f"Temporal at {self.config.temporalAddress} did not answer for run {namespace}/{name}: "
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
            raise KruntimesError(f"Temporal refused the request for run {namespace}/{name}: {e}") from e

    # -- Runs ----------------------------------------------------------------------------------------

    async def create(self, run: Run) -> RunObject:
        """Start a Run; raises RunAlreadyExists while a Run of that name is running."""
        from temporalio.exceptions import WorkflowAlreadyStartedError

        from kruntimes.starting import start_run

        run = prepare(run)
        name, namespace = run.metadata.name, run.metadata.namespace
        _check_name(name, namespace)
        client = await self.temporal()
        try:
            await self._rpc(start_run(client, run), namespace=namespace, name=name)
        except WorkflowAlreadyStartedError as e:
            raise RunAlreadyExists(namespace, name) from e
        return RunObject(
            apiVersion=run.apiVersion,
            kind=run.kind,
            metadata=run.metadata,
            spec=run.spec,
            created=datetime.now(UTC),
        )

    async def apply(self, run: Run) -> Applied:
        """Create the Run unless a running one of that name has the same spec (then: a no-op).

        A different spec (or labels, or uid) raises SpecConflict: the spec is immutable.
        """
        given_uid = run.metadata.uid
        run = prepare(run)
        name, namespace = run.metadata.name, run.metadata.namespace
        for _ in range(2):  # a create racing ours: compare with what it created
            try:
                existing = await self.get(name, namespace=namespace)
            except RunNotFound:
                existing = None
            if existing is not None and not existing.closed:
                conflicts = _differences(existing, run, uid=given_uid)
                if conflicts:
                    raise SpecConflict(namespace, name, conflicts)
                return Applied(existing, created=False)
            try:
                return Applied(await self.create(run), created=True)
            except RunAlreadyExists:
                continue
        raise RunAlreadyExists(namespace, name)

    async def get(self, name: str, namespace: str = "default") -> RunObject:
        """The Run's manifest and status (the `status` query; a closed Run's final result)."""
        from temporalio.client import WorkflowExecutionStatus

        handle = await self._handle(name, namespace)
        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        run = await self._manifest(handle, namespace=namespace, name=name)
        if description.status == WorkflowExecutionStatus.RUNNING:
            status = await self._query(handle, namespace=namespace, name=name)
        else:
            status = await self._final(handle, description, namespace=namespace, name=name)
        return _object(
            run, status, description.start_time, closed=description.status != WorkflowExecutionStatus.RUNNING
        )

    async def status(self, name: str, namespace: str = "default") -> RunStatus:
        """The Run's status only (one query; a closed Run's final result)."""
        handle = await self._handle(name, namespace)
        return await self._status(handle, namespace=namespace, name=name)

    async def list(
        self, namespace: str | None = None, phase: RunPhase | str | None = None
    ) -> list[RunObject]:
        """The existing Runs (their workflows running), of one namespace or all, by name."""
        query = "WorkflowType='RunWorkflow' AND ExecutionStatus='Running'"
        if namespace is not None:
            try:
                validate_dns1123_label(namespace, field="namespace")
            except ValueError:
                return []  # no Run can live there
            query += f" AND KrtNamespace='{namespace}'"
        if phase is not None:
            query += f" AND KrtPhase='{RunPhase(phase).value}'"
        client = await self.temporal()
        ids: list[str] = []

        async def collect() -> None:
            async for execution in client.list_workflows(query):
                ids.append(execution.id)

        await self._rpc(collect(), namespace=namespace or "*", name="*")
        limit = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(workflow_id: str) -> RunObject | None:
            _, ns, name = workflow_id.split("/", 2)
            async with limit:
                try:
                    return await self.get(name, namespace=ns)
                except RunNotFound:
                    return None

        found = await asyncio.gather(*(one(i) for i in ids if i.count("/") == 2))
        runs = [r for r in found if r is not None and not r.closed]
        if phase is not None:  # visibility lags the query a little
            runs = [r for r in runs if r.status.phase == RunPhase(phase)]
        return sorted(runs, key=lambda r: (r.metadata.namespace, r.metadata.name))

    async def wait(
        self,
        name: str,
        namespace: str = "default",
        *,
        until: RunPhase | Iterable[RunPhase] | None = None,
        timeout: float | None = 60.0,
        interval: float = POLL_INTERVAL_S,
        on_status: StatusCallback | None = None,
    ) -> RunObject:
        """Wait until the Run reaches a phase of ``until``.

        ``until`` defaults to Ready for a function Run and Succeeded for a task Run. Any other
        terminal phase raises RunFailed (a Succeeded Run is returned even when not asked for);
        ``timeout`` seconds without it raise WaitTimeout. The status changes only when one of the
        Run's workflow tasks completes: the Run's history is long-polled and the status queried
        after each completed task (``on_status`` sees each of those statuses); ``interval`` is
        the pause before polling again should the long poll fail.
        """
        run = await self.get(name, namespace=namespace)
        wanted = _wanted(run, until)
        handle = await self._handle(name, namespace)
        deadline = None if timeout is None else time.monotonic() + timeout
        status = run.status
        tasks: _TaskWatch | None = None
        while True:
            if on_status is not None:
                on_status(status)
            if status.phase in wanted or status.phase is RunPhase.Succeeded:
                return run._replace(status=status)
            if is_terminal(status.phase):
                raise RunFailed(run._replace(status=status))
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                names = " or ".join(sorted(p.value for p in wanted))
                raise WaitTimeout(
                    f"run {name!r} in namespace {namespace!r} is still {status.phase.value} after "
                    f"{timeout:g} s (waiting for {names})",
                    phase=status.phase,
                )
            if tasks is None:
                description = await self._rpc(handle.describe(), namespace=namespace, name=name)
                tasks = _TaskWatch(
                    handle, after=description.raw_description.workflow_execution_info.history_length
                )
            try:
                await asyncio.wait_for(tasks.next(), remaining)
            except TimeoutError:
                pass  # the deadline check above raises
            except Exception:  # the long poll failed (a transient RPC error): poll again shortly
                tasks = None
                await asyncio.sleep(interval)
            status = await self._status(handle, namespace=namespace, name=name)

    async def cancel(self, name: str, namespace: str = "default") -> None:
        """Ask the Run to stop (idempotent; a finished Run is left as it is)."""
        handle = await self._handle(name, namespace)
        try:
            await self._rpc(handle.signal(SIGNAL_CANCEL), namespace=namespace, name=name)
        except RunNotFound:
            await self._rpc(handle.describe(), namespace=namespace, name=name)  # closed: a no-op

    async def delete(
        self, name: str, namespace: str = "default", *, timeout: float | None = 120.0
    ) -> RunStatus:
        """Cancel the Run if needed, run its cleanup, and end it; returns its final status.

        Deleting a Run that already ended is a no-op that returns its last status.
        """
        from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError

        handle = await self._handle(name, namespace)
        description = await self._rpc(handle.describe(), namespace=namespace, name=name)
        if description.status != WorkflowExecutionStatus.RUNNING:
            return await self._final(handle, description, namespace=namespace, name=name)
        try:
            async with asyncio.timeout(timeout):
                result: RunStatus = await self._rpc(
                    handle.execute_update(UPDATE_DELETE, result_type=RunStatus),
                    namespace=namespace,
                    name=name,
                )
                return result
        except TimeoutError as e:
            raise WaitTimeout(
                f"run {name!r} in namespace {namespace!r} was not deleted within {timeout:g} s: "
                "is the kruntimes worker running (`krt status`)?"
            ) from e
        except (RunNotFound, WorkflowUpdateFailedError):
            # It ended while the update was on its way.
            description = await self._rpc(handle.describe(), namespace=namespace, name=name)
            return await self._final(handle, description, namespace=namespace, name=name)

    async def hosts(self) -> builtins.list[HostView]:
        """Every runtime host the pools hold, with the run slots used on each."""
        client = await self.temporal()
        pools: list[str] = []

        async def collect() -> None:
            query = "WorkflowType='RuntimePoolWorkflow' AND ExecutionStatus='Running'"
            async for execution in client.list_workflows(query):
                pools.append(execution.id)

        await self._rpc(collect(), namespace="*", name="*")

        async def pool(workflow_id: str) -> PoolState | None:
            handle = client.get_workflow_handle(workflow_id)
            try:
                state: PoolState = await self._rpc(
                    handle.query(QUERY_POOL, result_type=PoolState, rpc_timeout=QUERY_TIMEOUT),
                    namespace="*",
                    name=workflow_id,
                )
            except RunNotFound:
                return None
            return state

        views: list[HostView] = []
        for state in await asyncio.gather(*(pool(p) for p in pools)):
            if state is None:
                continue
            for host in state.hosts:
                used = sum(1 for r in state.reservations if r.hostUid == host.hostUid)
                views.append(HostView(host=host, used=used))
        return sorted(views, key=lambda v: (v.host.runtime, v.host.hostId))

    # -- invoke --------------------------------------------------------------------------------------

    async def invoke(
        self,
        target: InvokeTarget,
        data: Any = None,
        *,
        namespace: str = "default",
        invocation_id: str | None = None,
        timeout: float | None = None,
    ) -> InvokeResult:
        """Invoke a Ready function Run once and return its answer; never retried.

        ``target`` is a Run name (its endpoint is looked up), a Run or RunStatus from ``wait``, an
        Endpoint, or the invoke URL. ``data`` is sent as JSON (``bytes`` as they are; None: no
        body). ``timeout`` bounds the invocation (X-Kruntime-Timeout); past it the answer is
        OutcomeUnknown (504), since the function may have run.
        """
        endpoint = await self._endpoint(target, namespace)
        inv = invocation_id or str(uuid.uuid4())
        headers = {INVOCATION_HEADER: inv, "Content-Type": "application/json"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        if timeout is not None:
            headers[TIMEOUT_HEADER] = f"{timeout:g}"
        if data is None:
            body = b""
        elif isinstance(data, bytes | bytearray):
            body = bytes(data)
        else:
            body = json.dumps(data, separators=(",", ":")).encode()
        if len(body) > MAX_PAYLOAD_BYTES:  # the gateway's 413, without sending the body
            raise PayloadRejected(
                413,
                "PayloadTooLarge",
                f"the body is {len(body)} bytes, larger than {MAX_PAYLOAD_BYTES}",
                invocation_id=inv,
            )
        return await self._post(endpoint, body, headers, inv, timeout)

    async def _endpoint(self, target: InvokeTarget, namespace: str) -> Endpoint:
        if isinstance(target, Endpoint):
            return target
        if isinstance(target, str) and target.startswith(("https://", "http://")):
            protocol = "HTTPS" if target.startswith("https://") else "HTTP"
            return Endpoint.model_validate({"protocol": protocol, "url": target})
        run: Run | None = None
        if isinstance(target, RunStatus):
            status = target
        else:
            if isinstance(target, str):
                status = await self.status(target, namespace=namespace)  # one query on the hot path
                if status.phase is RunPhase.Ready and status.endpoint is not None:
                    return status.endpoint
                run = await self.get(target, namespace=namespace)
            else:
                run = target
                if target.status is None or target.status.phase is not RunPhase.Ready:
                    run = await self.get(target.metadata.name, namespace=target.metadata.namespace)
            status = run.status or RunStatus()
        label = f"run {run.metadata.name!r}" if run is not None else "the run"
        if run is not None and run.spec.mode.kind == "task":
            raise FunctionNotFound(
                404, "NotAFunction", f"{label} is a task, not a function", invocation_id=""
            )
        if status.endpoint is not None and status.phase is RunPhase.Ready:
            return status.endpoint
        if is_terminal(status.phase):
            raise FunctionNotFound(
                404, "RunFinished", f"{label} has ended {status.phase.value}", invocation_id=""
            )
        raise NotReady(
            503,
            "RunNotReady",
            f"{label} is {status.phase.value}, not Ready",
            invocation_id="",
            retry_after=1.0,
        )

    async def _post(
        self, endpoint: Endpoint, body: bytes, headers: dict[str, str], inv: str, timeout: float | None
    ) -> InvokeResult:
        import aiohttp

        session = self._http()
        read_s = (timeout if timeout is not None else DEFAULT_INVOKE_TIMEOUT_SECONDS) + ANSWER_MARGIN_S
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_s)
        ssl_context = self._ssl_context(endpoint) if endpoint.url.startswith("https://") else None
        try:
            async with session.post(
                endpoint.url, data=body, headers=headers, ssl=ssl_context or True, timeout=client_timeout
            ) as response:
                raw = await response.read()
                return _answer(response.status, response.headers, raw, inv)
        except aiohttp.ClientConnectorCertificateError as e:
            raise ConfigError(
                f"the gateway's certificate at {endpoint.url} is not trusted: set caFile (KRT_CA_FILE) "
                "to the platform CA"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise ConfigError(
                f"cannot reach the gateway at {_origin(endpoint.url)}: is `krt up` running?"
            ) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise OutcomeUnknown(
                0,
                "ConnectionLost",
                f"the connection broke after the request was sent ({type(e).__name__}); "
                "the function may have run",
                invocation_id=inv,
            ) from e

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=60),
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "kruntimes-sdk"},
            )
        return self._session

    def _ssl_context(self, endpoint: Endpoint) -> ssl.SSLContext:
        ca_file = self.config.caFile
        key = f"file:{ca_file}" if ca_file else f"pem:{endpoint.caBundle}" if endpoint.caBundle else "system"
        context = self._ssl.get(key)
        if context is None:
            try:
                if ca_file:
                    context = ssl.create_default_context(cafile=ca_file)
                elif endpoint.caBundle:
                    context = ssl.create_default_context(cadata=endpoint.caBundle)
                else:
                    context = ssl.create_default_context()
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"cannot load the CA file {ca_file}: {e}") from e
            self._ssl[key] = context
        return context

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
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        client = await self.temporal()
        try:
            [run_input] = await client.data_converter.decode(payloads, [RunInput])
        except Exception as e:
            raise KruntimesError(f"workflow {handle.id} does not hold a Run: {type(e).__name__}") from e
        run: Run = run_input.run
        return run

    async def _query(self, handle: Any, *, namespace: str, name: str) -> RunStatus:
        status: RunStatus = await self._rpc(
            handle.query(QUERY_STATUS, result_type=RunStatus, rpc_timeout=QUERY_TIMEOUT),
            namespace=namespace,
            name=name,
        )
        return status

    async def _status(self, handle: Any, *, namespace: str, name: str) -> RunStatus:
        from temporalio.client import WorkflowQueryFailedError

        try:
            return await self._query(handle, namespace=namespace, name=name)
        except (RunNotFound, WorkflowQueryFailedError):
            description = await self._rpc(handle.describe(), namespace=namespace, name=name)
            return await self._final(handle, description, namespace=namespace, name=name)

    async def _final(self, handle: Any, description: Any, *, namespace: str, name: str) -> RunStatus:
        """The status of a closed Run: its result, or a Failed status saying how it ended."""
        from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

        if description.status == WorkflowExecutionStatus.RUNNING:
            return await self._query(handle, namespace=namespace, name=name)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            with contextlib.suppress(WorkflowFailureError):
                result: RunStatus = await self._rpc(handle.result(), namespace=namespace, name=name)
                return result
        how = description.status.name.lower().replace("_", " ") if description.status else "closed"
        last = _first_attr(description, "KrtPhase")
        phase = (
            RunPhase(last)
            if last in RunPhase.__members__ and is_terminal(RunPhase(last))
            else RunPhase.Failed
        )
        return RunStatus(phase=phase, message=f"the Run's workflow was {how}")


# --- helpers ------------------------------------------------------------------------------------


def prepare(run: Run) -> Run:
    """What create sends: a uid (uuid4) when missing and an absolute source.path."""
    metadata, spec = run.metadata, run.spec
    if metadata.uid is None:
        metadata = metadata._replace(uid=str(uuid.uuid4()))
    path = spec.source.path
    if path is not None and not Path(path).is_absolute():
        spec = spec._replace(source=spec.source._replace(path=str(Path(path).resolve())))
    if metadata is run.metadata and spec is run.spec and run.status is None:
        return run
    return Run(apiVersion=run.apiVersion, kind=run.kind, metadata=metadata, spec=spec)


class _TaskWatch:
    """The next completed workflow task (or the close) of a Run, by long-polling its history."""

    def __init__(self, handle: Any, *, after: int) -> None:
        self.after = after  # events up to this id were there already
        self.events = handle.fetch_history_events(wait_new_event=True).__aiter__()

    async def next(self) -> None:
        from temporalio.api.enums.v1 import EventType

        while True:
            try:
                event = await self.events.__anext__()
            except StopAsyncIteration:  # the workflow closed
                await asyncio.sleep(POLL_INTERVAL_S)
                return
            if event.event_id <= self.after:
                continue
            self.after = event.event_id
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return


def _check_name(name: str, namespace: str) -> None:
    try:
        validate_dns1123_label(name, field="name")
        validate_dns1123_label(namespace, field="namespace")
    except ValueError as e:
        raise RunNotFound(namespace, name) from e


def _first_attr(description: Any, key: str) -> str:
    values = (description.search_attributes or {}).get(key) or [""]
    return str(values[0])


def _object(run: Run, status: RunStatus, created: datetime | None, *, closed: bool) -> RunObject:
    return RunObject(
        apiVersion=run.apiVersion,
        kind=run.kind,
        metadata=run.metadata,
        spec=run.spec,
        status=status,
        created=created,
        closed=closed,
    )


def _differences(existing: Run, wanted: Run, *, uid: str | None) -> list[str]:
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


def _wanted(run: Run, until: RunPhase | Iterable[RunPhase] | None) -> frozenset[RunPhase]:
    if until is None:
        return frozenset({RunPhase.Succeeded if run.spec.mode.kind == "task" else RunPhase.Ready})
    if isinstance(until, RunPhase | str):
        return frozenset({RunPhase(until)})
    return frozenset(RunPhase(p) for p in until)


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _retry_after(headers: Any) -> float:
    try:
        return max(float(headers.get("Retry-After", "1")), 0.0)
    except ValueError:
        return 1.0


def _answer(status: int, headers: Any, raw: bytes, inv: str) -> InvokeResult:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    inv = str(body.get("invocationId") or headers.get(INVOCATION_HEADER) or inv)
    if status == 200:
        try:
            result = InvokeResult.model_validate(body)
        except ValueError as e:
            raise InvokeError(
                200, "MalformedAnswer", "the gateway's answer did not parse", invocation_id=inv
            ) from e
        if not result.ok:
            raise InvocationFailed(result)
        return result
    reason = str(body.get("reason") or f"HTTP{status}")
    message = str(body.get("message") or "")
    if status == 429:
        raise Busy(status, reason, message, invocation_id=inv, retry_after=_retry_after(headers))
    if status == 503:
        raise NotReady(status, reason, message, invocation_id=inv, retry_after=_retry_after(headers))
    kind: type[InvokeError] = {
        400: PayloadRejected,
        401: Unauthorized,
        403: Unauthorized,
        404: FunctionNotFound,
        413: PayloadRejected,
        502: OutcomeUnknown,
        504: OutcomeUnknown,
    }.get(status, InvokeError)
    raise kind(status, reason, message, invocation_id=inv)
