"""A task's input (spec.mode.task.input): any JSON value within the payload bound, and a manifest
without spec.mode is a function Run."""

from __future__ import annotations

import pytest

from kruntimes.api.limits import MAX_TASK_INPUT_BYTES
from kruntimes.api.run import ManifestError, Run
from kruntimes.api.spec import TaskMode, encode_input
from tests.sdk.stack import manifest


def _task(value: object) -> Run:
    return Run.from_dict(manifest("t", mode={"task": {"input": value}}))


@pytest.mark.parametrize("value", [None, 0, 1.5, "text", True, [1, None, "x"], {"nested": {"list": [1, 2]}}])
def test_any_json_value_is_an_input_and_the_handler_gets_it_as_compact_json(value: object) -> None:
    run = _task(value)
    assert run.spec.mode.task is not None and run.spec.mode.task.input == value
    assert run.spec.mode.task.encoded_input() == encode_input(value)


def test_no_input_is_null_and_is_left_out_of_the_manifest() -> None:
    run = Run.from_dict(manifest("t", mode={"task": {}}))
    assert run.spec.mode.task == TaskMode() and run.spec.mode.task.encoded_input() == b"null"
    assert run.model_dump(mode="json", exclude_none=True)["spec"]["mode"] == {"task": {}}


def test_an_input_is_bounded_by_its_compact_json_size() -> None:
    overhead = len(encode_input(""))  # the quotes
    _task("x" * (MAX_TASK_INPUT_BYTES - overhead))
    with pytest.raises(ManifestError) as refused:
        _task("x" * (MAX_TASK_INPUT_BYTES - overhead + 1))
    assert refused.value.problems == (
        f"spec.mode.task.input: {MAX_TASK_INPUT_BYTES + 1} bytes as JSON, at most {MAX_TASK_INPUT_BYTES}",
    )


def test_a_value_json_cannot_hold_is_refused() -> None:
    with pytest.raises(ManifestError) as refused:
        _task(float("nan"))
    assert refused.value.problems[0].startswith("spec.mode.task.input: not JSON: "), refused.value.problems


def test_a_manifest_without_spec_mode_is_a_function_run() -> None:
    document = manifest("f")
    del document["spec"]["mode"]
    run = Run.from_dict(document)
    assert run.spec.mode.kind == "function" and run.spec.mode.function is not None
    assert run == Run.from_dict(manifest("f", mode={"function": {}})), "the same Run as the flags make"


def test_a_yaml_error_names_the_line_and_column() -> None:
    with pytest.raises(ManifestError) as refused:
        Run.from_yaml("kind: Run\nspec: {mode: [task}\n", filename="run.yaml")
    assert refused.value.problems[0].startswith("run.yaml:2:19: not valid YAML: ")
