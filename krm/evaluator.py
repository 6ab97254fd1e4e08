"""The Evaluator interface: one async method, `evaluate`, answering an Evaluation or raising a
`kruntimes.krm.errors.KrmError` (NotFound when it does not have the function, so a chain may try
the next).

Implementations: `kruntimes.krm.executable.ExecEvaluator` (a local binary named by a
FunctionConfig), `kruntimes.krm.pod.PodEvaluator` (phase 2; for now it always says NotFound),
`kruntimes.krm.multi.MultiEvaluator` (a chain of the others), and
`kruntimes.krm.client.RemoteEvaluator` (a running `krt fn-runner`).
"""

from __future__ import annotations

from typing import Protocol

from kruntimes.krm.evaluation import Evaluation, Request


class Evaluator(Protocol):
    name: str

    async def evaluate(self, request: Request) -> Evaluation:
        """Evaluate once; honours `request.deadline` and the caller's cancellation."""
        ...
