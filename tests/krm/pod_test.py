"""The pod evaluator on the real embedded platform: function-mode Runs of a `krm` runtime created,
waited for, invoked through the gateway over HTTPS and deleted through the SDK."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kruntimes.krm import errors
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.resources import parse_resource_list
from kruntimes.sdk.client import Client
from tests.krm import programs
from tests.krm.conftest import eventually, request, store_with
from tests.krm.pods import GATED, HOLDER, SHARED, WHO, evaluator, image, krm_platform, pod_config
from tests.sdk.stack import Platform
from tests.support.locks import lock_free
from tests.support.pki import TestPKI

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
async def platform(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    async with krm_platform(tmp_path_factory, pki) as started:
        yield started


def exchange(platform: Platform) -> Path:
    """A fresh directory the test and its functions share."""
    directory = platform.shared / uuid.uuid4().hex[:8]
    directory.mkdir()
    directory.chmod(0o1777)
    return directory


async def run_names(platform: Platform) -> set[str]:
    async with Client(platform.config) as client:
        return {run.name for run in await client.list()}


async def until_listed(platform: Platform, name: str) -> None:
    """Until `krt run list` shows the Run `name`: it lists from Temporal's visibility, which
    indexes a new Run a moment after it started (seconds on a loaded machine)."""

    async def listed() -> bool:
        return name in await run_names(platform)

    await eventually(listed, timeout=30, what=f"Run {name} listed")


async def test_results_exit_codes_and_garbage_come_back_as_from_the_exec_evaluator(
    platform: Platform,
) -> None:
    configs = [
        pod_config("set-labels", programs.SET_LABELS),
        pod_config("validator", programs.VALIDATOR),
        pod_config("exit-1", programs.EXIT_1),
        pod_config("garbage", programs.GARBAGE),
    ]
    async with evaluator(platform, *configs) as pods:
        labelled, failed, exited, garbage = await asyncio.gather(
            pods.evaluate(request(image("set-labels"), config={"data": {"team": "a"}})),
            pods.evaluate(request(image("validator"))),
            pods.evaluate(request(image("exit-1"))),
            pods.evaluate(request(image("garbage"))),
            return_exceptions=True,
        )
        assert not isinstance(labelled, BaseException), labelled
        items = parse_resource_list(labelled.resource_list)["items"]
        assert all(item["metadata"]["labels"]["team"] == "a" for item in items)
        assert labelled.log == b"labelled 2 resources\n" and labelled.exit_code == 0

        assert isinstance(failed, errors.FunctionFailed), failed
        assert failed.evaluation is not None and failed.evaluation.exit_code == 1
        (result,) = failed.evaluation.results
        assert result.resourceRef is not None and result.resourceRef.name == "one"
        assert result.field is not None and result.field.proposedValue == "team-a"
        assert result.tags == {"rule": "owner"}

        assert isinstance(exited, errors.FunctionFailed), exited
        assert exited.evaluation is not None and exited.evaluation.results == ()
        assert b"something went wrong" in exited.evaluation.log
        assert isinstance(garbage, errors.InvalidOutput), garbage
        assert pods.stats.created == 4


async def test_twenty_concurrent_cold_requests_share_one_run(platform: Platform) -> None:
    async with evaluator(platform, pod_config("who", WHO, maxParallel=1, maxWaitlist=20)) as pods:
        answers = await asyncio.gather(*(pods.evaluate(request(image("who"))) for _ in range(20)))
        assert pods.stats.created == 1
        ((name, state, _busy),) = pods.snapshot()["example.com/pod/who:1.x"]
        assert state == "ready"
        assert {answer.log.decode() for answer in answers} == {f"run={name}"}
        await until_listed(platform, name)


async def test_one_run_takes_up_to_its_bound_of_evaluations_at_once(platform: Platform) -> None:
    shared = exchange(platform)
    started, release = shared / "started", shared / "release"
    started.mkdir(mode=0o1777)
    started.chmod(0o1777)
    body = GATED.format(started=str(started), release=str(release))
    config = pod_config("several", body, maxParallel=1, maxWaitlist=20, maxConcurrentEvaluations=3)
    async with evaluator(platform, config) as pods:
        tasks = [
            asyncio.create_task(pods.evaluate(request(image("several"), config={"data": {"n": str(i)}})))
            for i in range(7)
        ]
        await eventually(lambda: len(list(started.iterdir())) == 3, timeout=60, what="three running")
        ((name, _state, in_flight),) = pods.snapshot()["example.com/pod/several:1.x"]
        assert in_flight == 3 and pods.waiters() == {"example.com/pod/several:1.x": [4]}
        assert len(list(started.iterdir())) == 3, "no fourth one runs while three do"
        release.touch()
        answers = await asyncio.gather(*tasks)
        numbers = [parse_resource_list(a.resource_list)["functionConfig"]["data"]["n"] for a in answers]
        assert numbers == [str(i) for i in range(7)], "each caller got its own answer"
        assert {answer.log.decode() for answer in answers} == {f"run={name}"}
        assert len(list(started.iterdir())) == 7 and pods.stats.created == 1


async def test_a_cancelled_evaluation_beside_others_leaves_no_process(platform: Platform) -> None:
    shared = exchange(platform)
    lock, held, started, release = (shared / n for n in ("lock", "held", "started", "release"))
    body = SHARED.format(lock=str(lock), held=str(held), started=str(started), release=str(release))
    async with evaluator(platform, pod_config("beside", body, maxConcurrentEvaluations=2)) as pods:
        await pods.warm()
        ((name, _, _),) = pods.snapshot()["example.com/pod/beside:1.x"]
        holding = asyncio.create_task(
            pods.evaluate(request(image("beside"), config={"data": {"x": "hold-me"}}, timeout=120))
        )
        other = asyncio.create_task(pods.evaluate(request(image("beside"), config={"data": {"x": "y"}})))
        await eventually(lambda: held.exists() and started.exists(), timeout=60, what="both running")
        holding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holding
        assert not lock_free(lock), "the cancelled one runs until the other has answered"
        release.touch()
        answer = await other
        assert parse_resource_list(answer.resource_list)["functionConfig"]["data"]["x"] == "y"
        assert answer.log.decode() == f"run={name}"
        await eventually(
            lambda: lock_free(lock), timeout=60, what="the cancelled function's processes to end"
        )

        async def deleted() -> bool:
            return name not in await run_names(platform)

        await eventually(deleted, timeout=60, what="its Run to be deleted")
        assert pods.snapshot()["example.com/pod/beside:1.x"] == []


async def test_a_creation_error_reaches_every_waiter_and_the_next_request_creates_again(
    platform: Platform,
) -> None:
    broken = pod_config("broken", WHO, entrypoint=["missing.py"], maxWaitlist=10)
    async with evaluator(platform, broken) as pods:
        failures = await asyncio.gather(
            *(pods.evaluate(request(image("broken"))) for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(f, errors.SystemError_) for f in failures), failures
        assert len({str(f) for f in failures}) == 1, "one creation, one error for all"
        assert "missing.py" in str(failures[0])
        assert pods.stats.created == 1 and pods.stats.creation_failures == 1
        assert pods.snapshot()["example.com/pod/broken:1.x"] == []

        pods.store.put("test", pod_config("broken", WHO, maxWaitlist=10))  # fixed at run time
        answer = await pods.evaluate(request(image("broken")))
        assert answer.log.startswith(b"run=") and pods.stats.created == 2


async def test_past_the_waitlist_another_run_then_resource_exhausted(platform: Platform) -> None:
    shared = exchange(platform)
    started, release = shared, shared / "release"
    body = GATED.format(started=str(started), release=str(release))
    async with evaluator(
        platform, pod_config("gated", body, maxParallel=2, maxWaitlist=2, maxConcurrentEvaluations=1)
    ) as pods:

        def evaluate() -> asyncio.Task:
            return asyncio.create_task(pods.evaluate(request(image("gated"))))

        tasks = [evaluate() for _ in range(4)]  # two on the first Run's waitlist: a second Run
        await eventually(lambda: len(list(started.iterdir())) == 2, timeout=60, what="both Runs busy")
        assert pods.stats.created == 2
        tasks += [evaluate() for _ in range(2)]  # each Run: one running, two waiting
        await eventually(
            lambda: pods.waiters() == {"example.com/pod/gated:1.x": [2, 2]},
            what="two waiters on each Run",
        )
        with pytest.raises(errors.ResourceExhausted):
            await pods.evaluate(request(image("gated")))
        release.touch()
        answers = await asyncio.gather(*tasks)
        served_by = {answer.log.decode() for answer in answers}
        runs = {f"run={name}" for name, _, _ in pods.snapshot()["example.com/pod/gated:1.x"]}
        assert served_by == runs and len(runs) == 2 and pods.stats.created == 2


async def test_idle_runs_are_taken_least_recently_used_first(platform: Platform) -> None:
    async with evaluator(platform, pod_config("spread", WHO, maxParallel=2, maxWaitlist=0)) as pods:
        await asyncio.gather(*(pods.evaluate(request(image("spread"))) for _ in range(2)))
        assert pods.stats.created == 2, "no waitlist: the second request gets its own Run"
        served = [(await pods.evaluate(request(image("spread")))).log.decode() for _ in range(6)]
        assert len(set(served)) == 2
        assert all(served[i] != served[i + 1] for i in range(5)), f"round-robin: {served}"
        assert pods.stats.created == 2


# Echoes at once, saying which Run served it; an input with "hold-me" in it first waits (at most
# 60 s) until RELEASE exists.
HOLD_OR_ECHO = """
import os, pathlib, sys, time
data = sys.stdin.read()
if "hold-me" in data:
    release, deadline = pathlib.Path({release!r}), time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
sys.stderr.write("run=" + os.environ["KRT_RUN_NAME"])
sys.stdout.write(data)
"""


async def test_a_request_goes_to_the_least_loaded_run_though_it_was_used_last(platform: Platform) -> None:
    """Two Ready Runs of one image with unequal load (two and one evaluations in flight): the next
    request goes to the one with fewer, even when it is the most recently used of the two."""
    release = exchange(platform) / "release"
    body = HOLD_OR_ECHO.format(release=str(release))
    config = pod_config("unequal", body, maxParallel=2, maxWaitlist=0, maxConcurrentEvaluations=3)
    key = "example.com/pod/unequal:1.x"
    held = {"data": {"x": "hold-me"}}
    async with evaluator(platform, config) as pods:
        await asyncio.gather(*(pods.evaluate(request(image("unequal"))) for _ in range(2)))
        assert pods.stats.created == 2
        holds = []
        for n in range(3):  # round-robin over the two: 2 and 1 in flight
            holds.append(asyncio.create_task(pods.evaluate(request(image("unequal"), config=held))))
            await eventually(
                lambda n=n: sum(busy for _, _, busy in pods.snapshot()[key]) == n + 1,
                what=f"{n + 1} evaluations in flight",
            )
        loads = {name: busy for name, _, busy in pods.snapshot()[key]}
        assert sorted(loads.values()) == [1, 2], loads
        lighter = next(name for name, busy in loads.items() if busy == 1)
        for _ in range(2):  # the first makes it the most recently used; the second still goes there
            answer = await pods.evaluate(request(image("unequal")))
            assert answer.log.decode() == f"run={lighter}", loads
        release.touch()
        answers = await asyncio.gather(*holds)
        assert sorted(a.log.decode() for a in answers).count(f"run={lighter}") == 1


async def test_the_ttl_is_the_runs_idle_timeout(platform: Platform) -> None:
    async with evaluator(platform, pod_config("ttl", WHO, ttl="2s")) as pods:
        first = (await pods.evaluate(request(image("ttl")))).log.decode().removeprefix("run=")
        await until_listed(platform, first)

        async def expired() -> bool:
            async with Client(platform.config) as client:
                return (await client.status(first)).phase.value == "Timeout"

        await eventually(expired, timeout=60, what="the platform to end the idle Run")
        second = (await pods.evaluate(request(image("ttl")))).log.decode().removeprefix("run=")
        assert second != first and pods.stats.created == 2


async def test_a_run_that_ended_is_evicted_and_replaced(platform: Platform) -> None:
    async with evaluator(platform, pod_config("ended", WHO)) as pods:
        first = (await pods.evaluate(request(image("ended")))).log.decode().removeprefix("run=")
        async with Client(platform.config) as client:
            await client.cancel(first)  # out of band: its phase is Cancelled, it serves no more

            async def cancelled() -> bool:
                return (await client.status(first)).phase.value == "Cancelled"

            await eventually(cancelled, timeout=60, what="the Run to be cancelled")
        second = (await pods.evaluate(request(image("ended")))).log.decode().removeprefix("run=")
        assert second != first
        assert pods.stats.evicted == 1 and pods.stats.created == 2
        assert [n for n, _, _ in pods.snapshot()["example.com/pod/ended:1.x"]] == [second]


async def test_warming_creates_a_run_per_config_before_any_request(platform: Platform) -> None:
    configs = [pod_config("warm-a", WHO, tags=["v2.0.0", "1.x"]), pod_config("warm-b", WHO)]
    async with evaluator(platform, *configs) as pods:
        assert await pods.warm() == {}
        snapshot = pods.snapshot()
        assert set(snapshot) == {"example.com/pod/warm-a:v2.0.0", "example.com/pod/warm-b:1.x"}
        assert all(state == "ready" for runs in snapshot.values() for _, state, _ in runs)
        await pods.evaluate(request(image("warm-a", "v2.0.0")))
        assert pods.stats.created == 2, "the warm Run served it"


async def test_the_chain_falls_back_to_pods_on_not_found_only(platform: Platform, functions: Path) -> None:
    store = store_with(functions, "exit-1")
    store.put("pods", pod_config("chained", WHO))
    store.put("pods", pod_config("exit-1", WHO, prefix="example.com/fn/exit-1"))  # never reached
    async with Client(platform.config) as client:
        from kruntimes.krm.pod import PodEvaluator

        pods = PodEvaluator(store, client=client, runtime="krm")
        chain = MultiEvaluator([ExecEvaluator(store), pods])
        try:
            answer = await chain.evaluate(request(image("chained")))
            assert answer.log.startswith(b"run=")
            with pytest.raises(errors.FunctionFailed) as caught:
                await chain.evaluate(request("example.com/fn/exit-1:v1.0.0"))
            assert caught.value.evaluator == "exec"
            assert pods.stats.created == 1, "no pod was made for the exec evaluator's failure"
            with pytest.raises(errors.NotFound) as missing:
                await chain.evaluate(request("example.com/pod/nothing:v1.0.0"))
            assert "exec: " in str(missing.value) and "pod: " in str(missing.value)
        finally:
            await pods.close()


@contextlib.asynccontextmanager
async def holder(platform: Platform, name: str) -> AsyncIterator[tuple[PodEvaluator, Path, Path]]:
    """A warm evaluator of `name` served by HOLDER; with HOLDER's lock file and the file it touches
    once it holds the lock."""
    shared = exchange(platform)
    lock, held = shared / "lock", shared / "held"
    async with evaluator(platform, pod_config(name, HOLDER.format(lock=str(lock), held=str(held)))) as pods:
        await pods.warm()
        yield pods, lock, held


async def test_a_deadline_kills_the_function_and_keeps_the_run(platform: Platform) -> None:
    async with holder(platform, "holder") as (pods, lock, held):
        with pytest.raises(errors.DeadlineExceeded):
            await pods.evaluate(request(image("holder"), timeout=3))
        assert held.exists(), "it ran"
        await eventually(lambda: lock_free(lock), timeout=30, what="the function's processes to end")
        assert [s for _, s, _ in pods.snapshot()["example.com/pod/holder:1.x"]] == ["ready"]


async def test_a_cancelled_evaluation_deletes_its_run_and_its_processes(platform: Platform) -> None:
    async with holder(platform, "cancelled") as (pods, lock, held):
        ((name, _, _),) = pods.snapshot()["example.com/pod/cancelled:1.x"]
        evaluation = asyncio.create_task(pods.evaluate(request(image("cancelled"), timeout=120)))
        await eventually(held.exists, timeout=60, what="the function to start")
        evaluation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await evaluation
        await eventually(lambda: lock_free(lock), timeout=60, what="the function's processes to end")

        async def deleted() -> bool:
            return name not in await run_names(platform)

        await eventually(deleted, timeout=60, what="its Run to be deleted")
        assert pods.snapshot()["example.com/pod/cancelled:1.x"] == []


FLOOD = """
import sys
data = sys.stdin.read()
if "flood" in data:
    while True:
        sys.stdout.write("x" * 65536)
sys.stdout.write(data)
"""


async def test_output_past_the_bound_is_refused_and_stops_the_function(platform: Platform) -> None:
    """A function that writes without end is OutputTooLarge once it is past the bound, not
    DeadlineExceeded at its deadline, and its Run answers the next evaluation."""
    async with evaluator(platform, pod_config("flood", FLOOD)) as pods:
        with pytest.raises(errors.OutputTooLarge):
            await pods.evaluate(request(image("flood"), config={"data": {"mode": "flood"}}, timeout=60))
        answer = await pods.evaluate(request(image("flood")))
        assert [i["metadata"]["name"] for i in parse_resource_list(answer.resource_list)["items"]] == [
            "one",
            "two",
        ]
