"""The shared platform keeps placing Runs when one of its Temporal workers stops on its own.

The suite's platform lives in pytest's event loop, which does not run during synchronous tests:
the pool's tasks time out there, and at the next async test the SDK's core may cancel a local
activity of an evicted pool run that Python had just finished. The SDK warns about that race
("Cannot find activity to cancel"); as an error (the suite's filterwarnings) the warning ended the
pools' worker's activity poller and the whole pools' worker, and every later Run stayed Pending.
"""

from __future__ import annotations

import inspect
import warnings

import temporalio.worker._activity as sdk_activity

from kruntimes.api.run import Run
from kruntimes.sdk.client import Client
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

NOTICE = "Cannot find activity to cancel for token"


def test_the_sdks_notice_of_a_cancel_it_cannot_match_is_no_error_under_the_suites_filters() -> None:
    source = inspect.getsource(sdk_activity).splitlines()
    line = next(n for n, text in enumerate(source, 1) if f'warnings.warn(f"{NOTICE}' in text)
    # Warned as the SDK's activity poller does (its module, its line): under "error" it raises.
    warnings.warn_explicit(
        f"{NOTICE} b'local_act_1'",
        UserWarning,
        filename=sdk_activity.__file__,
        lineno=line,
        module=sdk_activity.__name__,
    )


async def test_a_pools_worker_that_stops_on_its_own_is_started_again_and_runs_are_placed(
    platform: Platform, krt: Client
) -> None:
    supervised = platform.workers
    before = supervised.running
    assert before is not None
    queue = supervised.settings.pool_task_queue
    pools = next(w for w in before if w.task_queue == queue)
    await pools.shutdown()  # nobody asked: as when its activity poller raised

    await eventually(
        lambda: supervised.running,
        until=lambda now: now is not before,
        within=60,
        what="workers started again",
    )
    assert supervised.take_endings() == [f"the worker of task queue {queue!r} stopped"]
    name = unique("after")
    await krt.create(Run.from_dict(manifest(name)))
    ready = await krt.wait(name, timeout=60)
    assert (await krt.invoke(ready, {"placed": True})).outputs["echo"] == {"placed": True}
