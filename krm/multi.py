"""The multi evaluator: its evaluators in order, the first answer wins.

Only NotFound moves on to the next evaluator; any other error is returned at once, naming the
evaluator that raised it (a timeout or a failing function must not be masked by another try).
NotFound from every evaluator is the final answer, and says what each one said.
"""

from __future__ import annotations

from collections.abc import Sequence

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.evaluator import Evaluator


class MultiEvaluator:
    name = "multi"

    def __init__(self, evaluators: Sequence[Evaluator]) -> None:
        if not evaluators:
            raise ValueError("a multi evaluator needs at least one evaluator")
        self.evaluators = tuple(evaluators)

    async def evaluate(self, request: Request) -> Evaluation:
        misses = []
        for evaluator in self.evaluators:
            try:
                return await evaluator.evaluate(request)
            except errors.NotFound as e:
                misses.append(f"{evaluator.name}: {e.message}")
            except errors.KrmError as e:
                e.within(evaluator.name)
                raise
        raise errors.NotFound(f"no evaluator has {request.image}: " + "; ".join(misses))
