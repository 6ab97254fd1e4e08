from __future__ import annotations

import textwrap

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from kruntimes.api import (
    Function,
    FunctionManifestError,
    FunctionPhase,
    FunctionStatus,
    ManifestError,
    Run,
    load_manifest,
)
from kruntimes.api.limits import MAX_FUNCTION_NAME_CHARS, MAX_FUNCTION_REPLICAS
from kruntimes.contracts.function import FunctionInput, ReplicaOf, replica_name
from kruntimes.contracts.names import function_invoke_url, function_of_workflow_id, function_workflow_id

from .builders import RUN_UID, T0, ready_condition

FUNCTION_MANIFEST = textwrap.dedent(
    f"""\
    apiVersion: kruntimes.io/v1alpha1
    kind: Function
    metadata:
      name: echo
      namespace: demo
      uid: {RUN_UID}
      labels: {{team: a}}
    spec:
      runtime: python
      mode:
        function: {{concurrency: 4, queue: 8}}
      source:
        inline:
          - name: main.py
            content: |
              def handle(request):
                  return request
      handler: main:handle
      env: {{GREETING: hello}}
      scale: {{min: 2, max: 5, scaleDownDelaySeconds: 60}}
    """
)


def _problems(text: str) -> tuple[str, ...]:
    with pytest.raises(FunctionManifestError) as caught:
        Function.from_yaml(text)
    return caught.value.problems


def _with(old: str, new: str) -> str:
    assert old in FUNCTION_MANIFEST
    return FUNCTION_MANIFEST.replace(old, new)


def test_a_function_manifest_parses_with_its_template_and_scale() -> None:
    fn = Function.from_yaml(FUNCTION_MANIFEST)
    assert fn.metadata.uid == RUN_UID and fn.metadata.labels == {"team": "a"}
    assert (fn.spec.scale.min, fn.spec.scale.max, fn.spec.scale.scaleDownDelaySeconds) == (2, 5, 60)
    assert fn.spec.scale.targetConcurrency is None
    assert fn.spec.target_concurrency == 4  # unset: the replica's own concurrency
    template = fn.spec.template()
    assert type(template).__name__ == "RunSpec" and not hasattr(template, "scale")
    assert template.env == {"GREETING": "hello"} and template.mode.function is not None
    # a replica Run of that template validates as any Run does
    replica = Run.new("echo-r1-abcde", runtime="python", handler="main:handle", inline={"main.py": "x"})
    assert replica.spec.runtime == template.runtime


def test_scale_alone_is_the_same_template_and_a_template_change_is_not() -> None:
    fn = Function.from_yaml(FUNCTION_MANIFEST)
    scaled = Function.from_yaml(_with("min: 2, max: 5", "min: 1, max: 9"))
    changed = Function.from_yaml(_with("GREETING: hello", "GREETING: bye"))
    assert fn.spec.same_template(scaled.spec)
    assert not fn.spec.same_template(changed.spec)


def test_a_task_mode_function_is_refused_saying_it_serves_invocations() -> None:
    problems = _problems(_with("function: {concurrency: 4, queue: 8}", "task: {}"))
    assert problems == ("spec.mode: a Function serves invocations: mode.function, not mode.task",)


@pytest.mark.parametrize(
    ("scale", "problem"),
    [
        ("{min: 3, max: 2}", "spec.scale: min (3) must be at most max (2)"),
        (
            f"{{max: {MAX_FUNCTION_REPLICAS + 1}}}",
            "spec.scale.max: Input should be less than or equal to 100",
        ),
        ("{max: 0}", "spec.scale.max: Input should be greater than or equal to 1"),
        ("{min: -1}", "spec.scale.min: Input should be greater than or equal to 0"),
        (
            "{targetConcurrency: 0}",
            "spec.scale.targetConcurrency: Input should be greater than or equal to 1",
        ),
        ("{scaleDownDelaySeconds: 3601}", "spec.scale.scaleDownDelaySeconds: Input should be less than"),
        ("{min: '1'}", "spec.scale.min: Input should be a valid integer"),
        ("{replicas: 3}", "spec.scale.replicas: Extra inputs are not permitted"),
    ],
)
def test_scale_bounds_are_checked_by_path(scale: str, problem: str) -> None:
    problems = _problems(_with("{min: 2, max: 5, scaleDownDelaySeconds: 60}", scale))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_every_problem_is_listed_by_path_and_the_error_names_the_kind() -> None:
    long_name = "a" * (MAX_FUNCTION_NAME_CHARS + 1)
    text = _with("name: echo", f"name: {long_name}").replace("handler: main:handle", "handler: ''")
    with pytest.raises(ManifestError) as caught:  # a Run's error type catches it
        Function.from_yaml(text)
    assert str(caught.value).startswith("invalid Function manifest:")
    assert [p.split(":")[0] for p in caught.value.problems] == ["metadata.name", "spec.handler"]
    assert f"at most {MAX_FUNCTION_NAME_CHARS} characters" in caught.value.problems[0]


def test_the_longest_function_name_leaves_a_replica_name_that_is_a_dns_label() -> None:
    name = "f" * MAX_FUNCTION_NAME_CHARS
    Function.new(name, runtime="python", handler="main:handle", inline={"main.py": "x"})
    replica = replica_name(name, 9999, RUN_UID)
    Run.new(replica, runtime="python", handler="main:handle", inline={"main.py": "x"})
    assert replica.startswith(f"{name}-r9999-") and len(replica) <= 63


def test_load_manifest_takes_either_kind_and_refuses_others() -> None:
    assert isinstance(load_manifest(FUNCTION_MANIFEST), Function)
    run = load_manifest(FUNCTION_MANIFEST.replace("kind: Function", "kind: Run").split("  scale:")[0])
    assert isinstance(run, Run)
    with pytest.raises(ManifestError) as caught:
        load_manifest(FUNCTION_MANIFEST.replace("kind: Function", "kind: Service"))
    assert caught.value.problems == ("kind: expected one of Run, Function, got 'Service'",)
    with pytest.raises(ManifestError) as caught:
        load_manifest("kind: [", filename="fn.yaml")
    assert caught.value.problems[0].startswith("fn.yaml:1:")
    with pytest.raises(ManifestError):
        load_manifest("- a list")


def test_new_builds_a_function_like_run_new() -> None:
    fn = Function.new(
        "echo", runtime="python", handler="main:handle", inline={"main.py": "x"}, scale={"min": 0, "max": 3}
    )
    assert fn.kind == "Function" and fn.spec.mode.function is not None
    assert (fn.spec.scale.min, fn.spec.scale.max) == (0, 3)
    assert Function.new("echo", runtime="python", handler="main:handle", path="/srv/f").spec.scale.min == 1


def test_status_keeps_one_condition_per_type_and_a_transition_time() -> None:
    status = FunctionStatus().with_condition(ready_condition())
    again = status.with_condition(ready_condition(at=T0.replace(year=2026)))
    assert again.conditions[0].lastTransitionTime == T0 and len(again.conditions) == 1
    assert FunctionStatus().phase is FunctionPhase.Pending


def test_the_workflow_input_round_trips_through_the_data_converter() -> None:
    fn = Function.from_yaml(FUNCTION_MANIFEST)
    converter = pydantic_data_converter.payload_converter
    payload = converter.to_payloads([FunctionInput(function=fn)])
    back = converter.from_payloads(payload, [FunctionInput])[0]
    assert back == FunctionInput(function=fn)
    assert ReplicaOf(functionUid=RUN_UID, functionName="echo", revision=1).revision == 1
    with pytest.raises(ValueError, match="functionUid"):
        ReplicaOf(functionUid=RUN_UID.upper(), functionName="echo", revision=1)


def test_function_names_do_not_look_like_a_runs() -> None:
    assert function_workflow_id("demo", "echo") == "function/demo/echo"  # type: ignore[arg-type]
    assert function_of_workflow_id("function/demo/echo") == ("demo", "echo")
    assert function_of_workflow_id("run/demo/echo") is None
    url = function_invoke_url("https://gw:8443/", namespace="demo", function_uid=RUN_UID)  # type: ignore[arg-type]
    assert url == f"https://gw:8443/v1/namespaces/demo/functions/{RUN_UID}:invoke"
