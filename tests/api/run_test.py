from __future__ import annotations

import textwrap

import pytest
from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter

from kruntimes.api import ManifestError, Run, RunPhase, RunSpec, RunStatus

from .builders import RUN_UID, T0, full_run, make_spec

FUNCTION_MANIFEST = textwrap.dedent(
    f"""\
    apiVersion: kruntimes.io/v1alpha1
    kind: Run
    metadata:
      name: echo
      namespace: kruntimes-demo
      uid: {RUN_UID}
    spec:
      runtime: python
      mode:
        function:
          idleTimeoutSeconds: 600
      source:
        inline:
          - name: main.py
            content: |
              def handle(request):
                  return request
      handler: main:handle
      env:
        GREETING: hello
      timeoutSeconds: 86400
      retryPolicy:
        limit: 2
    status:
      phase: Ready
      assignedHost: host-1
      assignedHostUID: 7f587b4668
      endpoint:
        protocol: HTTPS
        url: https://gateway.local/v1/namespaces/kruntimes-demo/runtimes/python/functions/{RUN_UID}:invoke
      conditions:
        - type: Ready
          status: "True"
          reason: FunctionRegistered
          lastTransitionTime: 2025-01-02T03:04:05Z
    """
)

TASK_MANIFEST = """\
apiVersion: kruntimes.io/v1alpha1
kind: Run
metadata: {name: nightly}
spec:
  runtime: bash
  mode: {task: {}}
  source: {path: /srv/jobs/nightly}
  handler: run.sh
"""


def roundtrip_converter(value: BaseModel) -> object:
    converter = pydantic_data_converter.payload_converter
    payloads = converter.to_payloads([value])
    (decoded,) = converter.from_payloads(payloads, [type(value)])
    return decoded


def test_a_function_manifest_parses_from_yaml():
    run = Run.from_yaml(FUNCTION_MANIFEST)
    assert (run.metadata.name, run.metadata.namespace, run.metadata.uid) == (
        "echo",
        "kruntimes-demo",
        RUN_UID,
    )
    assert run.spec.mode.kind == "function"
    assert run.spec.mode.function is not None
    assert run.spec.mode.function.idleTimeoutSeconds == 600
    assert run.spec.source.inline is not None
    assert run.spec.source.inline[0].content.startswith("def handle(request):")
    assert run.spec.retryPolicy.limit == 2
    assert run.spec.retryPolicy.backoffSeconds == 1.0
    assert run.status is not None
    assert run.status.phase == RunPhase.Ready
    assert run.status.conditions[0].lastTransitionTime == T0


def test_a_task_manifest_parses_with_defaults():
    run = Run.from_yaml(TASK_MANIFEST)
    assert run.metadata.namespace == "default"
    assert run.spec.mode.kind == "task"
    assert run.spec.source.path == "/srv/jobs/nightly"
    assert run.status is None


def test_manifest_errors_list_every_problem_by_field_path():
    text = (
        TASK_MANIFEST.replace("nightly}", "Nightly}").replace("run.sh", "/run.sh").replace("{task: {}}", "{}")
    )
    with pytest.raises(ManifestError) as info:
        Run.from_yaml(text)
    problems = info.value.problems
    assert any(p.startswith("metadata.name: a DNS-1123 label") for p in problems), problems
    assert "spec.mode: exactly one of 'function' or 'task' must be set" in problems
    assert "invalid Run manifest" in str(info.value)


def test_handler_errors_point_at_the_handler():
    with pytest.raises(ManifestError) as info:
        Run.from_yaml(TASK_MANIFEST.replace("run.sh", "/run.sh"))
    assert info.value.problems == (
        "spec.handler: bash handler: file name '/run.sh' must be relative, not absolute",
    )


@pytest.mark.parametrize(
    ("field", "bad"),
    [("apiVersion: kruntimes.io/v1alpha1", "apiVersion: v1"), ("kind: Run", "kind: Pod")],
)
def test_api_version_and_kind_are_checked(field, bad):
    with pytest.raises(ManifestError, match=field.split(":")[0]):
        Run.from_yaml(TASK_MANIFEST.replace(field, bad))


@pytest.mark.parametrize(
    ("text", "says"), [("a: [", "not valid YAML"), ("- 1", "expected a mapping, got list")]
)
def test_unparseable_manifests_raise_manifest_error(text, says):
    with pytest.raises(ManifestError, match=says):
        Run.from_yaml(text)


def test_manifest_errors_are_value_errors():
    with pytest.raises(ValueError, match="expected a mapping"):
        Run.from_dict(None)


def test_unknown_manifest_fields_are_rejected():
    with pytest.raises(ManifestError, match="spec.replicas: Extra inputs"):
        Run.from_yaml(TASK_MANIFEST + "  replicas: 3\n")


def test_a_full_run_round_trips_through_json_mode_dumps():
    run = full_run()
    assert Run.model_validate(run.model_dump(mode="json")) == run
    assert Run.model_validate_json(run.model_dump_json()) == run


def test_a_full_run_round_trips_through_from_dict():
    run = full_run()
    assert Run.from_dict(run.model_dump(mode="json")) == run


@pytest.mark.parametrize(
    "value",
    [make_spec(), full_run().spec, RunStatus(), full_run().status],
    ids=["minimal-spec", "full-spec", "empty-status", "full-status"],
)
def test_spec_and_status_round_trip_through_the_temporal_data_converter(value):
    assert roundtrip_converter(value) == value


def test_the_data_converter_keeps_timezones_and_enums():
    status = full_run().status
    assert status is not None
    decoded = roundtrip_converter(status)
    assert isinstance(decoded, RunStatus)
    assert decoded.startTime == T0
    assert decoded.startTime is not None and decoded.startTime.tzinfo is not None
    assert type(decoded.phase) is RunPhase


def test_spec_payloads_use_the_manifest_field_names():
    converter = pydantic_data_converter.payload_converter
    (payload,) = converter.to_payloads([make_spec(timeoutSeconds=5)])
    assert b'"timeoutSeconds":5' in payload.data
    assert b'"retryPolicy":{"limit":3' in payload.data
    assert isinstance(roundtrip_converter(make_spec()), RunSpec)


def test_run_new_builds_a_validated_function_run_from_inline_files_or_a_path() -> None:
    from kruntimes.api.run import ManifestError

    UID = "2b0f6d1c-2f0e-4c55-9a3e-5d0c2b8a7f10"
    inline = Run.new("hello", runtime="python", handler="main:handle", inline={"main.py": "x = 1\n"})
    assert inline.spec.mode.kind == "function" and inline.metadata.namespace == "default"
    assert [f.name for f in inline.spec.source.inline or []] == ["main.py"]
    on_disk = Run.new(
        "task",
        runtime="bash",
        handler="run.sh",
        path="/srv/fn",
        uid=UID,
        mode={"task": {}},
        timeoutSeconds=5,
    )
    assert on_disk.spec.source.path == "/srv/fn" and on_disk.metadata.uid == UID
    assert on_disk.spec.mode.kind == "task" and on_disk.spec.timeoutSeconds == 5
    with pytest.raises(ManifestError, match="metadata.name"):
        Run.new("Not_A_Label", runtime="python", handler="main:handle", inline={"main.py": ""})
