"""The pod evaluator's slot in the chain. NOT IMPLEMENTED YET: it answers NotFound for every
image, so a chain falls through it to its final NotFound.

Phase 2 builds it on Runs of a `krm` runtime (one function-mode Run per image and version, up
to the FunctionConfig's `podExecutor.maxParallel`, with a waitlist, warming and the Run's idle
timeout as the cache TTL); that needs the Runtime Server's `krm` adapter, which does not exist yet.
"""

from __future__ import annotations

from krm import errors
from krm.evaluation import Evaluation, Request


class PodEvaluator:
    name = "pod"

    async def evaluate(self, request: Request) -> Evaluation:
        raise errors.NotFound(
            f"{request.image}: the pod evaluator is not available yet (it comes with the krm runtime)"
        )
