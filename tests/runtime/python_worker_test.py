"""The function process's result encoding: its fast path answers exactly what the API's checks do."""

from __future__ import annotations

import collections
import json
import math
from typing import Any

import pytest

from kruntimes.api import outputs as api_outputs
from kruntimes.runtime import framing
from kruntimes.runtime.adapters.python_worker import encode_result


def _reference(result: Any) -> tuple[int, bytes]:
    try:
        return framing.RESULT, api_outputs.encode_outputs(api_outputs.outputs_from_result(result))
    except (api_outputs.OutputsError, TypeError, ValueError) as exc:
        return framing.ERROR, json.dumps({"type": "InvalidOutput", "message": str(exc)[:4096]}).encode()


@pytest.mark.parametrize(
    "result",
    [
        {"n": 1},
        {"a-b.c_d": [1, {"x": None}]},
        [1, 2],
        "x",
        "é",
        3,
        1.5,
        True,
        None,
        {"a": "ü"},
        {1: 2},
        {"": 1},
        {"bad key": 1},
        {"é": 1},
        {"k" * 128: 1},
        {"k" * 129: 1},
        {f"k{i}": i for i in range(64)},
        {f"k{i}": i for i in range(65)},
        {"x": "y" * 70_000},
        {"x": "y" * 300_000},
        {"n": math.nan},
        {"a": object()},
        collections.OrderedDict(a=1),
    ],
)
def test_encode_result_matches_the_api(result: Any) -> None:
    assert encode_result(result) == _reference(result)
