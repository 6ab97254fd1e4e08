"""The multi evaluator: exec then the next, falling back on NotFound only."""

from __future__ import annotations

from pathlib import Path

import pytest

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from tests.krm.conftest import request, store_with


class Second:
    """The evaluator after exec: answers every request and counts them."""

    name = "second"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def evaluate(self, request: Request) -> Evaluation:
        self.calls.append(request.image)
        return Evaluation(
            resource_list=b"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n"
        )


async def test_exec_answers_first_when_it_has_the_function(functions: Path) -> None:
    second = Second()
    chain = MultiEvaluator([ExecEvaluator(store_with(functions, "set-labels")), second])
    evaluation = await chain.evaluate(request("example.com/fn/set-labels:v1.0.0"))
    assert b"ConfigMap" in evaluation.resource_list
    assert second.calls == []


async def test_not_found_falls_back_to_the_next_evaluator(functions: Path) -> None:
    second = Second()
    chain = MultiEvaluator([ExecEvaluator(store_with(functions, "set-labels")), second])
    await chain.evaluate(request("example.com/fn/set-labels:v9.0.0"))
    assert second.calls == ["example.com/fn/set-labels:v9.0.0"]


@pytest.mark.parametrize(
    ("binary", "error"),
    [("exit-1", errors.FunctionFailed), ("garbage", errors.InvalidOutput), ("missing", errors.SystemError_)],
)
async def test_any_other_error_returns_at_once_with_the_evaluators_context(
    functions: Path, binary, error
) -> None:
    second = Second()
    chain = MultiEvaluator([ExecEvaluator(store_with(functions, binary)), second])
    with pytest.raises(error) as caught:
        await chain.evaluate(request(f"example.com/fn/{binary}:v1.0.0"))
    assert caught.value.evaluator == "exec"
    assert "exec evaluator: " in str(caught.value)
    assert second.calls == []


async def test_a_deadline_in_exec_does_not_fall_back(functions: Path) -> None:
    second = Second()
    chain = MultiEvaluator([ExecEvaluator(store_with(functions, "sleeper")), second])
    with pytest.raises(errors.DeadlineExceeded):
        await chain.evaluate(request("example.com/fn/sleeper:v1.0.0", timeout=0.5))
    assert second.calls == []


async def test_not_found_from_every_evaluator_is_the_final_answer(functions: Path) -> None:
    store = store_with(functions)
    chain = MultiEvaluator([ExecEvaluator(store), PodEvaluator(store, client=None)])
    with pytest.raises(errors.NotFound) as caught:
        await chain.evaluate(request("example.com/fn/set-labels:v1.0.0"))
    assert "exec: " in str(caught.value) and "pod: " in str(caught.value)


async def test_the_pod_evaluator_without_a_platform_says_not_found(functions: Path) -> None:
    with pytest.raises(errors.NotFound, match="no platform"):
        await PodEvaluator(store_with(functions), client=None).evaluate(request())
