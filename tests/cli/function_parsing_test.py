"""`krt function` and `krt rollout status` without a platform: the grammar, manifests of either
kind, usage errors (exit 2, one `krt: ` line), the exit codes of the Function errors, and what
get, list, describe and rollout status print."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from kruntimes.api.function import Function, FunctionPhase, FunctionStatus, ReplicaCounts, ScaleEvent
from kruntimes.api.run import Run
from kruntimes.api.status import Condition, ConditionStatus, Endpoint, EndpointProtocol
from kruntimes.cli import main as cli
from kruntimes.cli.commands import read_documents, read_manifests
from kruntimes.cli.output import describe_function, functions_table, rollout_line
from kruntimes.cli.parser import UsageError, parse
from kruntimes.contracts.function import ReplicaView
from kruntimes.sdk.errors import FunctionConflict, FunctionNotFound
from kruntimes.sdk.functions import FunctionDescription, ready, rolled_out
from kruntimes.sdk.results import FunctionObject
from tests.cli.conftest import one_error_line
from tests.sdk.stack import manifest

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
UID = "0b7e1c52-3c5e-4a8e-9d0f-6f1d2a3b4c5d"
SECRET = "env-value-never-shown-77aa"


@pytest.fixture(autouse=True)
def _no_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "KRT_TEMPORAL_ADDRESS",
        "KRT_GATEWAY_URL",
        "KRT_TOKEN",
        "KRT_CA_FILE",
        "KRT_TEMPORAL_NAMESPACE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KRT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


def function_manifest(name: str, **spec: Any) -> dict[str, Any]:
    document = manifest(name, **spec)
    return {**document, "kind": "Function"}


def _usage(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.run(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return one_error_line(captured.err)


def test_the_function_verbs_and_rollout_status_parse_as_kubectl_spells_them() -> None:
    got = parse(["function", "get", "web", "-n", "team", "-o", "wide"])
    assert (got.command, got.verb, got.name, got.namespace, got.output) == (
        "function",
        "get",
        "web",
        "team",
        "wide",
    )
    invoked = parse(["function", "invoke", "web", "-d", '{"a": 1}', "--timeout", "5", "-o", "json"])
    assert (invoked.data, invoked.timeout, invoked.output) == ('{"a": 1}', 5.0, "json")
    deleted = parse(["function", "delete", "web", "--wait=false", "--timeout", "30"])
    assert (deleted.wait, deleted.timeout) == (False, 30.0)
    for target in ("function/web", "functions/web", "function.kruntimes.io/web"):
        rollout = parse(["rollout", "status", target, "--watch=false"])
        assert (rollout.command, rollout.verb, rollout.name, rollout.watch) == (
            "rollout",
            "status",
            "web",
            False,
        )
    scaled = parse(["function", "scale", "web", "--replicas", "3", "-m", "more load"])
    assert (scaled.verb, scaled.replicas, scaled.message) == ("scale", 3, "more load")
    assert parse(["function", "list", "-A"]).all_namespaces
    assert parse(["function", "apply", "-f", "f.yaml", "--wait"]).wait


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["function", "get"], "the following arguments are required: name"),
        (["function", "list", "-o", "csv"], "invalid choice: 'csv'"),
        (["function", "apply"], "-f/--filename"),
        (["rollout", "status", "deployment/web"], "expected function/NAME, not 'deployment/web'"),
        (["rollout", "status", "function/"], "expected function/NAME"),
        (["function", "scale-to-the-moon", "web"], "invalid choice"),
        (["function", "scale", "web"], "the following arguments are required: --replicas"),
    ],
    ids=[
        "get-without-name",
        "bad-output",
        "apply-without-f",
        "other-kind",
        "no-name",
        "unknown-verb",
        "no-replicas",
    ],
)
def test_a_wrong_function_command_line_is_one_usage_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert says in _usage(capsys, *argv)


def test_a_file_of_both_kinds_reads_each_by_its_kind_with_paths_from_the_files_directory(
    tmp_path: Path,
) -> None:
    sub = tmp_path / "app"
    (sub / "src").mkdir(parents=True)
    function = function_manifest("web", scale={"min": 2, "max": 4})
    function["spec"] = {**function["spec"], "source": {"path": "src"}}
    documents = [manifest("job"), function]
    for document in documents:  # -n fills the namespace in
        document["metadata"] = {"name": document["metadata"]["name"]}
    (sub / "both.yaml").write_text(yaml.safe_dump_all(documents))
    run, read = read_documents(str(sub / "both.yaml"), namespace="team", stdin=io.StringIO())
    assert isinstance(run, Run) and isinstance(read, Function)
    assert read.metadata.namespace == "team" and read.spec.scale.min == 2
    assert read.spec.source.path == str((sub / "src").resolve())
    with pytest.raises(UsageError, match="'web' is a Function, not a Run; `krt apply -f`"):
        read_manifests(str(sub / "both.yaml"), namespace=None, stdin=io.StringIO())


def test_run_create_and_function_apply_refuse_the_other_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fn.yaml").write_text(yaml.safe_dump(function_manifest("web")))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(manifest("job")))
    assert "is a Function, not a Run" in _usage(capsys, "run", "create", "-f", "fn.yaml")
    assert "is a Run, not a Function" in _usage(capsys, "function", "apply", "-f", "run.yaml")
    assert "is a Function, not a Run" in _usage(
        capsys, "schedule", "create", "nightly", "--every", "1h", "-f", "fn.yaml"
    )


def test_an_invalid_function_manifest_names_every_problem_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = function_manifest("web", scale={"min": 5, "max": 2, "scaleDownDelaySeconds": -1})
    (tmp_path / "fn.yaml").write_text(yaml.safe_dump(bad))
    line = _usage(capsys, "apply", "-f", "fn.yaml")
    assert line.startswith("krt: invalid Function manifest: spec.scale.scaleDownDelaySeconds: "), line
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(function_manifest("web", mode={"task": {}})))
    assert "a Function serves invocations" in _usage(capsys, "function", "apply", "-f", "task.yaml")
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(function_manifest("f" * 46)))
    assert "a Function name is at most 45 characters" in _usage(
        capsys, "function", "apply", "-f", "long.yaml"
    )


def test_the_function_errors_exit_as_the_run_ones_do() -> None:
    code, said = cli.explain(FunctionNotFound.named("team", "web"))
    assert code == 3
    assert (
        said
        == "function 'web' not found in namespace 'team'; `krt function list -n team` lists the Functions"
    )
    code, said = cli.explain(FunctionConflict("default", "web", "it exists with uid a, not b"))
    assert code == 1 and said.endswith("`krt function describe web` shows it")
    # a 404 from the gateway stays an invocation's error (exit 1), as for a Run
    answered = FunctionNotFound(404, "FunctionNotFound", "no such function", invocation_id="i-1")
    assert cli.explain(answered) == (
        1,
        "invocation i-1: FunctionNotFound: no such function; `krt function list` shows the Functions",
    )


def _status(**changes: object) -> FunctionStatus:
    base = FunctionStatus(
        phase=FunctionPhase.Ready,
        revision=2,
        observedRevision=2,
        replicas=ReplicaCounts(wanted=2, ready=2, total=2),
        endpoint=Endpoint(
            protocol=EndpointProtocol.HTTPS, url=f"https://gw:1/v1/namespaces/default/functions/{UID}:invoke"
        ),
    )
    return base._replace(**changes)


def _function(status: FunctionStatus) -> FunctionObject:
    document = function_manifest("web", env={"PASSWORD": SECRET}, scale={"min": 1, "max": 3})
    document["metadata"] = {**document["metadata"], "uid": UID}
    return FunctionObject.of(Function.from_dict(document), status, created=NOW - timedelta(minutes=5))


def test_rolled_out_needs_the_current_revision_ready_and_no_older_replica_left() -> None:
    assert rolled_out(_status()) and ready(_status())
    draining = _status(replicas=ReplicaCounts(wanted=2, ready=2, total=3))
    assert ready(draining) and not rolled_out(draining), "an old replica still drains"
    coming = _status(revision=3, replicas=ReplicaCounts(wanted=2, ready=1, total=3))
    assert not ready(coming) and not rolled_out(coming)
    assert not ready(
        _status(phase=FunctionPhase.Degraded, replicas=ReplicaCounts(wanted=2, ready=1, total=2))
    )
    assert not rolled_out(FunctionStatus()), "a Function before its first revision is not rolled out"
    assert rollout_line("web", _status()) == "function/web: revision 2 rolled out (2/2 ready)"
    assert rollout_line("web", coming) == (
        "function/web: waiting for revision 3 to roll out: 1 of 2 replicas ready, 3 in all (Ready)"
    )


def test_get_lists_a_row_and_describe_shows_replicas_revision_endpoint_conditions_but_no_secret() -> None:
    condition = Condition(
        type="Ready",
        status=ConditionStatus.TRUE,
        reason="ReplicasReady",
        lastTransitionTime=NOW,
        message="2 of 2",
    )
    status = _status(
        revision=3,
        observedRevision=2,
        replicas=ReplicaCounts(wanted=2, ready=1, total=3),
        conditions=[condition],
    )
    function = _function(status)
    rows = functions_table([function], now=NOW).splitlines()
    assert rows[0].split() == ["NAME", "NAMESPACE", "RUNTIME", "READY", "REVISION", "PHASE", "AGE"]
    assert rows[1].split() == ["web", "default", "python", "1/2", "3", "Ready", "5m"]
    assert rows and UID in functions_table([function], now=NOW, wide=True)
    replicas = [
        ReplicaView(
            runUid="1b7e1c52-3c5e-4a8e-9d0f-6f1d2a3b4c5d", name="web-r2-aaaaa", revision=2, phase="Deleting"
        ),
        ReplicaView(
            runUid="2b7e1c52-3c5e-4a8e-9d0f-6f1d2a3b4c5d", name="web-r3-bbbbb", revision=3, phase="Ready"
        ),
    ]
    text = describe_function(FunctionDescription(function, replicas), now=NOW)
    fields = dict(line.split(":", 1) for line in text.splitlines() if line[:1].isupper() and ":" in line)
    assert fields["Revision"].strip() == "3 (rolled out: 2)"
    assert fields["Replicas"].strip() == "2 wanted, 1 ready, 3 in all"
    assert fields["Endpoint"].strip() == status.endpoint.url  # type: ignore[union-attr]
    assert fields["Scale"].strip().startswith("min 1, max 3, target concurrency 1")
    assert fields["Env"].strip() == "PASSWORD (values not shown)" and SECRET not in text
    assert "ReplicasReady" in text
    replica_rows = [line.split() for line in text.split("Replica Runs:\n", 1)[1].splitlines()]
    assert replica_rows[0] == ["RUN", "REVISION", "PHASE", "UID"]
    assert replica_rows[1][:3] == ["web-r2-aaaaa", "2", "Deleting"]
    assert replica_rows[2][:3] == ["web-r3-bbbbb", "3", "Ready"]
    assert fields["Last Scale"].strip() == "<none>"


def test_describe_shows_the_functions_last_scale_from_to_why_and_when() -> None:
    event = ScaleEvent(previous=1, wanted=4, reason="load jumped: panic window", message="load 3.9", at=NOW)
    text = describe_function(FunctionDescription(_function(_status(lastScale=event)), []), now=NOW)
    [line] = [ln for ln in text.splitlines() if ln.startswith("Last Scale:")]
    assert line.split(":", 1)[1].strip().startswith("1 -> 4 (load jumped: panic window: load 3.9) at ")
