"""A Function updated and rolled back under constant load (#43 item 6): no invocation fails or is
refused because of the update, and once the rollout is done every answer is the new revision's."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from kruntimes.api.function import Function
from kruntimes.sdk.client import Client, FunctionNotFound, KruntimesError
from kruntimes.sdk.functions import rolled_out
from tests.sdk.stack import manifest, unique

CLIENTS = 8
SLOW = (
    "import os, time\ndef handle(p):\n    time.sleep(0.05)\n    return {'version': os.environ['VERSION']}\n"
)


def function(name: str, version: str) -> Function:
    document = manifest(
        name,
        source=SLOW,
        env={"VERSION": version},
        mode={"function": {"concurrency": 4}},
        scale={"min": 2, "max": 2},
    )
    return Function.from_dict({**document, "kind": "Function"})


class Load:
    """CLIENTS callers invoking the Function back to back; every answer or error is kept in order."""

    def __init__(self, krt: Client, name: str) -> None:
        self.krt, self.name = krt, name
        self.answers: list[tuple[int, str]] = []  # (sequence, version or "error: ...")
        self._stop = asyncio.Event()
        self._seq = 0

    async def _caller(self) -> None:
        while not self._stop.is_set():
            self._seq += 1
            seq = self._seq
            try:
                answer = await self.krt.functions.invoke(self.name, None, timeout=30)
                self.answers.append(
                    (seq, str(answer.outputs["version"]) if answer.ok else f"error: {answer}")
                )
            except KruntimesError as e:
                self.answers.append((seq, f"error: {type(e).__name__}: {e}"))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        callers = [asyncio.create_task(self._caller()) for _ in range(CLIENTS)]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*callers)

    def since(self, seq: int) -> collections.Counter[str]:
        return collections.Counter(v for s, v in self.answers if s > seq)

    async def answered(self, count: int) -> None:
        target = len(self.answers) + count
        while len(self.answers) < target:
            await asyncio.sleep(0.05)


async def test_an_update_and_a_rollback_under_load_fail_no_invocation(krt: Client) -> None:
    name = unique("roll")
    try:
        await krt.functions.apply(function(name, "1"))
        await krt.functions.wait_ready(name, timeout=90)
        load = Load(krt, name)
        async with load.running():
            await asyncio.wait_for(load.answered(40), 60)
            await krt.functions.apply(function(name, "2"))
            status = await krt.functions.rollout_status(name, timeout=120)
            assert rolled_out(status) and status.revision == 2
            after_update = load._seq
            await asyncio.wait_for(load.answered(40), 60)
            before_rollback = load._seq
            await krt.functions.rollback(name)
            status = await krt.functions.rollout_status(name, timeout=120)
            assert rolled_out(status) and status.revision == 3
            after_rollback = load._seq
            await asyncio.wait_for(load.answered(40), 60)
        every = collections.Counter(v for _, v in load.answers)
        errors = {v: n for v, n in every.items() if v.startswith("error")}
        assert not errors, f"invocations failed during the rollout: {errors}"
        late = collections.Counter(v for s, v in load.answers if after_update < s <= before_rollback)
        assert set(late) == {"2"}, f"after the update's rollout, only the new revision answers: {late}"
        assert set(load.since(after_rollback)) == {"1"}, "after the rollback, only revision 1's template"
    finally:
        with contextlib.suppress(FunctionNotFound):
            await krt.functions.delete(name, timeout=120)
