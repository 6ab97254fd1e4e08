"""Record InvocationWorkflow's histories for replay_test.py: `python -m tests.replay.record_invocations`.

One history per ending (Succeeded with its callback delivered, Failed by a handler error, Failed
TargetGone after waiting for a Run not Ready, Unknown, and retried for each reason then
Succeeded, and the run after a continue-as-new ending Succeeded), on the time-skipping test server with the activities' stand-ins (the workflow's
commands do not depend on what the activities do, only on what they answered: the history holds
that). Each is recorded after its retention (60 s, skipped), so it ends with the completion.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

from kruntimes.contracts.invocation import CallbackOutcome, InvocationInput, TargetKind
from tests.workflows.invocations import (
    GONE,
    NOT_READY,
    Script,
    StandIns,
    answered,
    invocation_worker,
    new_input,
    ready,
    refused,
    start,
    time_skipping,
)

HISTORIES = Path(__file__).parent / "histories"
log = logging.getLogger("record")
KEPT = 60  # the shortest retention
LONG_WAIT = 130  # attempts that did not run: the run continues as new after 125 attempts, the next has 7


async def main() -> None:
    standins = StandIns()
    async with time_skipping() as env, invocation_worker(env.client, standins) as queue:
        scenarios: dict[str, InvocationInput] = {}

        def scenario(name: str, *, kind: TargetKind = TargetKind.Run, callback: str | None = None) -> Script:
            input = new_input(kind=kind, callback=callback)
            scenarios[name] = input
            return standins.script(input.target.uid)

        succeeded = scenario("invocation_succeeded_callback", callback="https://hooks.example.com/in")
        succeeded.targets = [ready(retentionSeconds=KEPT, callbackSecretName="hook-key", creator="cli:bob")]
        succeeded.callbacks = [
            CallbackOutcome(delivered=False, httpStatus=500),
            CallbackOutcome(delivered=True),
        ]

        failed = scenario("invocation_failed_handler")
        failed.targets = [ready(retentionSeconds=KEPT)]
        failed.attempts = [answered("HandlerError", error={"type": "ValueError", "message": "no"})]

        gone = scenario("invocation_failed_target_gone")
        gone.targets = [NOT_READY, ready(retentionSeconds=KEPT), GONE]
        gone.attempts = [refused(503, "RunNotReady")]

        unknown = scenario("invocation_unknown")
        unknown.targets = [ready(retentionSeconds=KEPT)]
        unknown.attempts = [refused(502, "OwnerUnreachable", dispatched=True)]

        retried = scenario("invocation_retried_succeeded", kind=TargetKind.Function)
        retried.targets = [ready(retentionSeconds=KEPT, retry={"onFailure": True, "onUnknownOutcome": True})]
        retried.attempts = [
            refused(429, "ReplicasFull"),
            refused(0),
            answered("HandlerError"),
            refused(504, "OwnerTimeout", dispatched=True),
            answered(),
        ]

        continued = scenario("invocation_continued_ended", kind=TargetKind.Function)
        continued.targets = [ready(retentionSeconds=KEPT, retry={"onFailure": True})]
        continued.attempts = [
            answered("HandlerError"),
            *[refused(503, "NoReadyReplica")] * LONG_WAIT,
            answered(),
        ]

        handles = {name: await start(env.client, queue, input) for name, input in scenarios.items()}
        for name, handle in handles.items():
            ended = await handle.result()
            # the last run only (a continued one starts from the status carried)
            latest = await env.client.get_workflow_handle(handle.id).describe()
            history = await env.client.get_workflow_handle(handle.id, run_id=latest.run_id).fetch_history()
            text = json.dumps(json.loads(history.to_json()), indent=1) + "\n"
            (HISTORIES / f"{name}.json").write_text(text)
            log.info(
                "%s: %s after %d attempts, %d events",
                name,
                ended.state.value,
                ended.attemptCount,
                len(history.events),
            )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    asyncio.run(main())
