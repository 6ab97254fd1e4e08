"""InvokeFunction: one in flight, bounded input and output, timeouts kill the process group."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import pytest

from kruntimes.api.limits import MAX_LOG_BYTES, MAX_PAYLOAD_BYTES
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, function_processes, reason
from tests.support.waiting import wait_until

SLOW = """
import time
def handle(payload):
    time.sleep(payload.get("sleep", 0))
    return {"slept": payload.get("sleep", 0)}
"""


def test_the_invocation_id_is_echoed_and_the_payload_reaches_the_handler(host: Host) -> None:
    reg = host.register("def handle(p, ctx):\n    return {'got': p, 'id': ctx.invocation_id}\n")
    answer = host.invoke(reg.registration_id, b'{"x": [1, 2]}', invocation_id="inv-123")
    assert answer.invocation_id == "inv-123"
    assert json.loads(answer.outputs_json) == {"got": {"x": [1, 2]}, "id": "inv-123"}


def test_an_invocation_id_is_generated_when_absent(host: Host) -> None:
    reg = host.register(SLOW)
    assert len(host.invoke(reg.registration_id).invocation_id) == 36


@pytest.mark.parametrize("bad_id", ["x" * 129, "a\nb", "tab\there"])
def test_bad_invocation_ids_are_refused(host: Host, bad_id: str) -> None:
    reg = host.register(SLOW)
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(reg.registration_id, invocation_id=bad_id)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_payload_over_one_mebibyte_is_refused(host: Host) -> None:
    reg = host.register("def handle(p):\n    return len(p)\n")
    payload = b'"' + b"x" * (MAX_PAYLOAD_BYTES - 1) + b'"'
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(reg.registration_id, payload)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(err.value) == "InvalidRequest"
    fits = b'"' + b"x" * (MAX_PAYLOAD_BYTES - 3) + b'"'
    assert host.invoke(reg.registration_id, fits).status == pb.INVOCATION_STATUS_SUCCEEDED


def test_an_overlapping_invocation_is_refused_at_once_while_the_first_runs(host: Host) -> None:
    reg = host.register(SLOW)
    first = host.gateway.InvokeFunction.future(
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b'{"sleep": 3}')
    )
    assert wait_until(lambda: host.status(reg.registration_id).in_flight == 1)
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(reg.registration_id, b'{"sleep": 0}')
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(err.value) == "ConcurrencyLimit"
    assert not first.done(), "the refusal must not wait for the running invocation"
    assert first.result().status == pb.INVOCATION_STATUS_SUCCEEDED
    assert host.invoke(reg.registration_id).status == pb.INVOCATION_STATUS_SUCCEEDED


def test_never_two_invocations_execute_at_once(host: Host, scratch: Path) -> None:
    marker = scratch / "running"
    reg = host.register(
        f"""
import os, time
def handle(p):
    fd = os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL)  # fails if another call is inside
    time.sleep(0.05)
    os.close(fd); os.unlink({str(marker)!r})
    return {{}}
"""
    )
    codes: list[str] = []

    def call() -> None:
        try:
            codes.append(pb.InvocationStatus.Name(host.invoke(reg.registration_id).status))
        except grpc.RpcError as err:
            codes.append(err.code().name)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "INVOCATION_STATUS_SUCCEEDED" in codes
    assert set(codes) <= {"INVOCATION_STATUS_SUCCEEDED", "RESOURCE_EXHAUSTED"}


def test_a_timed_out_invocation_kills_all_its_processes_and_the_function_stays_usable(
    host: Host, scratch: Path
) -> None:
    started = scratch / "child-started"
    reg = host.register(
        f"""
import os, secrets, subprocess, time
PROCESS = secrets.token_hex(8)  # this warm process, whatever its pid in its own namespace
def handle(p):
    if p.get("hang"):
        subprocess.Popen(["sleep", "300"])
        open({str(started)!r}, "w").close()
        time.sleep(300)
    return {{"process": PROCESS, "uid": os.getuid()}}
"""
    )
    before = json.loads(host.invoke(reg.registration_id).outputs_json)
    answer = host.invoke(reg.registration_id, b'{"hang": true}', timeout_ms=1000)
    assert answer.status == pb.INVOCATION_STATUS_TIMED_OUT
    assert answer.error.type == "Timeout"
    assert started.exists()
    # left: only the fresh warm process, started before the answer; the hung one and its child are gone
    assert wait_until(lambda: len(function_processes(before["uid"])) == 1), "the handler's child dies with it"
    status = host.status(reg.registration_id)
    assert status.registered and status.ready
    after = host.invoke(reg.registration_id)
    assert after.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert json.loads(after.outputs_json)["process"] != before["process"], "a fresh process serves"


def test_in_flight_and_last_activity_follow_an_invocation(host: Host) -> None:
    reg = host.register(SLOW)
    registered = host.status(reg.registration_id).last_activity.ToDatetime()
    running = host.gateway.InvokeFunction.future(
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b'{"sleep": 0.5}')
    )
    assert wait_until(lambda: host.status(reg.registration_id).in_flight == 1)
    started = host.status(reg.registration_id).last_activity.ToDatetime()
    assert started > registered
    running.result()
    done = host.status(reg.registration_id)
    assert done.in_flight == 0
    assert done.last_activity.ToDatetime() > started


def test_stdout_and_stderr_are_captured_bounded_and_flagged(host: Host) -> None:
    reg = host.register(
        """
import sys
def handle(p):
    print("x" * 1_000_000)
    print("to stderr", file=sys.stderr)
    return {}
"""
    )
    answer = host.invoke(reg.registration_id)
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert answer.stdout.truncated and len(answer.stdout.data) == MAX_LOG_BYTES
    assert answer.stdout.total_bytes == 1_000_001
    assert answer.stderr.data == b"to stderr\n" and not answer.stderr.truncated


def test_output_written_between_invocations_is_not_attributed_to_the_next(host: Host, scratch: Path) -> None:
    marker = scratch / "late-written"
    reg = host.register(
        f"""
import threading, time
def late():
    time.sleep(0.2)
    print("late", flush=True)
    open({str(marker)!r}, "w").close()
def handle(p):
    if p.get("late"):
        threading.Thread(target=late).start()
    print("mine", flush=True)
    return {{}}
"""
    )
    assert host.invoke(reg.registration_id, b'{"late": true}').stdout.data == b"mine\n"
    assert wait_until(marker.exists)  # the stray line is in the pipe between the two calls
    assert host.invoke(reg.registration_id).stdout.data == b"mine\n"


def test_the_fence_rejects_a_mismatched_run_attempt_or_host(host: Host) -> None:
    reg = host.register(SLOW)
    uid = host.status(reg.registration_id).run.run_uid
    host_uid = reg.host_uid
    for fence in (
        pb.Fence(run_uid="someone-else"),
        pb.Fence(run_uid=uid, attempt=2),
        pb.Fence(run_uid=uid, attempt=1, host_uid="an-older-incarnation"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            host.gateway.InvokeFunction(
                pb.InvokeFunctionRequest(registration_id=reg.registration_id, fence=fence)
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason(err.value) == "FenceMismatch"
    ok = pb.Fence(run_uid=uid, attempt=1, host_uid=host_uid)
    answer = host.gateway.InvokeFunction(
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, fence=ok, payload=b"{}")
    )
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED


def test_a_caller_that_gives_up_does_not_free_the_function_early(host: Host, scratch: Path) -> None:
    """The server goes on with an invocation whose caller went away (deadline): the registration
    stays busy until the handler has answered, and the next call gets its own answer."""
    release = scratch / "release"
    reg = host.register(
        f"""
import os, time
def handle(p):
    if p.get("wait"):
        while not os.path.exists({str(release)!r}):
            time.sleep(0.01)
    return {{"call": p.get("n")}}
"""
    )
    with pytest.raises(grpc.RpcError) as err:
        host.gateway.InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b'{"wait": true, "n": 1}'),
            timeout=0.2,
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert host.status(reg.registration_id).in_flight == 1
    with pytest.raises(grpc.RpcError) as busy:
        host.invoke(reg.registration_id, b'{"n": 2}')
    assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.touch()
    assert wait_until(lambda: host.status(reg.registration_id).in_flight == 0)
    answer = host.invoke(reg.registration_id, b'{"n": 3}')
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert json.loads(answer.outputs_json) == {"call": 3}
