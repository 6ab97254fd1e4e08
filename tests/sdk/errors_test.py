"""The SDK without a platform: answers mapped to typed errors, what create sends, the task queue."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import kruntimes
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.contracts.names import TASK_QUEUE
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.invoke import parse_answer
from kruntimes.sdk.runs import differences, prepare
from kruntimes.temporal.devserver import free_port
from tests.sdk.stack import manifest


def _error_body(reason: str) -> bytes:
    return json.dumps({"reason": reason, "message": "m", "invocationId": "inv-1"}).encode()


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, kruntimes.PayloadRejected),
        (401, kruntimes.Unauthorized),
        (403, kruntimes.Unauthorized),
        (404, kruntimes.FunctionNotFound),
        (413, kruntimes.PayloadRejected),
        (429, kruntimes.Busy),
        (502, kruntimes.OutcomeUnknown),
        (503, kruntimes.NotReady),
        (504, kruntimes.OutcomeUnknown),
        (500, kruntimes.OutcomeUnknown),
    ],
)
def test_each_error_answer_raises_its_typed_error(status: int, kind: type[kruntimes.InvokeError]) -> None:
    with pytest.raises(kind) as caught:
        parse_answer(status, {"Retry-After": "3"}, _error_body("Why"), "ours")
    assert type(caught.value) is kind
    assert (caught.value.status, caught.value.reason, caught.value.invocation_id) == (status, "Why", "inv-1")


def test_busy_and_not_ready_carry_retry_after() -> None:
    with pytest.raises(kruntimes.Busy) as busy:
        parse_answer(429, {"Retry-After": "2"}, _error_body("FunctionBusy"), "x")
    assert busy.value.retry_after == 2.0
    with pytest.raises(kruntimes.NotReady) as not_ready:
        parse_answer(503, {}, b"not json", "x")
    assert not_ready.value.retry_after == 1.0 and not_ready.value.reason == "HTTP503"
    assert not_ready.value.invocation_id == "x", "our id when the answer has none"


def test_a_handler_error_answer_is_invocation_failed_with_the_answer() -> None:
    body = {
        "invocationId": "i",
        "status": "HandlerError",
        "outputs": None,
        "stderr": {"data": "trace", "truncated": False, "totalBytes": 5},
        "durationMs": 1.5,
        "error": {"type": "ValueError", "message": "boom"},
    }
    with pytest.raises(kruntimes.InvocationFailed) as caught:
        parse_answer(200, {}, json.dumps(body).encode(), "i")
    assert caught.value.result.stderr.data == "trace"
    assert str(caught.value) == "HandlerError: ValueError: boom"


def test_a_success_answer_parses_and_ignores_unknown_fields() -> None:
    body = {"invocationId": "i", "status": "Succeeded", "outputs": {"a": 1}, "durationMs": 2, "new": True}
    result = parse_answer(200, {}, json.dumps(body).encode(), "i")
    assert result.ok and result.outputs == {"a": 1} and result.durationMs == 2.0


def test_create_sets_a_uid_and_makes_source_path_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = manifest("x")
    data["spec"]["source"] = {"path": "src"}
    run = prepare(Run.from_dict(data))
    assert run.metadata.uid is not None and len(run.metadata.uid) == 36
    assert run.spec.source.path == str(tmp_path / "src")
    assert prepare(run) is run, "nothing to change: the same object"


def test_apply_compares_spec_labels_and_uid() -> None:
    base = prepare(Run.from_dict(manifest("x")))
    assert differences(base, base, uid=None) == []
    assert differences(base, base, uid=base.metadata.uid) == []
    other = Run.from_dict({**manifest("x", env={"A": "1"}), "metadata": {"name": "x", "labels": {"k": "v"}}})
    assert differences(base, other, uid=None) == ["metadata.labels", "spec.env"]
    assert differences(base, base, uid=str(uuid.uuid4())) == ["metadata.uid"]


def test_a_run_object_prints_as_a_manifest_that_parses_back() -> None:
    run = prepare(Run.from_dict(manifest("x")))
    obj = kruntimes.RunObject.of(run, RunStatus())
    document = obj.manifest()
    assert list(document) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert document["metadata"]["uid"] == run.metadata.uid
    assert Run.from_dict(document).spec == run.spec


async def test_invoking_a_run_that_is_not_ready_fails_without_a_request() -> None:
    async with kruntimes.Client(ClientConfig()) as client:
        with pytest.raises(kruntimes.NotReady):
            await client.invoke(RunStatus(phase=RunPhase.Scheduled), {})
        with pytest.raises(kruntimes.FunctionNotFound) as finished:
            await client.invoke(RunStatus(phase=RunPhase.Failed), {})
    assert finished.value.reason == "RunFinished"


async def test_an_unreachable_gateway_is_a_config_error() -> None:
    url = f"https://127.0.0.1:{free_port()}/v1/namespaces/default/runtimes/python/functions/u:invoke"
    async with kruntimes.Client(ClientConfig()) as client:
        with pytest.raises(kruntimes.ConfigError, match="cannot reach the gateway at https://127.0.0.1"):
            await client.invoke(url, {"a": 1})


async def test_an_unreachable_temporal_is_a_config_error_naming_krt_up() -> None:
    config = ClientConfig(temporalAddress=f"127.0.0.1:{free_port()}")
    async with kruntimes.Client(config) as client:
        with pytest.raises(kruntimes.ConfigError, match=r"cannot reach Temporal at .*is `krt up` running\?"):
            await client.get("anything")


def test_the_task_queue_comes_from_client_json_then_krt_task_queue(tmp_path: Path) -> None:
    env = {"KRT_STATE_DIR": str(tmp_path)}
    assert clientconfig.load(env).taskQueue == TASK_QUEUE
    clientconfig.write(tmp_path, ClientConfig(taskQueue="from-file"))
    assert clientconfig.load(env).taskQueue == "from-file"
    assert clientconfig.load({**env, "KRT_TASK_QUEUE": "from-env"}).taskQueue == "from-env"
    with pytest.raises(ValueError, match="taskQueue"):
        ClientConfig(taskQueue="")
