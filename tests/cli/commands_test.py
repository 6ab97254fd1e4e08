"""`krt` as a user runs it (a subprocess) against the whole platform."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.sdk.client import Client
from tests.cli.conftest import krt, one_error_line
from tests.sdk.moves import moved_off
from tests.sdk.stack import ECHO, FAILING, Platform, manifest, unique


def _source(tmp_path: Path, code: str = ECHO) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.py").write_text(code)
    return source


async def _ready_run(platform: Platform, code: str = ECHO) -> str:
    name = unique("cli")
    async with Client(platform.config) as client:
        await client.create(Run.from_dict(manifest(name, source=code)))
        await client.wait(name)
    return name


async def test_run_create_with_wait_prints_the_ready_run_as_json(platform: Platform, tmp_path: Path) -> None:
    name = unique("created")
    source = _source(tmp_path)
    done = await krt(
        platform,
        "run", "create", name, "--runtime", "python", "--source", "src", "--handler", "main:handle",
        "--env", "GREETING=hi", "--idle-timeout", "600", "--wait", "-o", "json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.code == 0, done.err
    run = json.loads(done.out)
    assert list(run) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert run["metadata"]["name"] == name and run["metadata"]["uid"]
    assert run["spec"]["source"] == {"path": str(source)}, "--source becomes an absolute path"
    assert run["spec"]["env"] == {"GREETING": "hi"}
    assert run["spec"]["mode"] == {"function": {"idleTimeoutSeconds": 600}}
    assert run["status"]["phase"] == "Ready"
    assert f"run/{name}: Ready" in done.err, "progress goes to stderr, plain lines off a terminal"


async def test_run_get_prints_yaml_and_list_shows_a_table(platform: Platform) -> None:
    name = await _ready_run(platform)
    got = await krt(platform, "run", "get", name, "-o", "yaml")
    assert got.code == 0, got.err
    document = yaml.safe_load(got.out)
    assert document["metadata"]["name"] == name and document["status"]["phase"] == "Ready"
    Run.from_dict(document)  # what get prints, apply takes back

    listed = await krt(platform, "run", "list")  # its columns: tests/cli/habits_test.py
    assert listed.code == 0, listed.err
    assert any(r.split()[:1] == [name] for r in listed.out.splitlines()[1:])

    as_json = json.loads((await krt(platform, "run", "list", "--phase", "Ready", "-o", "json")).out)
    assert as_json["kind"] == "RunList" and name in [i["metadata"]["name"] for i in as_json["items"]]


async def test_invoke_prints_the_outputs_of_data_or_a_file(platform: Platform, tmp_path: Path) -> None:
    name = await _ready_run(platform)
    done = await krt(platform, "invoke", name, "--data", '{"a": 1}')
    assert done.code == 0, done.err
    assert json.loads(done.out)["echo"] == {"a": 1}

    payload = tmp_path / "payload.json"
    payload.write_text('{"from": "file"}')
    full = await krt(
        platform, "invoke", name, "--data", f"@{payload}", "--invocation-id", "cli-1", "-o", "json"
    )
    answer = json.loads(full.out)
    assert answer["status"] == "Succeeded" and answer["invocationId"] == "cli-1"
    assert answer["outputs"]["echo"] == {"from": "file"}


async def test_an_error_answer_exits_1_with_its_reason(platform: Platform) -> None:
    name = await _ready_run(platform, FAILING)
    done = await krt(platform, "invoke", name, "--data", "{}")
    assert done.code == 1 and done.out == ""
    line = one_error_line(done.err)
    assert "HandlerError" in line and "boom" in line


async def test_cancel_then_delete_end_and_remove_the_run(platform: Platform) -> None:
    name = await _ready_run(platform)
    cancelled = await krt(platform, "run", "cancel", name)
    assert cancelled.code == 0, cancelled.err
    async with Client(platform.config) as client:
        assert (await client.wait(name, until=RunPhase.Cancelled)).status.phase is RunPhase.Cancelled
    deleted = await krt(platform, "run", "delete", name)
    assert (deleted.code, deleted.out) == (0, f"run.kruntimes.io/{name} deleted\n"), deleted.err
    assert name not in (await krt(platform, "run", "list")).out
    again = await krt(platform, "run", "delete", name)
    assert again.code == 3, "a deleted Run is not found (as kubectl delete says NotFound)"
    assert "not found" in one_error_line(again.err)


async def test_apply_creates_then_leaves_an_identical_run_unchanged(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("applied")
    _source(tmp_path)
    data = manifest(name)
    data["spec"]["source"] = {"path": "src"}  # relative to the manifest's directory
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    first = await krt(platform, "apply", "-f", str(path))
    assert (first.code, first.out) == (0, f"run.kruntimes.io/{name} created\n"), first.err
    second = await krt(platform, "apply", "-f", "-", stdin=path.read_text(), cwd=tmp_path)
    assert (second.code, second.out) == (0, f"run.kruntimes.io/{name} unchanged\n"), second.err

    data["spec"]["env"] = {"CHANGED": "1"}
    path.write_text(yaml.safe_dump(data))
    conflict = await krt(platform, "apply", "-f", str(path))
    assert conflict.code == 1 and "immutable" in one_error_line(conflict.err)


async def test_hosts_list_shows_the_pool_hosts(platform: Platform) -> None:
    await _ready_run(platform)
    done = await krt(platform, "hosts", "list")
    assert done.code == 0, done.err
    header, *rows = done.out.splitlines()
    assert header.split() == ["HOST", "RUNTIME", "STATE", "SLOTS", "ADDRESS"]
    assert any(r.split()[1:3] == ["python", "Ready"] for r in rows)


async def _moved_by(platform: Platform, verb: str, *flags: str) -> tuple[RunStatus, str, RunStatus]:
    """`krt hosts VERB <the host of a new Ready Run> FLAGS`, which succeeds: the Run's status
    before, what the command printed, and the Run's status once it is Ready on another host."""
    name = await _ready_run(platform)
    async with Client(platform.config) as client:
        before = await client.status(name)
        done = await krt(platform, "hosts", verb, before.assignedHost or "", *flags)
        assert done.code == 0, done.err
        return before, done.out, await moved_off(client, name, before.assignedHostUID or "")


async def test_hosts_drain_moves_the_runs_off_a_host_and_says_so(platform: Platform) -> None:
    before, out, moved = await _moved_by(platform, "drain", "-m", "maintenance")
    assert out == (
        f"host {before.assignedHost} (python): drained, Draining: draining: the pool takes no new Run here\n"
    )
    assert moved.recoveries == 1


async def test_hosts_delete_acknowledges_once_the_host_is_gone(platform: Platform) -> None:
    before, out, _ = await _moved_by(platform, "delete", "-o", "json")
    result = json.loads(out)
    assert (result["hostId"], result["state"], result["accepted"]) == (
        before.assignedHost,
        "Terminating",
        True,
    )


async def test_hosts_reconcile_reports_each_runtime(platform: Platform) -> None:
    done = await krt(platform, "hosts", "reconcile")
    assert done.code == 0, done.err
    assert done.out.startswith("python: ")


async def test_an_unknown_host_exits_3_with_one_line(platform: Platform) -> None:
    done = await krt(platform, "hosts", "drain", "python-404")
    assert done.code == 3
    assert "host 'python-404' not found" in one_error_line(done.err)


async def test_config_view_prints_the_effective_client_config(platform: Platform) -> None:
    done = await krt(platform, "config", "view", "-o", "json")
    assert done.code == 0, done.err
    assert json.loads(done.out) == platform.config.redacted()
    assert platform.config.token and platform.config.token not in done.out
    done = await krt(platform, "config", "view", "-o", "json", "--raw")
    assert json.loads(done.out) == platform.config.model_dump(mode="json")


async def test_a_bad_command_exits_2_with_one_line(platform: Platform) -> None:
    for args in (("frobnicate",), ("run", "create", "x"), ("run", "get")):
        done = await krt(platform, *args)
        assert done.code == 2 and done.out == ""
        assert "krt --help" in one_error_line(done.err) or "--help`" in done.err


async def test_an_unknown_run_exits_3(platform: Platform) -> None:
    for args in (("run", "get", "no-such-run"), ("invoke", "no-such-run", "--data", "{}")):
        done = await krt(platform, *args)
        assert done.code == 3, done.err
        assert "not found" in one_error_line(done.err)
