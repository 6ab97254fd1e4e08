"""Model validation, and every model round-tripping through the pydantic data converter."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import BaseModel, ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from kruntimes.api.limits import MAX_STATUS_MESSAGE_BYTES
from kruntimes.decisions.scheduling import model
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderFailure, ProviderOperation

from .builders import DEDICATED_A, HYBRID_B, T0, host, request, reservation, scale_out

converter = pydantic_data_converter.payload_converter

FAILURE = ProviderFailure.of(
    FailureReason.ReadinessTimeout,
    provider="process",
    operation=ProviderOperation.AwaitReady,
    host="h9",
    tenant="tenant-a",
    requestId="so-1",
    message="never served",
)
SCALE_OUT = model.RequestScaleOut(
    reason=model.ScaleOutReason.NoVisibleCapacity,
    provider="kubernetes",
    tenant="tenant-b",
    policy=HYBRID_B,
    position=3,
)

EXAMPLES: list[BaseModel] = [
    host("h1", labels={"zone": "a"}),
    host("h2", state=model.HostState.Unassigned),
    host("h3", tenant="tenant-b", tenancy=model.TenancyMode.Hybrid, group="enterprise"),
    reservation("r1", host("h1"), tenant="tenant-a"),
    model.TenantPolicy(
        mode=model.TenancyMode.Hybrid, allowSharedFallback=True, group="enterprise", maxHosts=2
    ),
    request("r1", tenant="tenant-a", hint="attach"),
    request("r2"),
    model.AssignToInstance(hostId="h1", hostUid="u1"),
    model.QueueGlobally(position=4),
    SCALE_OUT,
    model.Reject(reason=model.RejectReason.QueueFull, message="full"),
    scale_out("so-1"),
    scale_out(
        "so-2", tenant="tenant-a", policy=DEDICATED_A, status=model.ScaleOutStatus.Provisioning, host_id="a-1"
    ),
    scale_out("so-3", status=model.ScaleOutStatus.Failed, failure=FAILURE),
    FAILURE,
]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_model_round_trips_through_the_pydantic_data_converter(example):
    payloads = converter.to_payloads([example])
    (back,) = converter.from_payloads(payloads, [type(example)])
    assert back == example
    assert type(back) is type(example)


@pytest.mark.parametrize(
    "decision",
    [
        model.AssignToInstance(hostId="h1", hostUid="u1"),
        model.QueueGlobally(position=0),
        SCALE_OUT,
        model.Reject(reason="NoProvider"),
    ],
    ids=lambda d: d.kind,
)
def test_a_decision_round_trips_as_the_decision_union(decision):
    payloads = converter.to_payloads([decision])
    (back,) = converter.from_payloads(payloads, [model.Decision])  # type: ignore[list-item]
    assert back == decision
    assert type(back) is type(decision)


def test_models_use_camel_case_field_names_on_the_wire():
    data = host("h1").model_dump(mode="json")
    assert {"hostId", "hostUid", "tenantGroup", "createdAt", "assignedAt", "readyAt"} <= set(data)


def test_models_are_frozen():
    h = host("h1")
    with pytest.raises(ValidationError):
        setattr(h, "capacity", 5)  # noqa: B010 - the assignment itself is under test


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="extra"):
        model.AssignToInstance.model_validate({"hostId": "h", "hostUid": "u", "slot": 1})


# --- Host ----------------------------------------------------------------------------------------


def test_a_shared_host_cannot_have_a_tenant_owner():
    with pytest.raises(ValidationError, match="Shared host .* no tenant owner"):
        host("h1", tenant="tenant-a", tenancy=model.TenancyMode.Shared)
    with pytest.raises(ValidationError, match="Shared host"):
        host("h1", group="enterprise", tenancy=model.TenancyMode.Shared)


def test_a_ready_host_needs_an_address_and_its_timestamps():
    for missing in ("address", "assignedAt", "readyAt"):
        with pytest.raises(ValidationError, match=f"Ready host needs {missing}"):
            host("h1", **{missing: None})  # type: ignore[arg-type]


def test_an_assigned_host_needs_its_assignment_time():
    with pytest.raises(ValidationError, match="assignedAt"):
        host("h1", state=model.HostState.Assigned, assignedAt=None)


@pytest.mark.parametrize("capacity", [0, -1, True, "2", 1.5])
def test_host_capacity_is_a_strict_positive_integer(capacity):
    with pytest.raises(ValidationError, match="capacity"):
        host("h1", capacity=capacity)


def test_host_times_must_carry_a_time_zone():
    with pytest.raises(ValidationError, match="createdAt"):
        host("h1", createdAt=datetime(2025, 1, 1))


def test_host_ids_and_uids_must_not_be_empty():
    with pytest.raises(ValidationError, match="hostId"):
        host("")
    with pytest.raises(ValidationError, match="hostUid"):
        host("h1", hostUid="")


def test_tenant_names_are_dns_labels():
    with pytest.raises(ValidationError, match="DNS-1123"):
        host("h1", tenant="Tenant_A", tenancy=model.TenancyMode.Dedicated)
    with pytest.raises(ValidationError, match="DNS-1123"):
        request("r1", tenant="Tenant A", tenancy=DEDICATED_A)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: host("h1", tenant="Tenant_A", tenancy=model.TenancyMode.Dedicated), "tenant"),
        (lambda: host("h1", group="Group_A"), "tenantGroup"),
        (lambda: host("h1", runtime="Py"), "runtime"),
        (lambda: model.TenantPolicy(mode=model.TenancyMode.Dedicated, group="G"), "group"),
        (lambda: model.AdmissionRequest.model_validate({**request("r1").model_dump(), "name": "Fn"}), "name"),
    ],
    ids=["tenant", "tenantGroup", "runtime", "group", "name"],
)
def test_a_name_that_is_no_dns_label_is_refused_naming_its_field(build, field):
    with pytest.raises(ValidationError, match=f"Value error, {field}: a DNS-1123 label"):
        build()


def test_an_unowned_hybrid_host_is_a_valid_host():
    # Representable on purpose: an unowned Hybrid host is never visible to anyone, so it may exist.
    assert host("h1", tenancy=model.TenancyMode.Hybrid).tenant is None


# --- tenancy -------------------------------------------------------------------------------------


def test_a_dedicated_tenant_cannot_allow_shared_fallback():
    with pytest.raises(ValidationError, match="Dedicated tenant never falls back"):
        model.TenantPolicy(mode=model.TenancyMode.Dedicated, allowSharedFallback=True)


def test_the_default_policy_is_the_shared_pool():
    assert model.TenantPolicy() == model.SHARED_POLICY
    assert model.SHARED_POLICY.mode is model.TenancyMode.Shared


def test_a_run_without_a_tenant_cannot_ask_for_dedicated_or_hybrid_capacity():
    for policy in (DEDICATED_A, HYBRID_B):
        with pytest.raises(ValidationError, match="without a tenant"):
            request("r1", tenancy=policy)


def test_a_requests_policy_is_its_tenancy_or_the_shared_pool_for_anonymous_runs():
    assert request("r1", tenant="tenant-a").policy == DEDICATED_A
    assert request("r1").policy is model.SHARED_POLICY
    assert request("r1", tenant="tenant-unknown").policy is None


def test_a_provider_hint_is_a_lowercase_name():
    with pytest.raises(ValidationError, match="providerHint"):
        request("r1", hint="Kubernetes")


# --- decisions and scale-outs --------------------------------------------------------------------


def test_a_shared_scale_out_has_no_owner_and_an_owned_one_needs_one():
    with pytest.raises(ValidationError, match="unowned host"):
        model.RequestScaleOut(reason="NoVisibleCapacity", provider="process", tenant="tenant-a", position=0)
    with pytest.raises(ValidationError, match="needs the owning tenant"):
        model.RequestScaleOut(reason="NoVisibleCapacity", provider="process", policy=DEDICATED_A, position=0)


def test_a_shared_scale_out_has_no_tenant_group_even_if_the_tenant_has_one():
    shared_in_group = model.TenantPolicy(group="enterprise")
    so = model.RequestScaleOut(
        reason="NoVisibleCapacity", provider="process", policy=shared_in_group, position=0
    )
    assert (so.tenancy, so.tenantGroup) == (model.TenancyMode.Shared, None)


def test_queue_positions_are_never_negative():
    with pytest.raises(ValidationError, match="position"):
        model.QueueGlobally(position=-1)


def test_reject_messages_are_truncated_not_refused():
    long = model.Reject(reason=model.RejectReason.QueueFull, message="x" * (MAX_STATUS_MESSAGE_BYTES * 2))
    assert len(long.message.encode()) <= MAX_STATUS_MESSAGE_BYTES


def test_reject_reasons_are_the_stable_strings():
    assert [r.value for r in model.RejectReason] == [
        "QueueFull",
        "NoProvider",
        "TenantNotAllowed",
        "RuntimeUnknown",
        "MaxHostsReached",
    ]


def test_a_provisioning_or_fulfilled_scale_out_names_its_host():
    for status in (model.ScaleOutStatus.Provisioning, model.ScaleOutStatus.Fulfilled):
        with pytest.raises(ValidationError, match="hostId and hostUid"):
            scale_out(status=status)


def test_a_failed_scale_out_carries_exactly_its_failure():
    with pytest.raises(ValidationError, match="failure"):
        scale_out(status=model.ScaleOutStatus.Failed)
    with pytest.raises(ValidationError, match="failure"):
        scale_out(failure=FAILURE)


def test_a_scale_out_is_pending_until_it_is_fulfilled_or_failed():
    assert scale_out(status=model.ScaleOutStatus.Requested).pending
    assert scale_out(status=model.ScaleOutStatus.Provisioning, host_id="h").pending
    assert not scale_out(status=model.ScaleOutStatus.Fulfilled, host_id="h").pending
    assert not scale_out(status=model.ScaleOutStatus.Failed, failure=FAILURE).pending


@pytest.mark.parametrize(
    ("src", "dst", "allowed"),
    [
        ("Requested", "Provisioning", True),
        ("Requested", "Failed", True),
        ("Requested", "Fulfilled", False),
        ("Provisioning", "Fulfilled", True),
        ("Provisioning", "Failed", True),
        ("Provisioning", "Requested", False),
        ("Fulfilled", "Failed", False),
        ("Failed", "Requested", False),
        ("Fulfilled", "Fulfilled", False),
    ],
)
def test_the_scale_out_lifecycle_only_moves_forward(src, dst, allowed):
    assert model.can_transition_scale_out(model.ScaleOutStatus(src), model.ScaleOutStatus(dst)) is allowed


def test_admission_requests_need_an_aware_request_time():
    with pytest.raises(ValidationError, match="requestedAt"):
        model.AdmissionRequest(
            runUid="r", namespace="d", name="n", runtime="python", requestedAt=datetime(2025, 1, 1)
        )
    assert request("r1").requestedAt == T0
