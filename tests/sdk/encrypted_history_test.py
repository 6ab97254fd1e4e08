"""Run specs, env and outputs are ciphertext in Temporal history; the SDK reads them as usual."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.sdk.client import Client, RunFailed
from tests.sdk.stack import Platform, history_json, manifest, unique
from tests.support.waiting import eventually

SECRET = "hunter2-db-password-7f3a"
OUTPUT = "the-output-marker-91c2"
ENV_ECHO = "import os\ndef handle(p):\n    return {'password': os.environ['DB_PASSWORD']}\n"
TASK = f"def handle(p):\n    return {{'marker': '{OUTPUT}'}}\n"


async def test_the_env_of_a_run_never_appears_in_its_history(platform: Platform, krt: Client) -> None:
    name = unique("secret")
    await krt.create(Run.from_dict(manifest(name, source=ENV_ECHO, env={"DB_PASSWORD": SECRET})))
    await krt.wait(name)
    assert (await krt.invoke(name, {})).outputs == {"password": SECRET}, "the function got its env"
    got = await krt.get(name)
    assert got.spec.env == {"DB_PASSWORD": SECRET}, "the SDK decodes what it reads"
    history = await history_json(platform, name)
    assert SECRET not in history
    encrypted = base64.b64encode(b"binary/encrypted").decode()  # metadata values are base64 there
    assert encrypted in history and json.loads(history)["events"]


async def test_the_outputs_of_a_task_never_appear_in_its_history(platform: Platform, krt: Client) -> None:
    name = unique("task-secret")
    await krt.create(Run.from_dict(manifest(name, source=TASK, mode={"task": {}})))
    done = await krt.wait(name)
    assert done.status.phase is RunPhase.Succeeded and done.status.outputs == {"marker": OUTPUT}
    assert OUTPUT not in await history_json(platform, name)


LEAKY_TASK = (
    "import os\n"
    "def handle(p):\n"
    "    raise RuntimeError('cannot connect to postgres://app:' + os.environ['DB_PASSWORD'] + '@db')\n"
)
LEAKY_IMPORT = "import os\nraise SystemExit('bad config: ' + os.environ['DB_PASSWORD'])\n"


@pytest.mark.parametrize(
    ("source", "mode"),
    [(LEAKY_TASK, {"task": {}}), (LEAKY_IMPORT, {"function": {}})],
    ids=["a task's handler error", "a function whose import fails"],
)
async def test_a_handlers_error_text_is_encrypted_in_history_as_its_env_is(
    platform: Platform, krt: Client, source: str, mode: dict[str, Any]
) -> None:
    """What a handler writes into its error (here its env's password, as a driver's connection
    error would) reaches the Run's status, the activities' failures and the workflow's own
    failure: each is ciphertext in history, and the SDK reads the message as it was written."""
    name = unique("leaky")
    run = manifest(name, source=source, mode=mode, env={"DB_PASSWORD": SECRET}, retryPolicy={"limit": 1})
    await krt.create(Run.from_dict(run))
    with pytest.raises(RunFailed) as failed:
        await krt.wait(name)
    assert failed.value.run.status.phase is RunPhase.Failed
    assert SECRET in failed.value.run.status.message, "the SDK decodes the handler's words"
    # the Run is Failed in the task that indexes it; its workflow closes a task or two later
    history = await eventually(
        lambda: history_json(platform, name),
        until=lambda text: "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED" in text,
        what="the Run's workflow closed Failed",
    )
    assert SECRET not in history
    if "function" in mode:
        assert "Encoded failure" in history, (
            "the activities' failure messages are in their encoded attributes"
        )
    events = json.loads(history)["events"]
    closed = next(e for e in events if e["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED")
    failure = closed["workflowExecutionFailedEventAttributes"]["failure"]
    host = failed.value.run.status.assignedHost
    said = (
        "TaskFailed: HandlerError"
        if "task" in mode
        else "RetriesExhausted: HandlerLoadInterrupted (ProcessExited)"
    )
    assert failure["message"] == f"{said} on {host} at attempt 1", (
        "the Run's own failure: plain, the platform's words"
    )
