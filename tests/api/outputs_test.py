from __future__ import annotations

import json

import pytest

from kruntimes.api import OutputsError, encode_outputs, outputs_from_result, validate_outputs
from kruntimes.api.limits import (
    MAX_OUTPUT_KEY_BYTES,
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
)


def test_a_dict_with_string_keys_is_the_outputs_itself():
    result = {"a": 1, "b": [2]}
    assert outputs_from_result(result) == result
    assert outputs_from_result(result) is not result


@pytest.mark.parametrize("value", [None, 3, "text", [1, 2], {1: "a"}, {"a": 1, 2: "b"}])
def test_any_other_result_is_wrapped_under_result(value):
    assert outputs_from_result(value) == {"result": value}


def test_outputs_encode_as_compact_utf8_json():
    assert encode_outputs({"a": [1, 2], "b": "é"}) == '{"a":[1,2],"b":"é"}'.encode()


def test_validation_returns_the_canonical_json_form():
    assert validate_outputs({"t": (1, 2), "n": {"k": None}}) == {"t": [1, 2], "n": {"k": None}}


def test_empty_outputs_are_valid():
    assert validate_outputs({}) == {}
    assert encode_outputs({}) == b"{}"


def _error(outputs: object) -> OutputsError:
    with pytest.raises(OutputsError) as info:
        validate_outputs(outputs)
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize("outputs", [[1], "x", None, 3])
def test_outputs_must_be_an_object(outputs):
    error = _error(outputs)
    assert (error.field, error.reason) == ("outputs", "NotAnObject")


def test_key_count_is_bounded():
    assert validate_outputs({f"k{i}": i for i in range(MAX_OUTPUT_KEYS)})
    error = _error({f"k{i}": i for i in range(MAX_OUTPUT_KEYS + 1)})
    assert (error.field, error.reason) == ("outputs", "TooManyKeys")
    assert str(MAX_OUTPUT_KEYS) in str(error)


def test_key_length_is_bounded():
    assert validate_outputs({"k" * MAX_OUTPUT_KEY_BYTES: 1})
    error = _error({"k" * (MAX_OUTPUT_KEY_BYTES + 1): 1})
    assert error.reason == "KeyTooLong"
    assert error.field.startswith("outputs.kkk")
    assert str(MAX_OUTPUT_KEY_BYTES) in str(error)


@pytest.mark.parametrize("key", ["", "a b", "a/b", "é", "a:b"])
def test_key_charset_is_restricted(key):
    error = _error({key: 1})
    assert (error.field, error.reason) == (f"outputs.{key}", "InvalidKey")


def test_non_string_key_is_rejected():
    error = _error({1: "a"})
    assert (error.field, error.reason) == ("outputs", "InvalidKey")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object(), {1, 2}, b"bytes", "\ud800"])
def test_values_must_be_json_serializable(value):
    error = _error({"bad": value})
    assert (error.field, error.reason) == ("outputs.bad", "NotJSONSerializable")


def test_circular_values_are_rejected():
    loop: list[object] = []
    loop.append(loop)
    assert _error({"loop": loop}).reason == "NotJSONSerializable"


def test_one_value_size_is_bounded_by_its_json_encoding():
    fits = "x" * (MAX_OUTPUT_VALUE_BYTES - 2)  # the quotes count
    assert validate_outputs({"v": fits})
    error = _error({"big": fits + "x"})
    assert (error.field, error.reason) == ("outputs.big", "ValueTooLarge")
    assert str(MAX_OUTPUT_VALUE_BYTES) in str(error)


def test_total_size_is_bounded():
    value = "x" * (MAX_OUTPUT_VALUE_BYTES - 2)
    count = MAX_OUTPUTS_TOTAL_BYTES // MAX_OUTPUT_VALUE_BYTES
    error = _error({f"k{i}": value for i in range(count)})
    assert (error.field, error.reason) == ("outputs", "TooLarge")
    assert str(MAX_OUTPUTS_TOTAL_BYTES) in str(error)


def test_encoding_fails_the_same_way_as_validation():
    with pytest.raises(OutputsError, match="outputs.x: NotJSONSerializable"):
        encode_outputs({"x": float("nan")})


def test_encoded_outputs_decode_to_the_validated_outputs():
    outputs = {"a": {"b": [1, 2.5, None, True]}, "c": "ü"}
    assert json.loads(encode_outputs(outputs)) == validate_outputs(outputs) == outputs
