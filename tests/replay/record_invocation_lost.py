"""Record InvocationWorkflow's histories of attempts whose activity never answered (#44), with
the patch `invocation-attempt-not-sent`: `python -m tests.replay.record_invocation_lost`.

    invocation_not_started_retried   a Run's first attempt timed out on its heartbeat without
                                     recording that it sent (never ran): tried again,
                                     uncounted (retry.maxAttempts 1), Succeeded
    invocation_sent_lost_unknown     the attempt recorded that it sent, then timed out: Unknown
                                     AttemptLost

On the time-skipping test server with tests/workflows/invocation_lost.py's stand-ins; each waits
out the workflow's real heartbeat timeout (the server does not skip time while an activity runs),
then its retention (skipped), so it ends with the completion. The histories of
tests/replay/record_invocations.py are left as they are (recorded before the patch: its old
branch).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

from kruntimes.contracts.invocation import InvocationInput
from tests.workflows.invocation_lost import LosingStandIns, Lost
from tests.workflows.invocations import answered, invocation_worker, new_input, ready, start, time_skipping

HISTORIES = Path(__file__).parent / "histories"
log = logging.getLogger("record")
KEPT = 60  # the shortest retention


async def main() -> None:
    standins = LosingStandIns()
    async with time_skipping() as env, invocation_worker(env.client, standins) as queue:
        scenarios: dict[str, InvocationInput] = {}
        not_started = new_input()
        scenarios["invocation_not_started_retried"] = not_started
        script = standins.script(not_started.target.uid)
        script.targets = [ready(retentionSeconds=KEPT, retry={"maxAttempts": 1})]
        script.attempts = [Lost.NEVER_RAN, answered()]
        sent = new_input()
        scenarios["invocation_sent_lost_unknown"] = sent
        script = standins.script(sent.target.uid)
        script.targets = [ready(retentionSeconds=KEPT)]
        script.attempts = [Lost.SENT_THEN_LOST]

        handles = {name: await start(env.client, queue, input) for name, input in scenarios.items()}
        for name, handle in handles.items():
            ended = await handle.result()
            history = await handle.fetch_history()
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
