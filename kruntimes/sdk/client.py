"""The kruntimes Python SDK: create, watch, invoke and remove Runs.

    async with Client.from_config() as krt:          # client.json from `krt up`, or KRT_* variables
        run = await krt.create(Run.from_yaml(text))   # metadata.uid set when missing
        run = await krt.wait(run.metadata.name)       # Ready (function) or Succeeded (task)
        answer = await krt.invoke(run, {"name": "x"}) # over HTTPS through the gateway
        await krt.delete(run.metadata.name)

        fn = await krt.functions.apply(Function.from_yaml(text))  # replicas behind one URL
        await krt.functions.wait_ready(fn.function.name)
        answer = await krt.functions.invoke(fn.function.name, {"name": "x"})

        accepted = await krt.invoke_async(run, {"name": "x"}, invocation_id="order-42")  # 202: recorded
        done = await krt.invocations.wait(accepted, timeout=120)  # Succeeded | Failed | Unknown

The control plane is Temporal (a Run is the RunWorkflow `run/{namespace}/{name}`), so an app may
equally start RunWorkflow with the plain Temporal SDK; this client adds the conventions (uids,
absolute source paths, the Run's creator from the config's `identity`, typed errors) and the
invoke path, which never touches Temporal. A Run started without a creator gets no secret.

`Client` is the SDK's one facade; this module also exports the SDK's errors (their tree is drawn
in kruntimes.sdk.errors) and results (kruntimes.sdk.results). The Run operations live in
kruntimes.sdk.runs, the Function operations (`Client.functions`) in kruntimes.sdk.functions, the
invoke client in kruntimes.sdk.invoke, async invocations (`Client.invocations`) in
kruntimes.sdk.invocations.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.spec import CreatorKind
from kruntimes.api.status import RunStatus
from kruntimes.contracts.host import HostActionResult
from kruntimes.contracts.pool import QueueActionResult
from kruntimes.contracts.reconcile import ReconcileReport
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import (
    AsyncBacklogFull,
    AsyncUnavailable,
    Busy,
    ConfigError,
    FunctionConflict,
    FunctionNotFound,
    HostNotFound,
    InvocationConflict,
    InvocationFailed,
    InvocationNotFound,
    InvokeError,
    KruntimesError,
    NotReady,
    OutcomeUnknown,
    PayloadRejected,
    RunAlreadyExists,
    RunFailed,
    RunNotFound,
    RuntimeNotFound,
    SpecConflict,
    Unauthorized,
    WaitTimeout,
)
from kruntimes.sdk.events import RunEvent
from kruntimes.sdk.functions import Functions
from kruntimes.sdk.hosts import Hosts
from kruntimes.sdk.invocations import Invocations, InvocationTarget
from kruntimes.sdk.invoke import Invoker, InvokeTarget, endpoint_of
from kruntimes.sdk.queues import ACTIONS, Queues, QueueView
from kruntimes.sdk.results import (
    Applied,
    AsyncInvocation,
    FunctionApplied,
    FunctionObject,
    HostView,
    Invocation,
    InvokeResult,
    RunObject,
)
from kruntimes.sdk.runs import Runs, StatusCallback
from kruntimes.sdk.schedules import Schedules
from kruntimes.sdk.watch import POLL_INTERVAL_S

if TYPE_CHECKING:
    import temporalio.client

# The one list of the SDK's names: kruntimes exports them (and Run) from it, on first use.
__all__ = [
    "Applied",
    "AsyncBacklogFull",
    "AsyncInvocation",
    "AsyncUnavailable",
    "Busy",
    "Client",
    "ConfigError",
    "FunctionApplied",
    "FunctionConflict",
    "FunctionNotFound",
    "FunctionObject",
    "HostNotFound",
    "HostView",
    "Invocation",
    "InvocationConflict",
    "InvocationFailed",
    "InvocationNotFound",
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
    "RuntimeNotFound",
    "SpecConflict",
    "Unauthorized",
    "WaitTimeout",
]


class Client:
    """An async client of one kruntimes platform. One Temporal connection (made on first use)
    and one HTTPS session (keep-alive) per Client; close it, or use it as a context manager."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        temporal: temporalio.client.Client | None = None,
        creator_kind: CreatorKind = "sdk",
    ) -> None:
        """`creator_kind`: what the Runs this client starts record as their creator's kind, with
        the config's identity (the CLI says `cli`, an MCP server `mcp`; schedules `schedule`)."""
        self.config = config if config is not None else ClientConfig()
        self._runs = Runs(self.config, temporal=temporal, creator_kind=creator_kind)
        self._hosts = Hosts(self._runs)
        self._queues = Queues(self._runs)
        self.schedules = Schedules(self._runs)  # create, list, get, pause, unpause, trigger, delete
        self._invoker = Invoker(self.config)
        # Functions: apply, get, list, describe, delete, rollback, scale, wait_ready, rollout_status, invoke
        self.functions = Functions(self._runs, self._invoker)
        # Async invocations: get, wait, list, resubmit (invoke_async submits)
        self.invocations = Invocations(self._runs, self.functions, self._invoker)

    @classmethod
    def from_config(cls, config: ClientConfig | None = None, *, creator_kind: CreatorKind = "sdk") -> Client:
        """A client of the platform `krt up` describes (client.json, then KRT_* variables)."""
        return cls(config if config is not None else clientconfig.load(), creator_kind=creator_kind)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._invoker.close()

    async def temporal(self) -> temporalio.client.Client:
        """The Temporal client (pydantic data converter), connected on first use."""
        return await self._runs.temporal()

    # -- Runs ----------------------------------------------------------------------------------------

    async def create(self, run: Run) -> RunObject:
        """Start a Run; raises RunAlreadyExists while a Run of that name is running."""
        return await self._runs.create(run)

    async def apply(self, run: Run) -> Applied:
        """Create the Run unless a running one of that name has the same spec (then: a no-op).

        A different spec (or labels, or uid) raises SpecConflict: the spec is immutable.
        """
        return await self._runs.apply(run)

    async def get(self, name: str, namespace: str = "default") -> RunObject:
        """The Run's manifest and status (the `status` query; a closed Run's final result).
        RunNotFound once a finished Run's ttlSecondsAfterFinished ran out, or it was deleted."""
        return await self._runs.get(name, namespace)

    async def status(self, name: str, namespace: str = "default") -> RunStatus:
        """The Run's status only (one query; a closed Run's final result)."""
        return await self._runs.status(name, namespace)

    async def list(
        self, namespace: str | None = None, phase: RunPhase | str | None = None
    ) -> builtins.list[RunObject]:
        """The existing Runs, of one namespace or all, by name: running ones, and finished ones
        (with their final phase) until their ttlSecondsAfterFinished runs out, as `kubectl get
        jobs` shows completed Jobs. A deleted Run is never listed."""
        return await self._runs.list(namespace, phase)

    def pages(
        self,
        namespace: str | None = None,
        phase: RunPhase | str | None = None,
        *,
        page_size: int = 100,
        first_page_size: int | None = None,
    ) -> AsyncIterator[builtins.list[RunObject]]:
        """The existing Runs a page at a time, newest first (each page sorted by name): the
        first page (`first_page_size` Runs, if smaller) comes as fast with 10,000 Runs as with
        ten."""
        return self._runs.pages(namespace, phase, page_size=page_size, first_page_size=first_page_size)

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
        Run's workflow tasks completes: the Run's history is read and long-polled, and the status
        is taken from it when the Run indexes a phase waited for or a terminal one (the status the
        Run wrote with that phase; a Run started otherwise than by the SDK is queried). With
        ``on_status`` the status is queried after each completed task, and ``on_status`` sees
        each of those statuses; ``interval``
        is the pause before polling again should the long poll fail.
        """
        return await self._runs.wait(
            name, namespace, until=until, timeout=timeout, interval=interval, on_status=on_status
        )

    async def events(self, name: str, namespace: str = "default") -> builtins.list[RunEvent]:
        """The Run's recent events, oldest first, from its history: the phases it entered (each
        with the reason, message, host and attempt it wrote then), its host calls and their
        failures (by type), signals and Updates. No secret: what `get` shows, and plain names."""
        return await self._runs.events(name, namespace)

    async def cancel(self, name: str, namespace: str = "default") -> None:
        """Ask the Run to stop (idempotent; a finished Run is left as it is)."""
        await self._runs.cancel(name, namespace)

    async def delete(
        self, name: str, namespace: str = "default", *, timeout: float | None = 120.0, wait: bool = True
    ) -> RunStatus:
        """Cancel the Run if needed, run its cleanup, end it and remove it from Temporal; returns
        its final status. A finished Run (kept for its ttlSecondsAfterFinished) is removed at once.

        With ``wait`` (the default, like kubectl's ``--wait``) it returns once ``list`` no longer
        shows the Run; ``timeout`` bounds the whole delete (WaitTimeout). RunNotFound if there is
        no such Run (never created, deleted, or past its ttlSecondsAfterFinished).
        """
        return await self._runs.delete(name, namespace, timeout=timeout, wait=wait)

    async def hosts(self) -> builtins.list[HostView]:
        """Every runtime host the pools hold, with the run slots used on each."""
        return await self._runs.hosts()

    async def drain_host(
        self, name: str, *, runtime: str | None = None, message: str = "", requested_by: str = ""
    ) -> HostActionResult:
        """Take no new Run on the host and move its Runs off it (each Ready elsewhere at the same
        URL); it is deleted once it holds none. Acknowledged once its pool was told (state
        Draining); recorded in the host's HostWorkflow history. HostNotFound if no pool holds it."""
        return await self._hosts.drain(name, runtime=runtime, message=message, requested_by=requested_by)

    async def queue(self, runtime: str) -> QueueView:
        """The runtime's admission: paused or not (by whom, why) and its queued Runs, FIFO."""
        return await self._queues.view(runtime)

    async def pause_queue(
        self, runtime: str, *, message: str = "", requested_by: str = ""
    ) -> QueueActionResult:
        """New Runs of the runtime queue and none is placed until resumed (queued Runs keep their
        place; Ready Runs are untouched). Recorded in the pool's history with who asked and why."""
        return await self._queues.act(ACTIONS["pause"], runtime, message=message, requested_by=requested_by)

    async def resume_queue(
        self, runtime: str, *, message: str = "", requested_by: str = ""
    ) -> QueueActionResult:
        """Admit again: the queued Runs are decided again (placed, scaled out for, or rejected)."""
        return await self._queues.act(ACTIONS["resume"], runtime, message=message, requested_by=requested_by)

    async def drain_queue(
        self, runtime: str, *, message: str = "", requested_by: str = ""
    ) -> QueueActionResult:
        """End the Runs queued for the runtime, rejected with the reason QueueDrained and the message."""
        return await self._queues.act(ACTIONS["drain"], runtime, message=message, requested_by=requested_by)

    async def delete_host(
        self, name: str, *, runtime: str | None = None, message: str = "", requested_by: str = ""
    ) -> HostActionResult:
        """Stop the host now; its Runs register elsewhere once it is proven gone. Acknowledged
        once it is (state Terminating); recorded in the host's HostWorkflow history."""
        return await self._hosts.delete(name, runtime=runtime, message=message, requested_by=requested_by)

    async def reconcile(self, runtime: str | None = None) -> builtins.list[ReconcileReport]:
        """Run an orphan collection now, for every runtime (or one); each runtime's report."""
        return await self._hosts.reconcile(runtime)

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
        endpoint = await endpoint_of(target, namespace=namespace, runs=self._runs)
        return await self._invoker.send(endpoint, data, invocation_id=invocation_id, timeout=timeout)

    async def invoke_async(
        self,
        target: InvocationTarget,
        data: Any = None,
        *,
        namespace: str = "default",
        function: bool = False,
        invocation_id: str | None = None,
        timeout: float | None = None,
        callback_url: str | None = None,
    ) -> AsyncInvocation:
        """Submit an async invocation of a function Run or a Function; answered once the platform
        recorded it (202), before it runs (docs/async-invocations.md).

        ``target`` is what ``invoke`` takes, or a Function (a Function's name with
        ``function=True``). The invocation id (a uuid4 when None) names it within its target: the
        same id with the same body again answers the same invocation and never runs it again;
        with another body InvocationConflict. AsyncBacklogFull and AsyncUnavailable recorded
        nothing: submit again with the same id. ``timeout`` bounds each attempt, as a sync
        invoke's. ``callback_url``: where its status is POSTed once it ends, in place of the
        target's callback (https, an origin the gateway allows the namespace, else Unauthorized
        with the reason CallbackNotAllowed; part of the id's identity, as the body is). Then
        ``invocations.get`` or ``invocations.wait`` the answer's location.
        """
        return await self.invocations.submit(
            target,
            data,
            namespace=namespace,
            function=function,
            invocation_id=invocation_id,
            timeout=timeout,
            callback_url=callback_url,
        )
