"""The server's check of a function process's encoded outputs: its fast path agrees with the API."""

from __future__ import annotations

import pytest

from kruntimes.api import outputs as api_outputs
from kruntimes.runtime.outcome import Outcome, Status
from kruntimes.runtime.results import check_outputs


@pytest.mark.parametrize(
    "data",
    [
        b'{"n":1}',
        b"{}",
        b'{"a-b.c_d":{"x":[1,null]}}',
        b'{"a":1,"a":2}',
        b"[1]",
        b'"x"',
        b"null",
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'\xef\xbb\xbf{"a":1}',
        b'{"bad key":1}',
        b'{"' + b"k" * 128 + b'":1}',
        b'{"' + b"k" * 129 + b'":1}',
        b'{"\xc3\xa9":1}',
        b'{"a":1',
        b"\xff",
        '{"a":1}'.encode("utf-16"),
        b'{"x":"' + b"y" * 70_000 + b'"}',
        b'{"x":"' + b"y" * 300_000 + b'"}',
        b"{" + b",".join(b'"k%d":1' % i for i in range(65)) + b"}",
    ],
)
def test_check_outputs_agrees_with_the_api(data: bytes) -> None:
    outcome = Outcome(Status.SUCCEEDED, outputs_json=data)
    check_outputs(outcome)
    try:
        api_outputs.check_encoded(data)
    except api_outputs.OutputsError as exc:
        assert (outcome.status, outcome.outputs_json, outcome.error_message) == (
            Status.INVALID_OUTPUT,
            b"",
            str(exc),
        )
    else:
        assert (outcome.status, outcome.outputs_json) == (Status.SUCCEEDED, data)
