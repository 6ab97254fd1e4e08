"""Bounded outputs: a JSON object of at most MAX_OUTPUT_KEYS small JSON values.

Sizes are measured on the compact UTF-8 JSON that ``encode_outputs`` produces.
"""

from __future__ import annotations

import json
import re

from kruntimes.api.limits import (
    MAX_OUTPUT_KEY_BYTES,
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
)

RESULT_KEY = "result"
_KEY = re.compile(r"[A-Za-z0-9_.-]+")


class OutputsError(ValueError):
    """Outputs broke a rule. ``field`` is ``outputs`` or ``outputs.<key>``; ``reason`` is stable."""

    def __init__(self, *, field: str, reason: str, detail: str) -> None:
        super().__init__(f"{field}: {reason}: {detail}")
        self.field = field
        self.reason = reason


def outputs_from_result(value: object) -> dict[str, object]:
    """A handler's return value as outputs: a dict with str keys as is, anything else under "result"."""
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return dict(value)
    return {RESULT_KEY: value}


def _encode(value: object, *, field: str) -> bytes:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise OutputsError(field=field, reason="NotJSONSerializable", detail=str(e)) from e


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise OutputsError(field="outputs", reason="InvalidKey", detail=f"key {key!r:.80} is not a string")
    if len(key.encode("utf-8", "replace")) > MAX_OUTPUT_KEY_BYTES:
        raise OutputsError(
            field=f"outputs.{key:.80}",
            reason="KeyTooLong",
            detail=f"key exceeds {MAX_OUTPUT_KEY_BYTES} bytes",
        )
    if not _KEY.fullmatch(key):
        raise OutputsError(
            field=f"outputs.{key}", reason="InvalidKey", detail="key must match [A-Za-z0-9_.-]+"
        )
    return key


def _checked_json(outputs: object) -> bytes:
    if not isinstance(outputs, dict):
        raise OutputsError(
            field="outputs",
            reason="NotAnObject",
            detail=f"expected a JSON object, got {type(outputs).__name__}",
        )
    if len(outputs) > MAX_OUTPUT_KEYS:
        raise OutputsError(
            field="outputs", reason="TooManyKeys", detail=f"{len(outputs)} keys, at most {MAX_OUTPUT_KEYS}"
        )
    try:
        data = _encode(outputs, field="outputs")
    except OutputsError:
        data = None  # find the value at fault below, for an error that names it
    if data is not None and len(data) <= MAX_OUTPUT_VALUE_BYTES:
        for key in outputs:  # no single value can be over its bound: check the keys only
            _check_key(key)
        return data
    for key, value in outputs.items():
        field = f"outputs.{_check_key(key)}"
        size = len(_encode(value, field=field))
        if size > MAX_OUTPUT_VALUE_BYTES:
            raise OutputsError(
                field=field, reason="ValueTooLarge", detail=f"{size} bytes, at most {MAX_OUTPUT_VALUE_BYTES}"
            )
    if data is None:
        data = _encode(outputs, field="outputs")
    if len(data) > MAX_OUTPUTS_TOTAL_BYTES:
        raise OutputsError(
            field="outputs", reason="TooLarge", detail=f"{len(data)} bytes, at most {MAX_OUTPUTS_TOTAL_BYTES}"
        )
    return data


def validate_outputs(outputs: object) -> dict[str, object]:
    """Check every bound and return the canonical copy: the JSON decoding of ``encode_outputs``."""
    data = _checked_json(outputs)
    try:
        canonical: dict[str, object] = json.loads(data)
    except RecursionError as e:
        raise OutputsError(field="outputs", reason="NotJSONSerializable", detail="nested too deeply") from e
    return canonical


def encode_outputs(outputs: object) -> bytes:
    """Compact UTF-8 JSON of outputs, after every check of ``validate_outputs``."""
    return _checked_json(outputs)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def check_encoded(data: bytes) -> None:
    """Check outputs that arrive already encoded from an untrusted producer (a function process).

    Cheap when the document is small: no value can then exceed the per-value bound, so only the
    shape and the keys are checked.
    """
    if len(data) > MAX_OUTPUTS_TOTAL_BYTES:
        raise OutputsError(
            field="outputs", reason="TooLarge", detail=f"{len(data)} bytes, at most {MAX_OUTPUTS_TOTAL_BYTES}"
        )
    try:
        outputs = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise OutputsError(field="outputs", reason="NotJSONSerializable", detail=str(e)[:200]) from e
    if len(data) > MAX_OUTPUT_VALUE_BYTES or not isinstance(outputs, dict):
        _checked_json(outputs)
        return
    if len(outputs) > MAX_OUTPUT_KEYS:
        raise OutputsError(
            field="outputs", reason="TooManyKeys", detail=f"{len(outputs)} keys, at most {MAX_OUTPUT_KEYS}"
        )
    for key in outputs:
        _check_key(key)
