"""The exec evaluator: a function image served by a local binary, run as a direct process.

The FunctionConfig store maps the image (and its tag, by the rules of `kruntimes.krm.tags`) to a binary;
no mapping is NotFound. The binary is run by the evaluator's runner with the ResourceList on
stdin: in the function sandbox (own uid, PID and mount namespaces, no network, the platform's
state hidden: workers/fn_sandbox.py) where the process can make one, else `kruntimes.krm.process.run`.
Exit 0 with a ResourceList on stdout is the answer; a non-zero exit is FunctionFailed with the
results kept; exit 0 with anything else on stdout is InvalidOutput; a binary that cannot start is
a SystemError. At most `max_parallel` functions run at once and `max_waiting` more wait; past that
a request is ResourceExhausted at once.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

from kruntimes.krm import errors, process
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.limits import MAX_LOG_BYTES, MAX_RESOURCE_LIST_BYTES
from kruntimes.krm.resources import YamlError, output_results
from kruntimes.krm.store import Store

# where a function's author reads what the sandbox shows a function, and how to show it more
SANDBOX_DOCS = "docs/security.md, 'What a KRM function sees'"


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + signal number


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _hidden(outcome: process.Outcome) -> str:
    if not outcome.hidden:
        return ""
    return (
        f"; it names {', '.join(outcome.hidden)}, which its sandbox hides from it: a function sees "
        f"only what its command names (see {SANDBOX_DOCS})"
    )


def interpret(outcome: process.Outcome) -> Evaluation:
    """An Evaluation from what a function process did, or the ExecutionError it amounts to."""
    code = _exit_code(outcome.exit_code)
    bare = Evaluation(b"", outcome.stderr, outcome.stderr_truncated, (), code)
    try:
        results = output_results(outcome.stdout)
    except (YamlError, errors.TooManyResults) as e:
        if outcome.exit_code != 0:
            raise errors.FunctionFailed(
                f"the function {_describe_exit(outcome.exit_code)} (its output is not a ResourceList)"
                + _hidden(outcome),
                evaluation=bare,
            ) from e
        if isinstance(e, errors.TooManyResults):
            e.evaluation = bare
            raise
        raise errors.InvalidOutput(
            f"the function's output is not a ResourceList: {e}", evaluation=bare
        ) from e
    evaluation = Evaluation(outcome.stdout, outcome.stderr, outcome.stderr_truncated, results, code)
    if outcome.exit_code != 0:
        failed = [r.message for r in results if r.severity == "error"][:3]
        detail = f": {'; '.join(failed)}" if failed else ""
        raise errors.FunctionFailed(
            f"the function {_describe_exit(outcome.exit_code)}{detail}{_hidden(outcome)}",
            evaluation=evaluation,
        )
    return evaluation


class ExecEvaluator:
    name = "exec"

    def __init__(
        self,
        store: Store,
        *,
        limits: process.Limits | None = None,
        max_parallel: int = 8,
        max_waiting: int = 64,
        runner: process.Runner = process.run,
    ) -> None:
        self.store = store
        self.limits = limits or process.Limits()
        self.runner = runner
        self._slots = asyncio.Semaphore(max_parallel)
        self._admitted = 0
        self._bound = max_parallel + max_waiting

    async def evaluate(self, request: Request) -> Evaluation:
        binary = self.store.binary(request.image, request.tag)
        return await self.run([str(binary.path)], request)

    async def run(self, argv: Sequence[str], request: Request) -> Evaluation:
        """Run `argv` as the function for `request` (also `krt fn eval --exec`)."""
        if self._admitted >= self._bound:
            raise errors.ResourceExhausted(
                f"{self._bound} evaluations are running or waiting already; retry later"
            )
        self._admitted += 1
        try:
            async with asyncio.timeout(request.remaining()) as timer:
                await self._slots.acquire()
        except TimeoutError as e:
            self._admitted -= 1
            if timer.expired():
                raise errors.DeadlineExceeded("the deadline passed while waiting for a free slot") from e
            raise
        except BaseException:
            self._admitted -= 1
            raise
        try:
            outcome = await self.runner(
                argv,
                stdin=request.resource_list,
                deadline=request.deadline,
                limits=self.limits,
                max_stdout=MAX_RESOURCE_LIST_BYTES,
                max_stderr=MAX_LOG_BYTES,
            )
        finally:
            self._slots.release()
            self._admitted -= 1
        return interpret(outcome)
