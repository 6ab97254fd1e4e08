"""The python adapter: warm process, sync or async handlers, errors as results, bounded outputs."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, reason


def _outputs(answer: pb.InvokeFunctionResponse) -> object:
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer.error
    return json.loads(answer.outputs_json)


def test_the_process_stays_warm_across_invocations(host: Host) -> None:
    reg = host.register(
        "import os\ncount = 0\ndef handle(p):\n    global count\n    count += 1\n    return {'n': count, 'pid': os.getpid()}\n"
    )
    first = _outputs(host.invoke(reg.registration_id))
    second = _outputs(host.invoke(reg.registration_id))
    assert (first["n"], second["n"]) == (1, 2)  # type: ignore[index]
    assert first["pid"] == second["pid"]  # type: ignore[index]


def test_async_handlers_are_awaited(host: Host) -> None:
    reg = host.register(
        "import asyncio\nasync def handle(p):\n    await asyncio.sleep(0)\n    return p * 2\n"
    )
    assert _outputs(host.invoke(reg.registration_id, b"21")) == {"result": 42}


def test_a_non_dict_result_is_wrapped_under_result(host: Host) -> None:
    reg = host.register("def handle(p):\n    return [1, 'two', None]\n")
    assert _outputs(host.invoke(reg.registration_id)) == {"result": [1, "two", None]}


def test_a_raised_exception_is_a_handler_error_and_the_process_stays(host: Host) -> None:
    reg = host.register(
        "import os, sys\ndef handle(p):\n    if p == 'exit':\n        sys.exit(4)\n"
        "    if p == 'raise':\n        raise ValueError('bad input')\n    return os.getpid()\n"
    )
    pid = _outputs(host.invoke(reg.registration_id, b'"ok"'))
    error = host.invoke(reg.registration_id, b'"raise"')
    assert error.status == pb.INVOCATION_STATUS_HANDLER_ERROR
    assert error.error.type == "HandlerError"
    assert "ValueError: bad input" in error.error.message
    exited = host.invoke(reg.registration_id, b'"exit"')
    assert exited.status == pb.INVOCATION_STATUS_HANDLER_ERROR and "SystemExit" in exited.error.message
    assert _outputs(host.invoke(reg.registration_id, b'"ok"')) == pid


def test_a_payload_that_is_not_json_is_a_handler_error(host: Host) -> None:
    reg = host.register("def handle(p):\n    return p\n")
    answer = host.invoke(reg.registration_id, b"{not json")
    assert answer.status == pb.INVOCATION_STATUS_HANDLER_ERROR
    assert answer.error.type == "InvalidPayload"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("return {1, 2}", "NotJSONSerializable"),
        ("return {'k': 'x' * 70_000}", "ValueTooLarge"),
        ("return {str(i): i for i in range(65)}", "TooManyKeys"),
        ("return {'bad key!': 1}", "InvalidKey"),
        ("return float('nan')", "NotJSONSerializable"),
    ],
)
def test_outputs_over_the_bounds_are_invalid_output(host: Host, body: str, fragment: str) -> None:
    reg = host.register(f"def handle(p):\n    {body}\n")
    answer = host.invoke(reg.registration_id)
    assert answer.status == pb.INVOCATION_STATUS_INVALID_OUTPUT
    assert fragment in answer.error.message
    assert answer.outputs_json == b""


def test_a_handler_that_exits_the_process_is_reported_and_a_fresh_process_serves_next(host: Host) -> None:
    reg = host.register(
        "import os, secrets\nPROCESS = secrets.token_hex(8)\ndef handle(p):\n    if p == 'die':\n        os._exit(7)\n    return PROCESS\n"
    )
    before = _outputs(host.invoke(reg.registration_id, b'"ok"'))
    died = host.invoke(reg.registration_id, b'"die"')
    assert died.status == pb.INVOCATION_STATUS_PROCESS_EXITED
    assert died.exit_code == 7
    assert host.status(reg.registration_id).ready
    after = _outputs(host.invoke(reg.registration_id, b'"ok"'))
    assert after != before


def test_a_warm_process_that_cannot_be_restarted_makes_the_registration_not_ready(
    host: Host, scratch: Path
) -> None:
    marker = scratch / "loaded-once"
    reg = host.register(
        f"""
import os
if os.path.exists({str(marker)!r}):
    raise RuntimeError("second start refused")
open({str(marker)!r}, "w").close()
def handle(p):
    os._exit(1)
"""
    )
    assert host.invoke(reg.registration_id).status == pb.INVOCATION_STATUS_PROCESS_EXITED
    status = host.status(reg.registration_id)
    assert status.registered and not status.ready
    assert "second start refused" in status.fatal_error
    with pytest.raises(grpc.RpcError) as err:
        host.invoke(reg.registration_id)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert reason(err.value) == "NotReady"
    phases = {r.registration_id: r.phase for r in host.stub.HostInfo(pb.HostInfoRequest()).registrations}
    assert phases[reg.registration_id] == pb.REGISTRATION_PHASE_NOT_READY


def test_env_is_applied_and_the_run_identity_is_visible(host: Host) -> None:
    reg = host.register(
        "import os\ndef handle(p):\n    return {k: os.environ.get(k) for k in ('GREETING', 'KRT_RUN_UID', 'KRT_ATTEMPT')}\n",
        uid="5f0c7f1e-0000-4000-8000-000000000001",
        env={"GREETING": "hello"},
    )
    assert _outputs(host.invoke(reg.registration_id)) == {
        "GREETING": "hello",
        "KRT_RUN_UID": "5f0c7f1e-0000-4000-8000-000000000001",
        "KRT_ATTEMPT": "1",
    }


def test_function_code_runs_in_its_own_process_group_with_limits(host: Host) -> None:
    reg = host.register(
        """
import os, resource
def handle(p):
    return {
        "pid": os.getpid(),
        "group": os.getpgid(0),
        "session": os.getsid(0),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "core": resource.getrlimit(resource.RLIMIT_CORE)[1],
        "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[1],
        "cpu": resource.getrlimit(resource.RLIMIT_CPU)[1],
        "as": resource.getrlimit(resource.RLIMIT_AS)[1],
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[1],
        "cwd": os.getcwd(),
    }
"""
    )
    out = _outputs(host.invoke(reg.registration_id))
    limits = host.runtime.options.limits
    in_force = host.runtime.in_force
    # in a PID namespace of its own the function's session and group are its namespace's init
    # (pid 1), which ends with it; without one the function leads them itself
    leader = 1 if in_force is not None and in_force.pid_namespace else out["pid"]  # type: ignore[index]
    assert out["session"] == out["group"] == leader  # type: ignore[index]
    assert out["nofile"] == limits.open_files  # type: ignore[index]
    assert out["core"] == 0  # type: ignore[index]
    assert out["fsize"] == limits.file_size_bytes  # type: ignore[index]
    assert out["cpu"] == limits.cpu_seconds  # type: ignore[index]
    assert out["as"] == limits.address_space_bytes  # type: ignore[index]
    assert out["nproc"] == limits.processes  # type: ignore[index]
    assert str(out["cwd"]).startswith(str(host.work_root))  # type: ignore[index]


def test_a_file_size_limit_stops_a_runaway_writer_without_harming_the_host(host: Host) -> None:
    reg = host.register(
        "def handle(p):\n    with open('big', 'wb') as f:\n        f.write(b'x' * (32 * 1024 * 1024))\n    return {}\n"
    )
    answer = host.invoke(reg.registration_id, timeout_ms=20_000)
    assert answer.status in (pb.INVOCATION_STATUS_HANDLER_ERROR, pb.INVOCATION_STATUS_PROCESS_EXITED)
    assert host.stub.HostInfo(pb.HostInfoRequest()).host_uid == host.runtime.host_uid


def test_function_code_runs_as_a_batch_task_so_it_never_preempts_the_host(host: Host) -> None:
    reg = host.register("import os\ndef handle(p):\n    return os.sched_getscheduler(0) == os.SCHED_BATCH\n")
    assert _outputs(host.invoke(reg.registration_id)) == {"result": True}
