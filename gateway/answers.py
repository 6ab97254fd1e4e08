"""The answer to an invocation that ran, rebuilt by the gateway from the owner's
InvokeFunctionResponse in the gateway's own schema (bodies.InvokeAnswer). Nothing the owner sends
reaches the caller as JSON structure: every field is decoded, checked, bounded and encoded again.

The owner's answer is untrusted input (a host, or whoever answers at its address):

    status         Succeeded, HandlerError, InvalidOutput: 200; TimedOut: 504 InvocationTimeout;
                   ProcessExited: 502 FunctionProcessExited; anything else: MalformedOwnerAnswer
    invocation id  the gateway's own; an answer naming another invocation: MalformedOwnerAnswer
    outputs        Succeeded: UTF-8 JSON text of one object under the outputs rules of
                   kruntimes.api.outputs (at most MAX_OUTPUTS_TOTAL_BYTES as sent, MAX_OUTPUT_KEYS
                   keys matching [A-Za-z0-9_.-] of at most MAX_OUTPUT_KEY_BYTES, each value at most
                   MAX_OUTPUT_VALUE_BYTES of compact JSON, no NaN or Infinity, no lone surrogate,
                   nothing before or after the object), decoded and encoded again; anything else is
                   MalformedOwnerAnswer. HandlerError and InvalidOutput: null, whatever was sent.
    stdout, stderr the first MAX_LOG_BYTES bytes, decoded as UTF-8 (undecodable bytes replaced);
                   `truncated` when the owner says so or more was written than is kept;
                   `totalBytes` at least what is kept and at most 2**53 - 1 (exact in any JSON reader)
    error          HandlerError and InvalidOutput only: the type when it is a token
                   ([A-Za-z][A-Za-z0-9_.-]*, at most MAX_INVOCATION_ERROR_TYPE_BYTES), else the
                   status; the message cut to MAX_INVOCATION_ERROR_MESSAGE_BYTES of UTF-8
    durationMs     the owner's duration in milliseconds

The body is made of the gateway's own encoding of each checked field, joined in the model's
order: the common answer (a small object with plain keys, nothing captured) costs one decode and
one encode of the outputs, and constants for the rest.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kruntimes.api._text import truncate_utf8
from kruntimes.api.limits import (
    MAX_INVOCATION_ERROR_MESSAGE_BYTES,
    MAX_INVOCATION_ERROR_TYPE_BYTES,
    MAX_LOG_BYTES,
    MAX_OUTPUT_KEY_BYTES,
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
)
from kruntimes.api.outputs import OutputsError, validate_outputs
from kruntimes.gateway.errors import UpstreamFailed, UpstreamTimeout
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire.reasons import GatewayReason as R

# the bodies.InvocationStatus of each outcome answered with 200
SUCCESS_STATUS = {
    pb.INVOCATION_STATUS_SUCCEEDED: "Succeeded",
    pb.INVOCATION_STATUS_HANDLER_ERROR: "HandlerError",
    pb.INVOCATION_STATUS_INVALID_OUTPUT: "InvalidOutput",
}
MAX_SAFE_INTEGER = 2**53 - 1
_NOTHING_CAPTURED = b'{"data":"","truncated":false,"totalBytes":0}'
# `"status":"…","outputs":` of each status
_STATUS = {status: f',"status":"{status}","outputs":'.encode() for status in SUCCESS_STATUS.values()}
# a key every outputs key rule accepts (ASCII, so its length in characters is its length in bytes)
_PLAIN_KEY = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_OUTPUT_KEY_BYTES}}}")
_ERROR_TYPE = re.compile(rf"[A-Za-z][A-Za-z0-9_.-]{{0,{MAX_INVOCATION_ERROR_TYPE_BYTES - 1}}}")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# (what it encodes comes from the JSON decoder or the gateway itself: never circular)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=False)


class MalformedAnswer(ValueError):
    """Which rule the owner's answer breaks, in the gateway's words: it never quotes the answer."""


def malformed(detail: str) -> UpstreamFailed:
    return UpstreamFailed(
        f"the owner's answer was malformed ({detail}); the function may have run",
        reason=R.MALFORMED_OWNER_ANSWER,
    )


def parse_outputs(data: bytes) -> dict[str, Any]:
    """The owner's outputs as a new object, or MalformedAnswer saying which rule they break."""
    if len(data) > MAX_OUTPUTS_TOTAL_BYTES:
        raise MalformedAnswer(f"outputs are over {MAX_OUTPUTS_TOTAL_BYTES} bytes")
    try:
        outputs = _DECODER.decode(data.decode("utf-8"))  # extra data after the object fails here
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise MalformedAnswer("outputs are not UTF-8 JSON text of one value") from None
    if type(outputs) is not dict:
        raise MalformedAnswer("outputs are not a JSON object")
    if len(outputs) > MAX_OUTPUT_KEYS:
        raise MalformedAnswer(f"outputs have more than {MAX_OUTPUT_KEYS} keys")
    fullmatch = _PLAIN_KEY.fullmatch
    if len(data) <= MAX_OUTPUT_VALUE_BYTES and all(fullmatch(key) for key in outputs):
        return outputs  # no value can be over its bound in a document this small
    try:
        return validate_outputs(outputs)  # the values' sizes, and the key rule's own verdict
    except OutputsError as exc:
        raise MalformedAnswer(f"outputs break the rule {exc.reason}") from None


def _captured(out: pb.CapturedOutput) -> bytes:
    data = out.data
    if not data and not out.total_bytes and not out.truncated:
        return _NOTHING_CAPTURED
    kept = data[:MAX_LOG_BYTES]
    total = min(max(out.total_bytes, len(data)), MAX_SAFE_INTEGER)
    captured = {
        "data": kept.decode("utf-8", "replace"),
        "truncated": out.truncated or total > len(kept),
        "totalBytes": total,
    }
    return _encode(captured)


def _error(answer: pb.InvokeFunctionResponse, status: str) -> bytes:
    kind, message = (answer.error.type, answer.error.message) if answer.HasField("error") else (status, "")
    if not _ERROR_TYPE.fullmatch(kind):
        kind = status
    message = truncate_utf8(message, max_bytes=MAX_INVOCATION_ERROR_MESSAGE_BYTES)
    return _encode({"type": kind, "message": message})


def _encode(value: object) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


def _outputs(answer: pb.InvokeFunctionResponse) -> bytes:
    try:
        return _encode(parse_outputs(answer.outputs_json))
    except MalformedAnswer as exc:
        raise malformed(str(exc)) from None
    except (UnicodeEncodeError, RecursionError):  # a lone surrogate, or deeper than the encoder goes
        raise malformed("outputs that are not encodable JSON") from None


def answer_body(answer: pb.InvokeFunctionResponse, invocation_id: str) -> bytes:
    """The 200 body (bodies.InvokeAnswer's JSON) for `answer`, or the error it is answered with.

    Made of the gateway's own encodings of each checked field, in the model's order.
    """
    status = SUCCESS_STATUS.get(answer.status)
    if status is None:
        if answer.status == pb.INVOCATION_STATUS_TIMED_OUT:
            raise UpstreamTimeout(
                "the function did not finish within its timeout", reason=R.INVOCATION_TIMEOUT
            )
        if answer.status == pb.INVOCATION_STATUS_PROCESS_EXITED:
            raise UpstreamFailed(
                "the function process exited during the invocation", reason=R.FUNCTION_PROCESS_EXITED
            )
        raise malformed("an unknown status")
    if answer.invocation_id != invocation_id:
        raise malformed("another invocation's id")
    succeeded = answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    parts = [
        b'{"invocationId":',
        _encode(invocation_id),
        _STATUS[status],
        _outputs(answer) if succeeded else b"null",
        b',"stdout":',
        _captured(answer.stdout),
        b',"stderr":',
        _captured(answer.stderr),
        b',"durationMs":',
        repr(round(answer.duration_us / 1000, 3)).encode(),  # a finite float: JSON's spelling
    ]
    if not succeeded:
        parts += [b',"error":', _error(answer, status)]
    parts.append(b"}")
    return b"".join(parts)


__all__ = ["SUCCESS_STATUS", "MalformedAnswer", "answer_body", "parse_outputs"]
