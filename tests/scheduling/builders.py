"""Hosts, tenants and requests to start each test from; tests change one thing and expect one result."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from kruntimes.decisions.scheduling.admission import admit
from kruntimes.decisions.scheduling.model import (
    SHARED_POLICY,
    AdmissionRequest,
    Decision,
    Host,
    HostState,
    Reservation,
    ScaleOutReason,
    ScaleOutRequest,
    ScaleOutStatus,
    TenancyMode,
    TenantPolicy,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
RUNTIME = "python"

# One tenant of each mode (Dedicated, Hybrid with fallback, Shared), plus a Hybrid tenant without
# fallback.
DEDICATED_A = TenantPolicy(mode=TenancyMode.Dedicated)
HYBRID_B = TenantPolicy(mode=TenancyMode.Hybrid, allowSharedFallback=True)
HYBRID_C_NO_FALLBACK = TenantPolicy(mode=TenancyMode.Hybrid)
SHARED_S = TenantPolicy(mode=TenancyMode.Shared, allowSharedFallback=True, preferDedicatedCapacity=False)

TENANTS: dict[str, TenantPolicy] = {
    "tenant-a": DEDICATED_A,
    "tenant-b": HYBRID_B,
    "tenant-c": HYBRID_C_NO_FALLBACK,
    "tenant-s": SHARED_S,
}


def host(
    host_id: str = "h1",
    *,
    capacity: int = 2,
    state: HostState = HostState.Ready,
    tenant: str | None = None,
    group: str | None = None,
    tenancy: TenancyMode | None = None,
    runtime: str = RUNTIME,
    uid: str | None = None,
    **changes: Any,
) -> Host:
    if tenancy is None:
        tenancy = TenancyMode.Shared if tenant is None and group is None else TenancyMode.Dedicated
    started = state not in (HostState.Unassigned,)
    ready = state in (HostState.Ready, HostState.Draining, HostState.Terminating)
    data: dict[str, Any] = {
        "hostId": host_id,
        "hostUid": uid or f"{host_id}-uid",
        "runtime": runtime,
        "address": f"{host_id}.local:7070" if ready else None,
        "state": state,
        "capacity": capacity,
        "tenant": tenant,
        "tenantGroup": group,
        "tenancy": tenancy,
        "createdAt": T0,
        "assignedAt": T0 + timedelta(seconds=1) if started else None,
        "readyAt": T0 + timedelta(seconds=2) if ready else None,
    }
    return Host.model_validate({**data, **changes})


def dedicated(host_id: str, owner: str | None, **kw: Any) -> Host:
    return host(host_id, tenant=owner, tenancy=TenancyMode.Dedicated, **kw)


def hybrid(host_id: str, owner: str | None, **kw: Any) -> Host:
    return host(host_id, tenant=owner, tenancy=TenancyMode.Hybrid, **kw)


def request(
    run: str = "r1",
    *,
    tenant: str | None = None,
    tenancy: TenantPolicy | None = None,
    runtime: str = RUNTIME,
    hint: str | None = None,
) -> AdmissionRequest:
    if tenancy is None and tenant is not None:
        tenancy = TENANTS.get(tenant)
    return AdmissionRequest(
        runUid=run,
        namespace="demo",
        name=f"fn-{run}",
        runtime=runtime,
        tenant=tenant,
        tenancy=tenancy,
        requestedAt=T0,
        providerHint=hint,
    )


def reservation(run: str, on: Host, *, tenant: str | None = None) -> Reservation:
    return Reservation(runUid=run, hostId=on.hostId, hostUid=on.hostUid, tenant=tenant, reservedAt=T0)


def fill(on: Host, count: int | None = None, *, prefix: str = "busy") -> list[Reservation]:
    """``count`` reservations on ``on`` (all of its slots by default), by runs nobody else uses."""
    n = on.capacity if count is None else count
    return [reservation(f"{prefix}-{on.hostId}-{i}", on) for i in range(n)]


def scale_out(
    request_id: str = "so-1",
    *,
    tenant: str | None = None,
    policy: TenantPolicy = SHARED_POLICY,
    slots: int = 2,
    status: ScaleOutStatus = ScaleOutStatus.Requested,
    host_id: str | None = None,
    runtime: str = RUNTIME,
    **changes: Any,
) -> ScaleOutRequest:
    data: dict[str, Any] = {
        "requestId": request_id,
        "runtime": runtime,
        "provider": "process",
        "reason": ScaleOutReason.NoVisibleCapacity,
        "slots": slots,
        "tenant": tenant,
        "policy": policy,
        "requestedAt": T0,
        "status": status,
        "hostId": host_id,
        "hostUid": f"{host_id}-uid" if host_id else None,
    }
    return ScaleOutRequest.model_validate({**data, **changes})


def decide(
    req: AdmissionRequest,
    *,
    hosts: Sequence[Host] = (),
    reservations: Sequence[Reservation] = (),
    queue: Sequence[AdmissionRequest] = (),
    pending: Sequence[ScaleOutRequest] = (),
    max_queue: int = 10,
    max_hosts: int = 4,
    default_provider: str | None = None,
    providers: Collection[str] | None = None,
) -> Decision:
    return admit(
        request=req,
        hosts=hosts,
        reservations=reservations,
        queue=queue,
        pending_scale_outs=pending,
        runtime=RUNTIME,
        max_queue=max_queue,
        max_hosts=max_hosts,
        default_provider=default_provider,
        providers=providers,
    )
