from __future__ import annotations

import os.path

from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.api import (
    OutputsError,
    RunStatus,
    encode_outputs,
    validate_outputs,
    validate_relative_file_name,
)
from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES, MAX_STATUS_MESSAGE_BYTES

# No example database: tests must not write outside the tree they own.
checked = settings(database=None, max_examples=300, deadline=None)

path_text = st.text(alphabet=st.sampled_from(["a", "é", ".", "/", "\\", "\x00", "\n", " "]), max_size=12)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
output_keys = st.text(alphabet=st.sampled_from("ab_.-/ é"), min_size=0, max_size=6)


@checked
@given(path_text)
def test_an_accepted_file_name_never_escapes_the_root(name):
    try:
        validate_relative_file_name(name)
    except ValueError:
        return
    root = "/srv/root"
    joined = os.path.normpath(os.path.join(root, name))
    assert joined.startswith(root + "/")
    assert os.path.normpath(name) == name


@checked
@given(st.dictionaries(output_keys, json_values, max_size=6))
def test_outputs_that_validate_encode_within_the_total_bound_and_are_canonical(outputs):
    try:
        canonical = validate_outputs(outputs)
    except OutputsError as e:
        assert e.field.startswith("outputs")
        return
    encoded = encode_outputs(outputs)
    assert len(encoded) <= MAX_OUTPUTS_TOTAL_BYTES
    assert encode_outputs(canonical) == encoded
    assert validate_outputs(canonical) == canonical


@checked
@given(st.text(min_size=MAX_STATUS_MESSAGE_BYTES // 4 - 8, max_size=MAX_STATUS_MESSAGE_BYTES))
def test_status_messages_always_fit_and_truncation_is_idempotent(message):
    bounded = RunStatus(message=message).message
    assert len(bounded.encode()) <= MAX_STATUS_MESSAGE_BYTES
    assert RunStatus(message=bounded).message == bounded
