from __future__ import annotations

import pytest

from kruntimes.api import (
    validate_dns1123_label,
    validate_env_name,
    validate_handler,
    validate_invocation_id,
    validate_relative_file_name,
)
from kruntimes.api.limits import MAX_FILE_NAME_BYTES, MAX_HANDLER_BYTES, MAX_INVOCATION_ID_BYTES


@pytest.mark.parametrize("value", ["a", "0", "run-1", "a" * 63, "9lives"])
def test_dns1123_labels_are_accepted(value):
    assert validate_dns1123_label(value, field="metadata.name") == value


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "1..63"),
        ("a" * 64, "1..63"),
        ("Run", "lowercase"),
        ("-run", "starting and ending"),
        ("run-", "starting and ending"),
        ("run_1", "lowercase letters, digits and '-'"),
        ("run.1", "lowercase letters, digits and '-'"),
        ("run\n", "lowercase"),
    ],
)
def test_dns1123_label_errors_name_the_field_and_rule(value, says):
    with pytest.raises(ValueError, match="^spec.runtime: ") as info:
        validate_dns1123_label(value, field="spec.runtime")
    assert says in str(info.value)


@pytest.mark.parametrize("name", ["HOME", "_x", "a1", "krt_lower_is_not_reserved", "KRTX"])
def test_env_names_are_c_identifiers(name):
    assert validate_env_name(name) == name


@pytest.mark.parametrize("name", ["", "1A", "A-B", "A B", "É", "A=B"])
def test_env_name_must_be_a_c_identifier(name):
    with pytest.raises(ValueError, match=r"must match \[A-Za-z_\]"):
        validate_env_name(name)


def test_env_name_krt_prefix_is_reserved():
    with pytest.raises(ValueError, match="reserved prefix 'KRT_'"):
        validate_env_name("KRT_RUN_UID")


@pytest.mark.parametrize("name", ["a", "a/b.py", "dir/sub/run.sh", ".hidden", "a..b", "é.py"])
def test_relative_file_names_are_accepted(name):
    assert validate_relative_file_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "must not be empty"),
        ("/etc/passwd", "must be relative"),
        ("..", "'..' component"),
        ("a/../../b", "'..' component"),
        ("a//b", "normalised"),
        ("./a", "normalised"),
        ("a/.", "normalised"),
        ("a/", "normalised"),
        ("a\\b", "backslash"),
        ("a\x00b", "control characters"),
        ("a\nb", "control characters"),
        ("a\x7f", "control characters"),
        ("a\x85", "control characters"),
        ("x" * (MAX_FILE_NAME_BYTES + 1), f"exceeds {MAX_FILE_NAME_BYTES} bytes"),
        ("\ud800", "not valid UTF-8"),
    ],
)
def test_relative_file_name_errors_name_the_rule(name, says):
    with pytest.raises(ValueError, match="file name") as info:
        validate_relative_file_name(name)
    assert says in str(info.value)


def test_file_name_bound_is_per_component_in_bytes():
    assert validate_relative_file_name("/".join(["x" * MAX_FILE_NAME_BYTES] * 3))
    with pytest.raises(ValueError, match="exceeds"):
        validate_relative_file_name("é" * (MAX_FILE_NAME_BYTES // 2 + 1))


@pytest.mark.parametrize("handler", ["main:handle", "pkg.mod.sub:run", "_m:_f"])
def test_python_handlers_are_module_colon_function(handler):
    assert validate_handler("python", handler) == handler


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        ("main", "one ':'"),
        ("a:b:c", "one ':'"),
        (":handle", "not a dotted Python identifier"),
        ("pkg..mod:f", "not a dotted Python identifier"),
        ("1mod:f", "not a dotted Python identifier"),
        ("import:f", "not a dotted Python identifier"),
        ("my-mod:handle", "not a dotted Python identifier"),
        ("main:", "is not a Python identifier"),
        ("main:f()", "is not a Python identifier"),
        ("m:" + "f" * MAX_HANDLER_BYTES, f"exceeds {MAX_HANDLER_BYTES} bytes"),
    ],
)
def test_python_handler_errors_name_the_rule(handler, says):
    with pytest.raises(ValueError, match="handler") as info:
        validate_handler("python", handler)
    assert says in str(info.value)


@pytest.mark.parametrize("handler", ["run.sh", "bin/run", "scripts/deploy.sh"])
def test_bash_handlers_are_relative_script_paths(handler):
    assert validate_handler("bash", handler) == handler


@pytest.mark.parametrize(
    ("handler", "says"),
    [("/bin/sh", "must be relative"), ("../run.sh", "'..'"), ("bin/", "trailing '/'"), ("", "empty")],
)
def test_bash_handler_must_stay_inside_the_source_dir(handler, says):
    with pytest.raises(ValueError, match="^bash handler: ") as info:
        validate_handler("bash", handler)
    assert says in str(info.value)


def test_unknown_adapter_is_rejected():
    with pytest.raises(ValueError, match="unknown handler adapter 'ruby'"):
        validate_handler("ruby", "main.rb")


@pytest.mark.parametrize("value", ["a", "req-1", "x" * MAX_INVOCATION_ID_BYTES, "with space", "~!@#$%^&*()"])
def test_invocation_ids_are_bounded_printable_text(value):
    assert validate_invocation_id(value) == value


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "1..128 bytes"),
        ("x" * (MAX_INVOCATION_ID_BYTES + 1), "1..128 bytes"),
        ("ü" * 65, "got 130"),
        ("a\r\nb", "control characters"),
        ("a\x7f", "control characters"),
        ("a\x9b", "control characters"),
        ("ü" * 64, "printable ASCII"),
        ("inv\u202e1", "printable ASCII"),  # right-to-left override
        ("inv\u200b1", "printable ASCII"),  # zero-width space
        ("\uff49\uff4e\uff56", "printable ASCII"),  # fullwidth letters
    ],
)
def test_invocation_id_errors_name_the_rule(value, says):
    with pytest.raises(ValueError, match="invocation id") as info:
        validate_invocation_id(value)
    assert says in str(info.value)
