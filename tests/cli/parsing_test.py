"""Usage errors are caught before anything is contacted: exit 2 and one `krt: ` line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from kruntimes.cli import main as cli
from kruntimes.cli.commands import manifest_from_flags, parse_env, read_manifests
from kruntimes.cli.parser import NotKeyValue, UsageError, key_values, parse
from tests.cli.conftest import one_error_line
from tests.sdk.stack import manifest


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
    (tmp_path / "src").mkdir()


def _usage(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.run(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return one_error_line(captured.err)


CREATE = ["run", "create", "x", "--runtime", "python", "--source", "src", "--handler", "main:handle"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["run"], "required: <verb>"),
        (
            ["run", "create", "x"],
            "required: --runtime, --source, --handler; or create the Run from a manifest (-f FILE)",
        ),
        (
            ["run", "create", "-f", "run.yaml", "--runtime", "python"],
            "-f takes the Run from its manifest; drop --runtime",
        ),
        ([*CREATE, "--input", "{}"], "--input applies to --mode task only"),
        ([*CREATE, "--mode", "task", "--input", "{nope"], "--input is not JSON"),
        (["run", "list", "--timeout", "5"], "--timeout applies to --watch only"),
        (["run", "get", "x", "-w", "--timeout", "0"], "--timeout must be a positive number"),
        (["run", "list", "-o", "xml"], "invalid choice: 'xml'"),
        (["run", "get", "x", "-o", "xml"], "invalid choice: 'xml'"),
        (["run", "list", "--phase", "Sleeping"], "invalid choice: 'Sleeping'"),
        ([*CREATE, "--mode", "cron"], "invalid choice: 'cron'"),
        ([*CREATE, "--timeout", "soon"], "invalid int value: 'soon'"),
        ([*CREATE, "--env", "NOEQUALS"], "--env 'NOEQUALS': expected KEY=VALUE"),
        (
            [*CREATE, "--mode", "task", "--idle-timeout", "5"],
            "--idle-timeout applies to --mode function only",
        ),
        (
            ["run", "create", "x", "--runtime", "python", "--source", "missing", "--handler", "m:h"],
            "not a directory",
        ),
        ([*CREATE[:-1], "not a handler"], "spec.handler"),
        (["apply", "-f", "missing.yaml"], "cannot read missing.yaml"),
        (["invoke", "x", "--data", "{nope"], "--data is not JSON"),
        (["invoke", "x", "--data", "@missing.json"], "cannot read missing.json"),
        (["config", "view", "-o", "table"], "invalid choice: 'table'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert says in _usage(capsys, *argv)


def test_no_command_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run([]) == 2
    assert "usage: krt" in capsys.readouterr().err


def test_help_lists_every_command_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["--help"]) == 0
    out = capsys.readouterr().out
    for command in (
        "apply",
        "run",
        "invoke",
        "hosts",
        "config",
        "up",
        "down",
        "status",
        "host",
        "worker",
        "demo",
    ):
        assert f"    {command} " in out


def test_an_invalid_manifest_names_every_field_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = manifest("Bad_Name")
    data["spec"]["timeoutSeconds"] = "soon"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    line = _usage(capsys, "apply", "-f", "run.yaml")
    assert line.startswith("krt: invalid Run manifest: ")
    assert "metadata.name" in line and "spec.timeoutSeconds" in line


def test_apply_namespace_fills_in_or_must_match(tmp_path: Path) -> None:
    data = manifest("x")
    del data["metadata"]["namespace"]
    data["spec"]["source"] = {"path": "src"}
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "run.yaml").write_text(
        yaml.safe_dump(data) + "---\n" + yaml.safe_dump({**data, "metadata": {"name": "y"}})
    )
    runs = read_manifests(str(sub / "run.yaml"), namespace="team", stdin=None)  # type: ignore[arg-type]
    assert [(r.metadata.name, r.metadata.namespace) for r in runs] == [("x", "team"), ("y", "team")]
    assert runs[0].spec.source.path == str(sub / "src"), "relative to the manifest's directory"
    data["metadata"]["namespace"] = "other"
    (sub / "run.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError, match="does not match -n 'team'"):
        read_manifests(str(sub / "run.yaml"), namespace="team", stdin=None)  # type: ignore[arg-type]


def test_run_create_flags_make_a_manifest(tmp_path: Path) -> None:
    args = parse(
        [*CREATE, "-n", "team", "--env", "A=1", "--env", "B=x=y", "--timeout", "60", "--idle-timeout", "30"]
    )
    run = manifest_from_flags(args, stdin=io.StringIO())
    assert (run.metadata.name, run.metadata.namespace) == ("x", "team")
    assert run.spec.source.path == str(tmp_path / "src")
    assert run.spec.env == {"A": "1", "B": "x=y"}
    assert run.spec.timeoutSeconds == 60
    assert run.spec.mode.function is not None and run.spec.mode.function.idleTimeoutSeconds == 30
    task = manifest_from_flags(parse([*CREATE, "--mode", "task"]), stdin=io.StringIO())
    assert task.spec.mode.kind == "task"
    assert task.spec.mode.task is not None and task.spec.mode.task.input is None
    given = manifest_from_flags(
        parse([*CREATE, "--mode", "task", "--input", "@-"]), stdin=io.StringIO('{"n": [1]}')
    )
    assert given.spec.mode.task is not None and given.spec.mode.task.input == {"n": [1]}


def test_key_value_pairs_split_at_the_first_equals_sign_and_a_later_key_wins() -> None:
    """The rule of `krt run create --env` and of `krt fn eval -- key=value`."""
    assert key_values(["A=", "B==", "C=d=e", "A=again"]) == {"A": "again", "B": "=", "C": "d=e"}
    assert key_values([]) == {}


@pytest.mark.parametrize("item", ["NOEQUALS", "=value", ""])
def test_a_pair_without_an_equals_sign_or_a_key_is_refused(item: str) -> None:
    with pytest.raises(NotKeyValue) as refused:
        key_values(["A=b", item])
    assert refused.value.item == item
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        parse_env([item])
