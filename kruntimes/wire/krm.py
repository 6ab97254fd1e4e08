"""The `krm` adapter's invocation contract, shared by the Runtime Server (kruntimes.runtime.adapters.krm) and
the pod evaluator (kruntimes.krm.pod): what a KRM function's invocation carries in and what it answers.

Request payload (JSON):   {"resourceList": "<the ResourceList as YAML text>"}
Outputs (a bounded outputs object, kruntimes.api.outputs):
    exitCode              the function's exit code (128 + N when killed by signal N)
    stdoutBytes           how many bytes it wrote to stdout
    resourceList.0 ...    its stdout, as text, cut into pieces that each fit one output value
    outputTooLarge        true (and no pieces) when its stdout does not fit the outputs bounds

The function's stderr is the invocation's captured `stderr`, as for any function. A non-zero
exit is an answer (Succeeded, with its exitCode), not a handler error: the caller decides.
"""

from __future__ import annotations

import json
from typing import Any

from kruntimes.api.limits import (
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
    MAX_PAYLOAD_BYTES,
)

REQUEST_KEY = "resourceList"
EXIT_CODE = "exitCode"
STDOUT_BYTES = "stdoutBytes"
TOO_LARGE = "outputTooLarge"
PIECE_PREFIX = "resourceList."

# Room kept in the outputs object for the keys other than the pieces and the JSON punctuation.
_RESERVED_BYTES = 1024
MAX_PIECES = MAX_OUTPUT_KEYS - 4
# What stdout may hold at most and still fit (each byte is at least one byte of JSON).
MAX_STDOUT_BYTES = MAX_OUTPUTS_TOTAL_BYTES - _RESERVED_BYTES
_PIECE_CHARS = 32 * 1024


class ContractError(ValueError):
    """A payload or an outputs object is not what this contract says."""


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def encode_request(resource_list: bytes) -> bytes:
    """The invocation payload for `resource_list`; ContractError when it is not UTF-8 text or
    the payload would be over the invoke API's bound."""
    try:
        text = resource_list.decode()
    except UnicodeDecodeError as e:
        raise ContractError(f"the ResourceList is not UTF-8 text: {e.reason} at byte {e.start}") from e
    payload = _json({REQUEST_KEY: text})
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ContractError(
            f"the ResourceList is {len(payload)} bytes as an invocation payload, over the invoke "
            f"API's bound of {MAX_PAYLOAD_BYTES}"
        )
    return payload


def decode_request(payload: bytes) -> bytes:
    """The ResourceList bytes of an invocation payload; ContractError when it is not one."""
    try:
        value = json.loads(payload) if payload else None
    except ValueError as e:
        raise ContractError(f"the payload is not JSON: {e}") from e
    if not isinstance(value, dict) or not isinstance(value.get(REQUEST_KEY), str):
        raise ContractError(f'the payload must be a JSON object {{"{REQUEST_KEY}": "<YAML text>"}}')
    return str(value[REQUEST_KEY]).encode()


def _pieces(text: str) -> list[str] | None:
    """`text` cut into pieces whose JSON strings each fit one output value, all of them together
    within the outputs bound; None when they cannot."""
    pieces: list[str] = []
    total = 0
    start = 0
    while start < len(text):
        size = _PIECE_CHARS
        while True:
            piece = text[start : start + size]
            encoded = len(_json(piece))
            if encoded <= MAX_OUTPUT_VALUE_BYTES - 64 or size == 1:
                break
            size //= 2
        pieces.append(piece)
        total += encoded + len(PIECE_PREFIX) + 8
        if len(pieces) > MAX_PIECES or total > MAX_STDOUT_BYTES:
            return None
        start += size
    return pieces


def encode_outputs(*, exit_code: int, stdout: bytes, stdout_bytes: int) -> bytes:
    """The outputs object (compact JSON) of a finished function; `stdout` is what was kept of
    the `stdout_bytes` it wrote."""
    outputs: dict[str, Any] = {EXIT_CODE: exit_code, STDOUT_BYTES: stdout_bytes}
    pieces = None
    if stdout_bytes <= len(stdout):
        pieces = _pieces(stdout.decode(errors="replace"))
    if pieces is None:
        outputs[TOO_LARGE] = True
    else:
        for index, piece in enumerate(pieces):
            outputs[f"{PIECE_PREFIX}{index}"] = piece
    return _json(outputs)


def decode_outputs(outputs: Any) -> tuple[int, bytes | None, int]:
    """(exit code, stdout or None when it did not fit, bytes written) of an outputs object."""
    if not isinstance(outputs, dict):
        raise ContractError("the outputs are not a JSON object")
    exit_code, written = outputs.get(EXIT_CODE), outputs.get(STDOUT_BYTES)
    if type(exit_code) is not int or type(written) is not int:
        raise ContractError(f"the outputs have no integer {EXIT_CODE} and {STDOUT_BYTES}")
    if outputs.get(TOO_LARGE) is True:
        return exit_code, None, written
    parts = []
    for index in range(len(outputs)):
        piece = outputs.get(f"{PIECE_PREFIX}{index}")
        if piece is None:
            break
        if not isinstance(piece, str):
            raise ContractError(f"{PIECE_PREFIX}{index} is not a string")
        parts.append(piece)
    return exit_code, "".join(parts).encode(), written
