"""ExecuteTask: run once, bounded outputs, exit status, timeout, idempotent per (run uid, attempt)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, inline, run_ref
from tests.support.waiting import wait_until


def _task(
    host: Host,
    files: dict[str, str],
    *,
    handler: str = "main:run",
    adapter: str = "python",
    data: bytes = b"null",
    timeout_ms: int = 0,
    uid: str | None = None,
) -> pb.ExecuteTaskResponse:
    return host.stub.ExecuteTask(
        pb.ExecuteTaskRequest(
            run=run_ref(uid),
            config=pb.FunctionConfig(adapter=adapter, handler=handler, inline=inline(files)),
            input=data,
            timeout_ms=timeout_ms,
        )
    )


def test_a_python_task_returns_its_outputs(host: Host) -> None:
    answer = _task(
        host, {"main.py": "def run(p):\n    print('working')\n    return {'sum': sum(p)}\n"}, data=b"[1,2,3]"
    )
    assert answer.status == pb.TASK_STATUS_SUCCEEDED
    assert json.loads(answer.outputs_json) == {"sum": 6}
    assert answer.stdout.data == b"working\n"
    assert answer.exit_code == 0


def test_a_failing_task_is_failed_with_the_reason(host: Host) -> None:
    answer = _task(host, {"main.py": "def run(p):\n    raise KeyError('missing')\n"})
    assert answer.status == pb.TASK_STATUS_FAILED
    assert "KeyError" in answer.error.message
    bash = _task(host, {"t.sh": "exit 9\n"}, adapter="bash", handler="t.sh")
    assert bash.status == pb.TASK_STATUS_FAILED and bash.exit_code == 9


def test_a_task_that_cannot_load_its_handler_fails(host: Host) -> None:
    answer = _task(host, {"main.py": "raise ImportError('nope')\n"})
    assert answer.status == pb.TASK_STATUS_FAILED
    assert answer.error.type == "HandlerImportError"


def test_a_slow_task_times_out(host: Host) -> None:
    answer = _task(host, {"main.py": "import time\ndef run(p):\n    time.sleep(300)\n"}, timeout_ms=500)
    assert answer.status == pb.TASK_STATUS_TIMED_OUT
    bash = _task(host, {"t.sh": "sleep 300\n"}, adapter="bash", handler="t.sh", timeout_ms=500)
    assert bash.status == pb.TASK_STATUS_TIMED_OUT


def test_task_outputs_are_bounded(host: Host) -> None:
    answer = _task(host, {"main.py": "def run(p):\n    return {'k': 'v' * 100_000}\n"})
    assert answer.status == pb.TASK_STATUS_FAILED
    assert answer.error.type == "InvalidOutput"


def test_a_repeated_call_for_the_same_attempt_joins_the_running_execution(host: Host, scratch: Path) -> None:
    log = scratch / "runs.log"
    files = {
        "main.py": f"import time\ndef run(p):\n    open({str(log)!r}, 'a').write('ran\\n')\n    time.sleep(1)\n    return {{'ok': True}}\n"
    }
    uid = str(uuid.uuid4())
    answers: list[pb.ExecuteTaskResponse] = []
    threads = [threading.Thread(target=lambda: answers.append(_task(host, files, uid=uid))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers.append(_task(host, files, uid=uid))  # after it ended: the retained result
    assert [a.status for a in answers] == [pb.TASK_STATUS_SUCCEEDED] * 4
    assert log.read_text() == "ran\n"


def test_cancel_task_kills_a_running_task(host: Host, scratch: Path) -> None:
    started = scratch / "started"
    uid = str(uuid.uuid4())
    files = {
        "main.py": f"import time\ndef run(p):\n    open({str(started)!r}, 'w').close()\n    time.sleep(300)\n"
    }
    result: list[pb.ExecuteTaskResponse] = []
    runner = threading.Thread(target=lambda: result.append(_task(host, files, uid=uid)))
    runner.start()
    assert wait_until(started.exists)
    assert host.stub.CancelTask(pb.CancelTaskRequest(run_uid=uid, attempt=1)).existed
    runner.join(timeout=30)
    assert result and result[0].status == pb.TASK_STATUS_CANCELLED
    assert not host.stub.CancelTask(pb.CancelTaskRequest(run_uid=str(uuid.uuid4()), attempt=1)).existed
