"""One round of orphan collection for one runtime: read the snapshot kruntimes.decisions.reconciling needs,
in its order (the known-Runs view refreshed, the hosts' registrations, the pool, the Runs they
mention that the view does not show running), decide with
`kruntimes.decisions.reconciling.plan`, and carry the plan out: unregister, release, tell, delete, remove,
supervise. Each action is idempotent and its failure is reported, never raised: the next round
tries again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import WorkflowExecutionStatus as ExecutionStatus
from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.activities.hosts._rpc import host_channel
from kruntimes.activities.hosts.base import HostManager
from kruntimes.activities.hosts.registry import provider_of
from kruntimes.api.ids import HostId, HostUid, Namespace, RuntimeName, RunUid
from kruntimes.contracts.host import host_input
from kruntimes.contracts.names import SIGNAL_REGISTRATION_LOST, SIGNAL_RELEASE, host_workflow_id
from kruntimes.contracts.pool import PoolState, ReleaseSignal
from kruntimes.contracts.providers import CreatedHost
from kruntimes.contracts.reconcile import MAX_REPORTED, ReconcileInput, ReconcileReport
from kruntimes.contracts.run import RegistrationLostSignal
from kruntimes.decisions.reconciling import (
    HeldEntries,
    HostSeen,
    Plan,
    Queued,
    Registration,
    Snapshot,
    Workspace,
    plan,
)
from kruntimes.decisions.scheduling.model import Host
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.temporal.connect import query_pool
from kruntimes.temporal.known_runs import Execution, KnownRuns, keyword
from kruntimes.wire import search, summaries

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 5.0
UNREGISTER_GRACE_MS = 5000
CONCURRENCY = 16
PAGE_SIZE = 1000
LIST_TIMEOUT = timedelta(seconds=30)  # one page
T = TypeVar("T")


async def _bounded(calls: Iterable[Awaitable[T]]) -> list[T]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


def _first(attrs: Any, key: str) -> str:
    values = (attrs or {}).get(key) or [""]
    return str(values[0])


def _keyword(payload: Payload | None) -> str:
    """A keyword search attribute's value as visibility sends it; "" when absent or not one."""
    if payload is None:
        return ""
    return keyword(payload.metadata.get("encoding"), payload.data) or ""


_VIEWED = (search.RUN_UID, search.NAMESPACE, search.RUNTIME, search.PHASE)


class _Listing:
    """The known-Runs view's listings, through the worker's Temporal client: the service's pages
    as they come (the SDK's list turns every execution into its typed description, memo and
    every search attribute, which for 10,000 Runs took seconds of this process's event loop)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def list(self, query: str, *, limit: int) -> AsyncIterator[Execution]:
        token = b""
        seen = 0
        while seen < limit:
            page = await self.client.workflow_service.list_workflow_executions(
                ListWorkflowExecutionsRequest(
                    namespace=self.client.namespace,
                    query=query,
                    page_size=min(PAGE_SIZE, limit - seen),
                    next_page_token=token,
                ),
                retry=True,
                timeout=LIST_TIMEOUT,
            )
            for info in page.executions[: limit - seen]:
                seen += 1
                fields = info.search_attributes.indexed_fields
                yield Execution(
                    workflow_id=info.execution.workflow_id,
                    search_attributes={k: _keyword(fields.get(k)) for k in _VIEWED},
                    running=info.status == ExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING,
                )
            token = page.next_page_token
            if not token:
                return


class ReconcileActivities:
    def __init__(self, client: Client, manager: HostManager, *, known: KnownRuns | None = None) -> None:
        self.client = client
        self.manager = manager
        # Which Runs run, kept across rounds (every runtime's) and refreshed by what changed; the
        # rounds are a minute or more apart, so each looks back the whole margin.
        self.known = known if known is not None else KnownRuns(_Listing(client), lookback_every=1)
        self._refreshing = asyncio.Lock()

    @activity.defn(name="reconcile")
    async def reconcile(self, input: ReconcileInput) -> ReconcileReport:
        snapshot = await self._snapshot(input)
        decided = plan(snapshot)
        errors: list[str] = []
        await self._act(input, decided, snapshot, errors)
        report = _report(input, decided, snapshot.now, errors)
        pods = await self._collect_orphans(input, errors)
        if pods:
            deleted = (report.deletedHosts + pods)[:MAX_REPORTED]
            report = report.model_copy(
                update={"deletedHosts": deleted, "actions": report.actions + len(pods)}
            )
        return report.model_copy(update={"errors": errors[:MAX_REPORTED]})

    async def _collect_orphans(self, input: ReconcileInput, errors: list[str]) -> list[str]:
        """Hosts of providers that list their own (pods) which no pool knows, deleted after the grace."""
        try:
            pool = await self._pool(input, reservations=False)
            return await self.manager.collect_orphans(
                runtime=input.runtime,
                known={h.hostUid for h in pool.hosts},
                creating={s.hostId for s in pool.scaleOuts if s.pending and s.hostId},
                grace_s=input.graceSeconds,
            )
        except Exception as err:  # reported; the next round tries again
            errors.append(f"collect orphans: {type(err).__name__}: {err}"[:500])
            return []

    # -- the snapshot, in its order ------------------------------------------------------------

    async def _snapshot(self, input: ReconcileInput) -> Snapshot:
        now = datetime.now(UTC)
        rt = input.runtime
        async with self._refreshing:  # rounds of several runtimes share the view
            await self.known.refresh()
        ready: dict[RunUid, str] = {}  # run uid → workflow id
        running: dict[str, str] = {}  # workflow id → run uid
        for uid, run in self.known.runs.items():
            if run.runtime == rt:
                workflow_id = run.workflow_id
                running[workflow_id] = uid
                if run.phase == "Ready":
                    ready[RunUid(uid)] = workflow_id
        activity.heartbeat()
        first = await self._pool(input, reservations=False)
        hosts = await _bounded(self._seen(h) for h in first.hosts)
        activity.heartbeat()
        pool = await self._pool(input)
        # Every Run the hosts and the pool mention that the view does not show running under
        # that very run uid is asked for itself: started or replaced since the view was read, or
        # a change visibility has not shown yet. What the view shows running is taken as
        # running: a Run that ended since is collected by a later round.
        mentioned: dict[str, set[str]] = {}
        for seen in hosts:
            for r in seen.registrations or ():
                mentioned.setdefault(_run_id(r), set()).add(r.run_uid)
        for uid, workflow_id in pool.owners.items():
            mentioned.setdefault(workflow_id, set()).add(uid)
        for q in pool.queue:
            mentioned.setdefault(q.workflowId, set()).add(q.runUid)
        unsure = sorted(
            w for w, uids in mentioned.items() if w not in running or any(running[w] != u for u in uids)
        )
        for workflow_id, described in await _bounded(self._described(w) for w in unsure):
            if described is None:
                running.pop(workflow_id, None)
            else:
                running[workflow_id] = described
        activity.heartbeat()
        local = self.manager.local_providers if input.stateDir else []
        records = [(p, r) for p in local for r in p.records(input.stateDir)]
        return Snapshot(
            now=now,
            grace_s=input.graceSeconds,
            ready=ready,
            hosts=hosts,
            reservations=pool.reservations,
            owners=pool.owners,
            queued=[Queued(q.runUid, q.workflowId, q.requestedAt) for q in pool.queue],
            provisioning=frozenset(s.hostId for s in pool.scaleOuts if s.pending and s.hostId),
            running=running,
            records=[r for _, r in records if r.runtime == rt],
            live_uids=frozenset(r.hostUid for p, r in records if p.running(r)),
            workspaces=_workspaces(root, HeldEntries.of(hosts)) if (root := self._work_root(input)) else [],
            supervisors=await self._supervisors(rt),
        )

    async def _described(self, workflow_id: str) -> tuple[str, str | None]:
        """Whether that Run runs, from its workflow itself (visibility may lag behind it)."""
        try:
            description = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return workflow_id, None
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            return workflow_id, None
        return workflow_id, _first(description.search_attributes, search.RUN_UID)

    async def _pool(self, input: ReconcileInput, *, reservations: bool = True) -> PoolState:
        return await query_pool(self.client, input.poolWorkflowId, reservations=reservations)

    async def _seen(self, host: Host) -> HostSeen:
        if host.address is None:
            return HostSeen(host, None)
        try:
            async with host_channel(host.address) as channel:
                info = await pb_grpc.FunctionRuntimeStub(channel).HostInfo(
                    pb.HostInfoRequest(), timeout=RPC_TIMEOUT_S
                )
        except grpc.aio.AioRpcError:
            return HostSeen(host, None)
        if info.host_uid != host.hostUid:
            return HostSeen(host, None)  # another incarnation: its own supervisor handles it
        return HostSeen(
            host,
            tuple(
                Registration(
                    registration_id=r.registration_id,
                    run_uid=RunUid(r.run_uid),
                    attempt=r.attempt,
                    namespace=Namespace(r.namespace),
                    name=r.name,
                    last_activity=r.last_activity.ToDatetime(tzinfo=UTC),
                )
                for r in info.registrations
            ),
        )

    async def _supervisors(self, runtime: RuntimeName) -> frozenset[str]:
        prefix = host_workflow_id(runtime, HostId(""))
        found = set()
        query = "WorkflowType='HostWorkflow' AND ExecutionStatus='Running'"
        async for execution in self.client.list_workflows(query):
            if execution.id.startswith(prefix):
                found.add(execution.id.removeprefix(prefix))
        return frozenset(found)

    # -- acting --------------------------------------------------------------------------------

    async def _act(self, input: ReconcileInput, decided: Plan, snapshot: Snapshot, errors: list[str]) -> None:
        async def attempt(what: str, call: Awaitable[object]) -> None:
            try:
                await call
            except Exception as err:  # reported; the next round tries again
                errors.append(f"{what}: {type(err).__name__}: {err}"[:500])

        pool = self.client.get_workflow_handle(input.poolWorkflowId)
        calls: list[Awaitable[None]] = []
        for u in decided.unregister:
            calls.append(
                attempt(f"unregister {u.registration_id}", _unregister(u.address, u.registration_id))
            )
        for run_uid in decided.release:
            calls.append(
                attempt(f"release {run_uid}", pool.signal(SIGNAL_RELEASE, ReleaseSignal(runUid=run_uid)))
            )
        for lost in decided.registration_lost:
            signal = RegistrationLostSignal(
                runUid=lost.run_uid,
                hostUid=lost.host_uid,
                message="the reconciler found no registration of this Run on its host",
            )
            run = self.client.get_workflow_handle(lost.workflow_id)
            calls.append(attempt(f"tell {lost.workflow_id}", run.signal(SIGNAL_REGISTRATION_LOST, signal)))
        for record in decided.delete:
            calls.append(attempt(f"delete host {record.hostId}", self._delete(record)))
        if (root := self._work_root(input)) is not None:
            for space in decided.remove:
                calls.append(attempt(f"remove workspace {_name(space)}", _remove(root, space)))
        records = {r.hostUid: r for r in snapshot.records}
        for host in decided.supervise:
            calls.append(
                attempt(f"supervise {host.hostId}", self._supervise(input, host, records.get(host.hostUid)))
            )
        await _bounded(calls)

    def _work_root(self, input: ReconcileInput) -> Path | None:
        """Where the hosts under the state dir keep their workspaces; None without a state dir
        or a provider of local hosts."""
        local = self.manager.local_providers
        return local[0].work_root(input.stateDir) if input.stateDir and local else None

    async def _delete(self, record: CreatedHost) -> None:
        await self.manager.delete(
            provider=record.provider, runtime=record.runtime, host_id=record.hostId, host_uid=record.hostUid
        )

    async def _supervise(self, input: ReconcileInput, host: Host, record: CreatedHost | None) -> None:
        assert host.address is not None
        created = record or CreatedHost(
            provider=provider_of(host),
            runtime=host.runtime,
            hostId=host.hostId,
            hostUid=host.hostUid,
            address=host.address,
            createdAt=host.createdAt,
        )
        await self.client.start_workflow(
            "HostWorkflow",
            host_input(input, host=host, created=created),
            id=host_workflow_id(host.runtime, host.hostId),
            static_summary=summaries.summary(
                f"host {host.runtime}/{host.hostId} (adopted by the reconciler)"
            ),
            task_queue=input.runTaskQueue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )


def _run_id(reg: Registration) -> str:
    return f"run/{reg.namespace}/{reg.name}"


async def _unregister(address: str, registration_id: str) -> None:
    async with host_channel(address) as channel:
        await pb_grpc.FunctionRuntimeStub(channel).UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=registration_id, grace_ms=UNREGISTER_GRACE_MS),
            timeout=RPC_TIMEOUT_S + UNREGISTER_GRACE_MS / 1000,
        )


def _workspaces(root: Path, held: HeldEntries) -> list[Workspace]:
    """The workspaces under `root` that `plan` could remove: every host incarnation's directory,
    and the entries `held` says are removable. The rest it never removes, so they are not read
    (each is a stat, every round)."""
    if not root.is_dir():
        return []
    found = []
    with os.scandir(root) as hosts:
        host_dirs = sorted((h for h in hosts if h.is_dir(follow_symlinks=False)), key=lambda h: h.name)
    for host_dir in host_dirs:
        path = Path(host_dir.path)
        host_uid = HostUid(host_dir.name)  # a host's workspaces are under its incarnation's uid
        found.append(Workspace(host_uid, None, _modified(path)))
        if host_dir.name not in held.answered:
            continue
        with os.scandir(path) as entries:
            names = sorted(
                e.name
                for e in entries
                if e.is_dir(follow_symlinks=False) and held.removable(host_uid, e.name)
            )
        found.extend(Workspace(host_uid, name, _modified(path / name)) for name in names)
    return found


def _modified(path: Path) -> datetime:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return datetime.now(UTC)  # vanishing: young, so left alone


def _name(space: Workspace) -> str:
    return space.host_uid if space.entry is None else f"{space.host_uid}/{space.entry}"


async def _remove(root: Path, space: Workspace) -> None:
    path = root / space.host_uid if space.entry is None else root / space.host_uid / space.entry
    if path.resolve().parent not in (root.resolve(), (root / space.host_uid).resolve()):
        raise ValueError(f"{path} is not a workspace under {root}")
    await asyncio.to_thread(shutil.rmtree, path, True)


def _report(input: ReconcileInput, decided: Plan, at: datetime, errors: list[str]) -> ReconcileReport:
    def first(items: Iterable[str]) -> list[str]:
        return list(items)[:MAX_REPORTED]

    return ReconcileReport(
        runtime=input.runtime,
        at=at,
        unregistered=first(f"{u.run_uid} ({u.why})" for u in decided.unregister),
        released=first(decided.release),
        deletedHosts=first(r.hostId for r in decided.delete),
        removedWorkspaces=first(_name(s) for s in decided.remove),
        registrationsLost=first(x.run_uid for x in decided.registration_lost),
        supervised=first(h.hostId for h in decided.supervise),
        errors=first(errors),
        actions=decided.actions(),
    )
