from __future__ import annotations

import pytest
from pydantic import ValidationError

from kruntimes.api import FunctionMode, Metadata, ModeSpec, RetryPolicy, RunSpec, SourceSpec
from kruntimes.api.limits import (
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    MAX_FUNCTION_CONCURRENCY,
    MAX_FUNCTION_QUEUE,
    MAX_HANDLER_BYTES,
    MAX_INLINE_FILES,
    MAX_INLINE_SOURCE_BYTES,
    MAX_INVOKE_TIMEOUT_SECONDS,
    MAX_RETRY_LIMIT,
    MAX_TIMEOUT_SECONDS,
    MAX_TTL_SECONDS_AFTER_FINISHED,
)

from .builders import RUN_UID, assert_invalid, make_spec, spec_data


def inline(*names: str, content: str = "x") -> dict[str, object]:
    return {"inline": [{"name": n, "content": content} for n in names]}


def test_metadata_defaults_to_the_default_namespace():
    meta = Metadata(name="echo")
    assert (meta.namespace, meta.uid, meta.labels) == ("default", None, {})


@pytest.mark.parametrize("field", ["name", "namespace"])
def test_metadata_names_are_dns1123_labels(field):
    data = {"name": "ok", field: "Not_OK"}
    assert_invalid(Metadata, data, loc=field, says=f"metadata.{field}: a DNS-1123 label")


def test_metadata_uid_is_a_canonical_uuid():
    assert Metadata(name="a", uid=RUN_UID).uid == RUN_UID
    for bad in ["u1", RUN_UID.upper(), RUN_UID.replace("-", "")]:
        assert_invalid(Metadata, {"name": "a", "uid": bad}, loc="uid", says="lowercase hyphenated UUID")


def test_mode_kind_names_the_one_mode_set():
    assert ModeSpec(function=FunctionMode()).kind == "function"
    assert ModeSpec.model_validate({"task": {}}).kind == "task"


@pytest.mark.parametrize("data", [{}, {"function": {}, "task": {}}, {"function": None, "task": None}])
def test_mode_needs_exactly_one_of_function_or_task(data):
    assert_invalid(ModeSpec, data, loc="", says="exactly one of 'function' or 'task'")


@pytest.mark.parametrize("value", [0, -1, MAX_TIMEOUT_SECONDS + 1, True, "30"])
def test_idle_timeout_is_a_positive_bounded_integer(value):
    assert_invalid(FunctionMode, {"idleTimeoutSeconds": value}, loc="idleTimeoutSeconds", says="")


def test_a_function_takes_one_invocation_at_a_time_and_queues_none_unless_told():
    mode = FunctionMode()
    assert (mode.concurrency, mode.queue, mode.queueTimeoutSeconds) == (None, None, None)
    told = FunctionMode(
        concurrency=MAX_FUNCTION_CONCURRENCY, queue=MAX_FUNCTION_QUEUE, queueTimeoutSeconds=0.5
    )
    assert (told.concurrency, told.queue, told.queue_timeout_seconds) == (1000, 10_000, 0.5)
    assert FunctionMode(queue=1).queue_timeout_seconds == 30.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", 0),
        ("concurrency", MAX_FUNCTION_CONCURRENCY + 1),
        ("concurrency", "8"),
        ("concurrency", True),
        ("queue", -1),
        ("queue", MAX_FUNCTION_QUEUE + 1),
        ("queue", 2.0),
        ("queueTimeoutSeconds", 0),
        ("queueTimeoutSeconds", MAX_INVOKE_TIMEOUT_SECONDS + 1),
        ("queueTimeoutSeconds", float("inf")),
    ],
)
def test_concurrency_and_queue_are_bounded(field, value):
    assert_invalid(FunctionMode, {"queue": 1, field: value}, loc=field, says="")


def test_a_queue_timeout_without_a_queue_is_refused_by_name():
    assert_invalid(FunctionMode, {"queueTimeoutSeconds": 5}, loc="", says="queueTimeoutSeconds needs a queue")


def test_unknown_fields_are_rejected():
    assert_invalid(ModeSpec, {"function": {"idle": 3}}, loc="function.idle", says="Extra inputs")


@pytest.mark.parametrize("data", [{}, {"path": "/src", **inline("a.py")}])
def test_source_needs_exactly_one_of_path_or_inline(data):
    assert_invalid(SourceSpec, data, loc="", says="exactly one of 'path' or 'inline'")


@pytest.mark.parametrize("path", ["", "/src\x00/x"])
def test_source_path_is_non_empty_without_nul(path):
    assert_invalid(SourceSpec, {"path": path}, loc="path", says="non-empty and must not contain NUL")


def test_source_path_is_kept_as_given_for_the_caller_to_resolve():
    assert SourceSpec(path="./fn").path == "./fn"


def test_inline_file_names_are_validated():
    assert_invalid(SourceSpec, inline("../a.py"), loc="inline.0.name", says="'..' component")


def test_inline_files_are_bounded_in_count():
    assert SourceSpec.model_validate(inline(*(f"f{i}" for i in range(MAX_INLINE_FILES))))
    too_many = inline(*(f"f{i}" for i in range(MAX_INLINE_FILES + 1)))
    assert_invalid(SourceSpec, too_many, loc="inline", says=f"1..{MAX_INLINE_FILES} files")
    assert_invalid(SourceSpec, {"inline": []}, loc="inline", says=f"1..{MAX_INLINE_FILES} files")


def test_inline_file_names_are_unique():
    assert_invalid(SourceSpec, inline("a.py", "a.py"), loc="inline", says="must be unique")


def test_an_inline_file_cannot_also_be_a_directory():
    assert_invalid(SourceSpec, inline("lib", "lib/x.py"), loc="inline", says="lies under another file")


def test_inline_contents_are_bounded_in_total_utf8_bytes():
    half = MAX_INLINE_SOURCE_BYTES // 2
    assert SourceSpec.model_validate(inline("a", "b", content="x" * half))
    over = inline("a", "b", content="é" * (half // 2 + 1))
    assert_invalid(SourceSpec, over, loc="inline", says=f"at most {MAX_INLINE_SOURCE_BYTES}")


def test_retry_policy_defaults():
    policy = RetryPolicy()
    assert (policy.limit, policy.backoffSeconds, policy.backoffMultiplier, policy.maxBackoffSeconds) == (
        3,
        1.0,
        2.0,
        60.0,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("limit", 0),
        ("limit", MAX_RETRY_LIMIT + 1),
        ("limit", True),
        ("backoffSeconds", -0.1),
        ("backoffSeconds", 3601),
        ("backoffSeconds", float("nan")),
        ("backoffMultiplier", 0.5),
        ("backoffMultiplier", 11),
        ("maxBackoffSeconds", float("inf")),
    ],
)
def test_retry_policy_fields_are_bounded(field, value):
    assert_invalid(RetryPolicy, {field: value}, loc=field, says="")


def test_max_backoff_covers_the_initial_backoff():
    assert_invalid(
        RetryPolicy,
        {"backoffSeconds": 10, "maxBackoffSeconds": 5},
        loc="",
        says="maxBackoffSeconds must be >=",
    )


def test_a_minimal_spec_takes_the_defaults():
    spec = make_spec()
    assert spec.env == {}
    assert spec.retryPolicy == RetryPolicy()
    assert (spec.timeoutSeconds, spec.ttlSecondsAfterFinished, spec.tenant) == (None, None, None)


@pytest.mark.parametrize("field", ["runtime", "tenant"])
def test_runtime_and_tenant_are_dns1123_labels(field):
    assert_invalid(RunSpec, spec_data(**{field: "Py"}), loc=field, says=f"spec.{field}: a DNS-1123 label")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeoutSeconds", 0),
        ("timeoutSeconds", MAX_TIMEOUT_SECONDS + 1),
        ("ttlSecondsAfterFinished", -1),
        ("ttlSecondsAfterFinished", MAX_TTL_SECONDS_AFTER_FINISHED + 1),
    ],
)
def test_spec_durations_are_bounded(field, value):
    assert_invalid(RunSpec, spec_data(**{field: value}), loc=field, says="")


def test_env_names_are_validated():
    assert_invalid(RunSpec, spec_data(env={"KRT_X": "1"}), loc="env", says="reserved prefix")
    assert_invalid(RunSpec, spec_data(env={"A-B": "1"}), loc="env", says="must match")


def test_env_count_is_bounded():
    env = {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}
    assert_invalid(RunSpec, spec_data(env=env), loc="env", says=f"at most {MAX_ENV_VARS}")


def test_env_value_size_is_bounded():
    assert make_spec(env={"V": "x" * MAX_ENV_VALUE_BYTES})
    big = {"V": "x" * (MAX_ENV_VALUE_BYTES + 1)}
    assert_invalid(RunSpec, spec_data(env=big), loc="env", says=f"env.V: value exceeds {MAX_ENV_VALUE_BYTES}")


def test_env_values_cannot_hold_nul():
    assert_invalid(
        RunSpec, spec_data(env={"V": "a\x00"}), loc="env", says="env.V: value must not contain NUL"
    )


def test_python_runtime_handlers_are_checked_at_parse_time():
    assert_invalid(RunSpec, spec_data(handler="main"), loc="", says="spec.handler: python handler 'main'")


def test_bash_runtime_handlers_are_checked_at_parse_time():
    assert make_spec(runtime="bash", handler="bin/run.sh").handler == "bin/run.sh"
    assert_invalid(RunSpec, spec_data(runtime="bash", handler="/bin/sh"), loc="", says="must be relative")


def test_other_runtimes_defer_the_handler_check_to_their_adapter():
    spec = make_spec(runtime="python-ml", handler="anything goes here")
    with pytest.raises(ValueError, match="spec.handler: python handler"):
        spec.validate_handler_for("python")
    assert make_spec(runtime="python-ml").validate_handler_for("python").handler == "main:handle"


@pytest.mark.parametrize(("handler", "says"), [("", "1..256 bytes"), ("a\nb", "control characters")])
def test_every_handler_is_bounded_printable_text(handler, says):
    assert_invalid(RunSpec, spec_data(runtime="custom", handler=handler), loc="handler", says=says)


def test_handler_length_is_bounded_for_every_runtime():
    long = "m:" + "f" * MAX_HANDLER_BYTES
    assert_invalid(RunSpec, spec_data(runtime="custom", handler=long), loc="handler", says="1..256 bytes")


def test_spec_is_immutable():
    spec = make_spec()
    with pytest.raises(ValidationError, match="frozen"):
        spec.handler = "other:fn"  # type: ignore[misc]
