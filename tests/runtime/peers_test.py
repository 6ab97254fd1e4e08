"""Who may talk to a host: every port is mutual TLS with certificates of the platform CA, and each
role may call only its methods. Each test is an attack that must fail for the attacker, made with
a real client against a real Runtime Server."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.pki import Identity, PeerTLS
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.runtime.conftest import ECHO_SOURCE, Host, inline, reason, run_ref
from tests.support.invoke_port import accepted as _accepted
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI

TEST_HOST = Identity.host(runtime="python", host_id="test-0")
OTHER_HOST = Identity.host(runtime="python", host_id="test-1")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI.create(tmp_path_factory.mktemp("other-ca"))


def stub(host: Host, tls: PeerTLS) -> pb_grpc.FunctionRuntimeStub:
    channel = host.pki.channel(host.runtime.address, as_=tls)
    return pb_grpc.FunctionRuntimeStub(channel)


def config() -> pb.FunctionConfig:
    return pb.FunctionConfig(adapter="python", handler="main:handle", inline=inline({"main.py": ECHO_SOURCE}))


def every_method(host: Host, uid: str, registration_id: str) -> dict[str, object]:
    """One call of each FunctionRuntime method, as a (method, request) table."""
    run = run_ref(uid, attempt=2)
    return {
        "RegisterFunction": host.register_request(run, config()),
        "FunctionStatus": pb.FunctionStatusRequest(registration_id=registration_id),
        "UnregisterFunction": pb.UnregisterFunctionRequest(registration_id=registration_id),
        "ExecuteTask": pb.ExecuteTaskRequest(run=run_ref(), config=config(), input=b"null"),
        "CancelTask": pb.CancelTaskRequest(run_uid=uid, attempt=1),
        "HostInfo": pb.HostInfoRequest(),
        "FenceHost": pb.FenceHostRequest(host_uid=host.runtime.host_uid),
        "InvokeFunction": pb.InvokeFunctionRequest(registration_id=registration_id, payload=b"{}"),
    }


def refused(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)  # type: ignore[operator]
    return caught.value


# -- TLS: no platform certificate, no connection -------------------------------------------------


def test_a_plaintext_client_is_refused_on_the_grpc_port(host: Host) -> None:
    with grpc.insecure_channel(host.runtime.address) as channel:
        err = refused(pb_grpc.FunctionRuntimeStub(channel).HostInfo, pb.HostInfoRequest())
        assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        err = refused(health_pb2_grpc.HealthStub(channel).Check, health_pb2.HealthCheckRequest())
        assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


@pytest.mark.parametrize("identity", [CONTROL_PLANE, GATEWAY], ids=["control-plane", "gateway"])
def test_a_certificate_of_another_ca_is_refused_on_the_grpc_port(
    host: Host, other_ca: TestPKI, identity: Identity
) -> None:
    impostor = host.pki.impostor(other_ca, identity)
    err = refused(stub(host, impostor).HostInfo, pb.HostInfoRequest())
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_an_expired_certificate_is_refused_on_the_grpc_port(host: Host) -> None:
    err = refused(stub(host, host.pki.expired(CONTROL_PLANE)).HostInfo, pb.HostInfoRequest())
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_the_invoke_port_accepts_a_gateway(host: Host) -> None:
    context = host.pki.gateway.client_context()
    assert _accepted(host.runtime.invoke_address, context, server_hostname=TEST_HOST.dns_name)


def test_the_invoke_port_refuses_plaintext(host: Host) -> None:
    assert not _accepted(host.runtime.invoke_address, None)


def test_the_invoke_port_refuses_a_client_without_a_certificate(host: Host) -> None:
    context = ssl.create_default_context(cadata=host.pki.authority.cert_pem.decode())
    assert not _accepted(host.runtime.invoke_address, context, server_hostname=TEST_HOST.dns_name)


def test_the_invoke_port_refuses_a_certificate_of_another_ca(host: Host, other_ca: TestPKI) -> None:
    context = host.pki.impostor(other_ca, GATEWAY).client_context()
    assert not _accepted(host.runtime.invoke_address, context, server_hostname=TEST_HOST.dns_name)


def test_the_invoke_port_refuses_an_expired_gateway_certificate(host: Host) -> None:
    context = host.pki.expired(GATEWAY).client_context()
    assert not _accepted(host.runtime.invoke_address, context, server_hostname=TEST_HOST.dns_name)


@pytest.mark.parametrize("identity", [CONTROL_PLANE, OTHER_HOST], ids=["control-plane", "host"])
def test_the_invoke_port_refuses_every_role_but_a_gateway(host: Host, identity: Identity) -> None:
    context = host.pki.peer(identity).client_context()
    assert not _accepted(host.runtime.invoke_address, context, server_hostname=TEST_HOST.dns_name)


# -- roles: each method only for the role of its hop ---------------------------------------------


@pytest.mark.parametrize("identity", [GATEWAY, OTHER_HOST], ids=["gateway", "host"])
def test_only_the_control_plane_may_register_unregister_run_tasks_or_read_the_host(
    host: Host, identity: Identity
) -> None:
    fn = host.register(ECHO_SOURCE)
    uid = host.status(fn.registration_id).run.run_uid
    stranger = stub(host, host.pki.peer(identity))
    for method, request in every_method(host, uid, fn.registration_id).items():
        if method == "InvokeFunction":
            continue
        err = refused(getattr(stranger, method), request)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, method  # type: ignore[attr-defined]
        assert reason(err) == "PermissionDenied", method
    # nothing changed: the registration still serves at its attempt
    status = host.status(fn.registration_id)
    assert status.registered and status.ready and status.run.attempt == 1
    assert host.invoke(fn.registration_id, b'{"a": 1}').outputs_json == b'{"a":1}'


def test_a_stranger_cannot_replace_another_namespaces_function_at_the_next_attempt(host: Host) -> None:
    """The attack: RegisterFunction with a Run's uid at attempt+1 and the attacker's code."""
    fn = host.register(ECHO_SOURCE)
    victim = host.status(fn.registration_id).run
    attack = pb.RegisterFunctionRequest(
        run=pb.RunRef(
            run_uid=victim.run_uid,
            attempt=victim.attempt + 1,
            namespace="other",
            name="evil",
            runtime="python",
        ),
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=inline({"main.py": "def handle(p):\n    return {'pwned': 1}\n"}),
        ),
    )
    for identity in (GATEWAY, OTHER_HOST):
        err = refused(stub(host, host.pki.peer(identity)).RegisterFunction, attack)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    # the control plane's own certificate is not enough either without the signing key
    err = refused(host.stub.RegisterFunction, attack)
    assert reason(err) == "AssignmentInvalid"
    assert host.invoke(fn.registration_id, b'{"b": 2}').outputs_json == b'{"b":2}'


def test_only_a_gateway_may_invoke_over_grpc(host: Host) -> None:
    fn = host.register(ECHO_SOURCE)
    request = pb.InvokeFunctionRequest(registration_id=fn.registration_id, payload=b"{}")
    for identity in (CONTROL_PLANE, OTHER_HOST):
        err = refused(stub(host, host.pki.peer(identity)).InvokeFunction, request)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert host.gateway.InvokeFunction(request, timeout=10).status == pb.INVOCATION_STATUS_SUCCEEDED


def test_every_platform_role_may_ask_for_health(host: Host) -> None:
    for identity in (CONTROL_PLANE, GATEWAY, OTHER_HOST):
        channel = host.pki.channel(host.runtime.address, as_=host.pki.peer(identity))
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()


# -- signed assignments --------------------------------------------------------------------------


def _register(host: Host, run: pb.RunRef, assignment: pb.SignedAssignment | None) -> grpc.RpcError:
    request = pb.RegisterFunctionRequest(run=run, config=config())
    if assignment is not None:
        request.assignment.CopyFrom(assignment)
    return refused(host.stub.RegisterFunction, request)


def test_registering_needs_an_assignment_signed_by_the_control_plane(host: Host, other_ca: TestPKI) -> None:
    run = run_ref()
    assert reason(_register(host, run, None)) == "AssignmentInvalid"
    forged = other_ca.sign(
        run_uid=run.run_uid, attempt=1, host_id="test-0", host_uid=host.runtime.host_uid
    )  # another key
    err = _register(host, run, forged)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and reason(err) == "AssignmentInvalid"  # type: ignore[attr-defined]
    tampered = host.signed(run)
    tampered.signature = bytes(b ^ 1 for b in tampered.signature)
    assert reason(_register(host, run, tampered)) == "AssignmentInvalid"
    forged.key_id = host.signed(run).key_id  # claims the real key: the signature still fails
    assert reason(_register(host, run, forged)) == "AssignmentInvalid"


@pytest.mark.parametrize(
    "change",
    ["run_uid", "attempt", "host_id", "host_uid", "namespace", "name", "runtime"],
)
def test_an_assignment_naming_anything_else_is_refused(host: Host, change: str) -> None:
    run = run_ref()
    named = {
        "run_uid": run.run_uid,
        "attempt": 1,
        "host_id": "test-0",
        "host_uid": host.runtime.host_uid,
        "namespace": "default",
        "name": "fn",
        "runtime": "python",
    }
    named[change] = {
        "run_uid": str(uuid.uuid4()),
        "attempt": 2,
        "host_id": "test-1",
        "host_uid": str(uuid.uuid4()),
        "namespace": "other",
        "name": "other",
        "runtime": "bash",
    }[change]
    signed = host.pki.sign(**named)  # type: ignore[arg-type]
    assert reason(_register(host, run, signed)) == "AssignmentInvalid"


def test_a_replayed_lower_attempt_is_refused(host: Host) -> None:
    uid = str(uuid.uuid4())
    first = host.register(ECHO_SOURCE, uid=uid, attempt=1)
    second = host.register(ECHO_SOURCE, uid=uid, attempt=2)
    err = refused(host.stub.RegisterFunction, host.register_request(run_ref(uid, attempt=1), config()))
    assert reason(err) == "StaleAttempt"
    assert not host.status(first.registration_id).registered
    assert host.status(second.registration_id).run.attempt == 2


# -- identifiers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uid", ["../../../../x", "a/b", "..", "", "not-a-uuid", "7095D706-9F8B-4CD6-AFE1-DA8B6FAAFFBF"]
)
def test_path_like_and_malformed_run_uids_are_refused_before_anything_touches_a_path(
    host: Host, uid: str, tmp_path: Path
) -> None:
    outside = host.work_root.parent.parent.parent / "x"
    run = pb.RunRef(run_uid=uid, attempt=1, namespace="default", name="fn", runtime="python")
    request = pb.RegisterFunctionRequest(run=run, config=config())
    err = refused(host.stub.RegisterFunction, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(err) == "InvalidRequest"  # type: ignore[attr-defined]
    err = refused(host.stub.ExecuteTask, pb.ExecuteTaskRequest(run=run, config=config(), input=b"null"))
    assert reason(err) == "InvalidRequest"
    err = refused(host.stub.CancelTask, pb.CancelTaskRequest(run_uid=uid, attempt=1))
    assert reason(err) == "InvalidRequest"
    assert not outside.exists()
    assert sorted(p.name for p in host.work_root.parent.iterdir()) == [host.runtime.host_uid]


# -- validity: a certificate of the right CA and role, not yet valid ------------------------------


def test_a_gateway_certificate_not_yet_valid_is_refused_on_the_invoke_port(host: Host) -> None:
    early = host.pki.not_yet_valid(GATEWAY).client_context()
    assert not _accepted(host.runtime.invoke_address, early, server_hostname=TEST_HOST.dns_name)


def test_a_certificate_not_yet_valid_is_refused_on_the_grpc_port(host: Host) -> None:
    err = refused(stub(host, host.pki.not_yet_valid(CONTROL_PLANE)).HostInfo, pb.HostInfoRequest())
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
