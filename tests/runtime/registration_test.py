"""Registration semantics: generations keyed by Run UID and attempt.

The same (uid, attempt, config) is the same registration; the same attempt with another config is
refused; a higher attempt replaces the registration (the old id stops working); a lower one is stale.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, reason, run_ref
from tests.support.waiting import eventually_blocking

ECHO = """
def handle(payload):
    return {"echo": payload}
"""


def test_same_uid_attempt_and_config_returns_the_same_registration_id(host: Host) -> None:
    uid = str(uuid.uuid4())
    first = host.register(ECHO, uid=uid)
    again = host.register(ECHO, uid=uid)
    assert first.created and not again.created
    assert again.registration_id == first.registration_id
    assert host.invoke(first.registration_id, b'{"a": 1}').outputs_json == b'{"echo":{"a":1}}'


def test_same_attempt_with_a_different_config_is_refused_with_a_reason(host: Host) -> None:
    uid = str(uuid.uuid4())
    host.register(ECHO, uid=uid)
    with pytest.raises(grpc.RpcError) as err:
        host.register(ECHO, uid=uid, env={"CHANGED": "1"})
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(err.value) == "RegistrationConflict"
    assert "different config" in (err.value.details() or "")


def test_a_higher_attempt_starts_a_new_generation_and_the_old_id_stops_working(host: Host) -> None:
    uid = str(uuid.uuid4())
    old = host.register(ECHO, uid=uid, attempt=1)
    new = host.register(ECHO, uid=uid, attempt=2)
    assert new.registration_id != old.registration_id
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(old.registration_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert not host.status(old.registration_id).registered
    assert host.status(new.registration_id).run.attempt == 2
    assert not (host.work_root / f"{uid}.1").exists()
    assert host.invoke(new.registration_id).status == pb.INVOCATION_STATUS_SUCCEEDED


def test_a_lower_attempt_than_the_current_one_is_stale(host: Host) -> None:
    uid = str(uuid.uuid4())
    host.register(ECHO, uid=uid, attempt=3)
    with pytest.raises(grpc.RpcError) as err:
        host.register(ECHO, uid=uid, attempt=2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(err.value) == "StaleAttempt"


def test_unregister_of_an_absent_registration_succeeds(host: Host) -> None:
    answer = host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id="reg-never-existed"))
    assert answer.existed is False


def test_unregister_stops_invokes_and_removes_the_workspace(host: Host) -> None:
    uid = str(uuid.uuid4())
    reg = host.register(ECHO, uid=uid)
    workdir = host.work_root / f"{uid}.1"
    assert (workdir / "main.py").is_file()
    assert host.stub.UnregisterFunction(
        pb.UnregisterFunctionRequest(registration_id=reg.registration_id)
    ).existed
    assert not workdir.exists()
    assert not host.status(reg.registration_id).registered
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(reg.registration_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    again = host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg.registration_id))
    assert again.existed is False


def test_a_handler_that_cannot_be_imported_fails_registration_and_leaves_nothing(host: Host) -> None:
    uid = str(uuid.uuid4())
    with pytest.raises(grpc.RpcError) as err:
        host.register("import does_not_exist_anywhere\n", uid=uid)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(err.value) == "HandlerLoadFailed"
    assert "does_not_exist_anywhere" in (err.value.details() or "")
    assert not (host.work_root / f"{uid}.1").exists()


def test_a_missing_handler_function_fails_registration(host: Host) -> None:
    with pytest.raises(grpc.RpcError) as err:
        host.register(ECHO, handler="main:nope")
    assert reason(err.value) == "HandlerLoadFailed"
    assert "has no attribute 'nope'" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("files", "handler", "adapter"),
    [
        ({"../escape.py": ECHO}, "escape:handle", "python"),
        ({"main.py": ECHO}, "main", "python"),
        ({"run.sh": "echo {}"}, "/etc/passwd", "bash"),
        ({"run.sh": "echo {}"}, "missing.sh", "bash"),
    ],
)
def test_bad_sources_and_handlers_are_invalid_arguments(
    host: Host, files: dict[str, str], handler: str, adapter: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        host.register(files, handler=handler, adapter=adapter)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _register_path(host: Host, path: str) -> pb.RegisterFunctionResponse:
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python")
    config = pb.FunctionConfig(adapter="python", handler="main:handle", source_path=path)
    return host.stub.RegisterFunction(host.register_request(run, config))


def test_a_source_directory_is_copied_and_symlinks_out_of_it_are_refused(host: Host, sources: Path) -> None:
    src = sources / uuid.uuid4().hex[:8]
    src.mkdir()
    (src / "main.py").write_text("from helper import VALUE\ndef handle(p):\n    return VALUE\n")
    (src / "helper.py").write_text("VALUE = 42\n")
    run = run_ref()
    config = pb.FunctionConfig(adapter="python", handler="main:handle", source_path=str(src))
    reg = host.stub.RegisterFunction(host.register_request(run, config))
    assert host.invoke(reg.registration_id).outputs_json == b'{"result":42}'
    (src / "leak").symlink_to("/etc/hostname")
    run2 = run_ref()
    with pytest.raises(grpc.RpcError) as err:
        host.stub.RegisterFunction(host.register_request(run2, config))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the source" in (err.value.details() or "")


def test_status_reports_registration_readiness_and_activity(host: Host) -> None:
    reg = host.register(ECHO)
    status = host.status(reg.registration_id)
    assert status.registered and status.ready and not status.fatal_error
    assert status.in_flight == 0
    registered_at = status.last_activity.ToDatetime()
    assert registered_at == reg.last_activity.ToDatetime()
    host.invoke(reg.registration_id)
    assert host.status(reg.registration_id).last_activity.ToDatetime() > registered_at
    info = host.stub.HostInfo(pb.HostInfoRequest())
    assert reg.registration_id in {r.registration_id for r in info.registrations}


def test_unregistering_a_running_function_kills_it_without_warming_another(host: Host) -> None:
    reg = host.register("import time\ndef handle(p):\n    time.sleep(30)\n")
    running = host.gateway.InvokeFunction.future(
        pb.InvokeFunctionRequest(registration_id=reg.registration_id)
    )
    eventually_blocking(lambda: host.status(reg.registration_id).in_flight == 1, what="the invocation to run")
    spawned = host.runtime.spawner._next_id
    assert host.stub.UnregisterFunction(
        pb.UnregisterFunctionRequest(registration_id=reg.registration_id, grace_ms=1)
    ).existed
    assert running.result().status == pb.INVOCATION_STATUS_PROCESS_EXITED
    assert host.runtime.spawner._next_id == spawned, "a process was started for a registration being removed"


@pytest.mark.parametrize(
    "where",
    ["the state directory", "its tls directory", "a directory above it", "outside every root", "relative"],
)
def test_a_source_path_outside_the_allowed_roots_or_touching_the_state_dir_is_refused(
    host: Host, sources: Path, where: str
) -> None:
    state = host.runtime.options.state_dir
    (state / "tls").mkdir(exist_ok=True)
    (state / "tls" / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\nsecret\n")
    path = {
        "the state directory": str(state),
        "its tls directory": str(state / "tls"),
        "a directory above it": str(state.parent),
        "outside every root": "/etc",
        "relative": "fn",
    }[where]
    with pytest.raises(grpc.RpcError) as err:
        _register_path(host, path)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(err.value) == "SourceInvalid"
    assert len(err.value.details() or "") < 1100


def test_a_source_path_through_a_symlink_into_the_state_dir_is_refused(host: Host, sources: Path) -> None:
    link = sources / f"link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(host.runtime.options.state_dir)
    with pytest.raises(grpc.RpcError) as err:
        _register_path(host, str(link))
    assert reason(err.value) == "SourceInvalid"


def test_every_error_a_host_returns_is_bounded(host: Host, sources: Path) -> None:
    """A huge path (or any long message) is cut, never breaking gRPC's metadata limits."""
    deep = str(sources) + "/" + "x" * 200_000
    with pytest.raises(grpc.RpcError) as err:
        _register_path(host, deep)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.value.details() or "") <= 1100
