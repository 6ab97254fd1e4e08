"""The bash adapter: a script per invocation, payload on stdin, JSON outputs on stdout."""

from __future__ import annotations

import json

from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host


def _bash(host: Host, script: str) -> str:
    return host.register({"run.sh": script}, adapter="bash", handler="run.sh").registration_id


def test_the_payload_arrives_on_stdin_and_stdout_json_is_the_outputs(host: Host) -> None:
    reg = _bash(
        host, 'read -r line\necho "{\\"got\\": $line, \\"greeting\\": \\"$GREETING\\"}"\necho note >&2\n'
    )
    answer = host.invoke(reg, b'{"n": 3}')
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert json.loads(answer.outputs_json) == {"got": {"n": 3}, "greeting": ""}
    assert answer.stderr.data == b"note\n"


def test_empty_stdout_means_empty_outputs_and_other_json_goes_under_result(host: Host) -> None:
    assert host.invoke(_bash(host, "true\n")).outputs_json == b"{}"
    assert json.loads(host.invoke(_bash(host, "echo '[1,2]'\n")).outputs_json) == {"result": [1, 2]}


def test_a_non_zero_exit_is_a_handler_error_with_the_exit_code(host: Host) -> None:
    answer = host.invoke(_bash(host, "echo failing >&2\nexit 3\n"))
    assert answer.status == pb.INVOCATION_STATUS_HANDLER_ERROR
    assert answer.exit_code == 3
    assert answer.error.type == "NonZeroExit"
    assert answer.stderr.data == b"failing\n"


def test_stdout_that_is_not_json_is_invalid_output(host: Host) -> None:
    answer = host.invoke(_bash(host, "echo hello\n"))
    assert answer.status == pb.INVOCATION_STATUS_INVALID_OUTPUT
    assert answer.stdout.data == b"hello\n"


def test_a_hanging_script_is_killed_with_everything_it_started(host: Host) -> None:
    reg = _bash(host, "sleep 300 &\nsleep 300\n")
    answer = host.invoke(reg, timeout_ms=500)
    assert answer.status == pb.INVOCATION_STATUS_TIMED_OUT
    assert host.invoke(_bash(host, "echo '{}'\n")).status == pb.INVOCATION_STATUS_SUCCEEDED


def test_a_background_process_holding_stdout_does_not_hold_the_invocation(host: Host) -> None:
    answer = host.invoke(_bash(host, "(sleep 300) &\necho '{\"done\": true}'\n"), timeout_ms=20_000)
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert json.loads(answer.outputs_json) == {"done": True}


def test_a_large_payload_is_streamed_to_a_script_that_reads_it_all(host: Host) -> None:
    payload = json.dumps({"blob": "y" * 500_000}).encode()
    answer = host.invoke(_bash(host, 'n=$(wc -c)\necho "{\\"bytes\\": $n}"\n'), payload)
    assert json.loads(answer.outputs_json) == {"bytes": len(payload)}


def test_a_flood_on_stdout_is_bounded(host: Host) -> None:
    answer = host.invoke(_bash(host, "head -c 2000000 /dev/zero | tr '\\0' x\n"), timeout_ms=20_000)
    assert answer.status == pb.INVOCATION_STATUS_INVALID_OUTPUT
    assert answer.error.type == "OutputsTooLarge"
    assert answer.stdout.truncated and answer.stdout.total_bytes == 2_000_000
