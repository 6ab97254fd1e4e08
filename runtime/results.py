"""Outputs of a finished exchange, checked by the server against the bounds."""

from __future__ import annotations

import json
import re

from kruntimes.api import outputs as api_outputs
from kruntimes.api.limits import (
    MAX_OUTPUT_KEY_BYTES,
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
)
from kruntimes.runtime.outcome import Outcome, Status


def _reject_constant(name: str) -> object:
    raise ValueError(name)


# The common answer (a small object with plain keys) is accepted here with a decoder built once;
# anything else gets `api_outputs.check_encoded`'s verdict (and its wording).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_PLAIN_KEY = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_OUTPUT_KEY_BYTES}}}")  # within the API's key rule


def _plainly_valid(data: bytes) -> bool:
    if len(data) > MAX_OUTPUT_VALUE_BYTES:
        return False
    try:
        text = data.decode()
        outputs, end = _DECODER.raw_decode(text)  # a compact document: no whitespace around it
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    if end != len(text) or type(outputs) is not dict or len(outputs) > MAX_OUTPUT_KEYS:
        return False
    fullmatch = _PLAIN_KEY.fullmatch
    return all(fullmatch(key) for key in outputs)


def check_outputs(outcome: Outcome) -> None:
    """The server does not trust the function process to have bounded its outputs."""
    if _plainly_valid(outcome.outputs_json):
        return
    try:
        api_outputs.check_encoded(outcome.outputs_json)
    except api_outputs.OutputsError as exc:
        outcome.status, outcome.error_type, outcome.error_message = (
            Status.INVALID_OUTPUT,
            "InvalidOutput",
            str(exc),
        )
        outcome.outputs_json = b""


def parse_script_outputs(outcome: Outcome) -> None:
    """A script's stdout is its outputs: empty → {}, a JSON object as is, other JSON under "result"."""
    data = outcome.stdout.data.strip()
    if outcome.stdout.truncated:
        outcome.status, outcome.error_type = Status.INVALID_OUTPUT, "OutputsTooLarge"
        outcome.error_message = f"stdout is larger than {MAX_OUTPUTS_TOTAL_BYTES} bytes"
        return
    try:
        value = json.loads(data) if data else {}
        outputs = api_outputs.validate_outputs(api_outputs.outputs_from_result(value))
        outcome.outputs_json = api_outputs.encode_outputs(outputs)
    except (ValueError, api_outputs.OutputsError) as exc:
        outcome.status, outcome.error_type = Status.INVALID_OUTPUT, "InvalidOutput"
        outcome.error_message = f"stdout is not a bounded JSON document: {exc}"[:1024]
