"""Outputs of a finished exchange, checked by the server against the bounds."""

from __future__ import annotations

import json

from kruntimes.api import outputs as api_outputs
from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES
from runtime.process import Outcome, Status


def check_outputs(outcome: Outcome) -> None:
    """The server does not trust the function process to have bounded its outputs."""
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
