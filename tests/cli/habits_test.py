"""kubectl habits, through the real `krt` against the whole platform: `run create -f`, `-o wide`,
`run describe`, `--watch`, the REASON column, a closed pipe, manifests without `spec.mode`, YAML
errors by file, line and column."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import yaml

from kruntimes.api.run import Run
from kruntimes.sdk.client import Client
from tests.cli.conftest import krt, one_error_line
from tests.sdk.stack import Platform, history_json, manifest, unique
from tests.support.waiting import eventually

SECRET = "env-value-never-shown-5d1e"


def _without_mode(name: str) -> dict[str, object]:
    document = manifest(name)
    spec = dict(document["spec"])
    del spec["mode"]
    return {**document, "spec": spec}


async def _ready_run(platform: Platform, **spec: object) -> str:
    name = unique("habit")
    async with Client(platform.config) as client:
        await client.create(Run.from_dict(manifest(name, **spec)))
        await client.wait(name)
    return name


async def _listed(platform: Platform, name: str) -> None:
    """Until `krt run list` shows `name` (visibility indexes a new Run a moment after it started)."""

    async def listed() -> bool:
        async with Client(platform.config) as client:
            return name in {run.name for run in await client.list()}

    await eventually(listed, within=30, what=f"Run {name} listed")


async def test_run_create_f_creates_the_runs_of_a_manifest_and_spec_mode_defaults_to_function(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("from-file")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(_without_mode(name)))
    done = await krt(platform, "run", "create", "-f", "run.yaml", "--wait", "-o", "json", cwd=tmp_path)
    assert done.code == 0, done.err
    run = json.loads(done.out)
    assert run["spec"]["mode"] == {"function": {}}, "no spec.mode is a function Run, as the flags make"
    assert run["status"]["phase"] == "Ready"

    again = await krt(platform, "run", "create", "-f", "run.yaml", cwd=tmp_path)
    assert again.code == 1 and "already exists" in one_error_line(again.err), "create, unlike apply, is new"
    applied = await krt(platform, "apply", "-f", "run.yaml", cwd=tmp_path)
    assert applied.code == 0 and applied.out.strip() == f"run.kruntimes.io/{name} unchanged", applied.err


async def test_a_yaml_error_names_the_file_its_line_and_its_column(
    platform: Platform, tmp_path: Path
) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: kruntimes.io/v1alpha1\nkind: Run\nmetadata: {name: [x}\n")
    for command in (("apply",), ("run", "create")):
        done = await krt(platform, *command, "-f", "bad.yaml", cwd=tmp_path)
        assert done.code == 2, done.err
        line = one_error_line(done.err)
        assert line.startswith("krt: invalid Run manifest: bad.yaml:3:20: not valid YAML: "), line


async def test_the_run_list_shows_a_reason_and_wide_adds_the_endpoint(platform: Platform) -> None:
    name = await _ready_run(platform)
    await _listed(platform, name)
    listed = await krt(platform, "run", "list")
    assert listed.code == 0, listed.err
    header, *rows = listed.out.splitlines()
    assert header.split() == [
        "NAME", "NAMESPACE", "RUNTIME", "MODE", "PHASE", "REASON", "ATTEMPT", "HOST", "AGE",
    ]  # fmt: skip
    row = next(r.split() for r in rows if r.startswith(name + " "))
    assert row[:7] == [name, "default", "python", "function", "Ready", "FunctionRegistered", "1"]

    async with Client(platform.config) as client:
        run = await client.get(name)
    assert run.status.endpoint is not None
    for command in (("run", "list", "-o", "wide"), ("run", "get", name, "-o", "wide")):
        wide = await krt(platform, *command)
        assert wide.code == 0, wide.err
        header, *rows = wide.out.splitlines()
        assert header.split()[-5:] == ["AGE", "RECOVERIES", "TENANT", "UID", "ENDPOINT"]
        row = next(r.split() for r in rows if r.startswith(name + " "))
        assert row[-4:] == ["0", "<none>", run.uid, run.status.endpoint.url]


async def test_describe_shows_the_status_conditions_and_events_without_secret_values(
    platform: Platform,
) -> None:
    name = await _ready_run(platform, env={"DB_PASSWORD": SECRET})
    done = await krt(platform, "run", "describe", name)
    assert done.code == 0, done.err
    text = done.out
    assert SECRET not in text
    fields = {
        key: value.strip()
        for key, sep, value in (line.partition(":") for line in text.splitlines())
        if sep and key[:1].isupper() and not value.startswith("\n")
    }
    assert fields["Name"] == name and fields["Phase"] == "Ready"
    assert fields["Reason"] == "FunctionRegistered" and fields["Attempt"] == "1 of 3"
    assert fields["Host"].startswith("python-") and fields["Endpoint"].startswith("https://")
    assert fields["Env"] == "DB_PASSWORD (values not shown)"
    conditions, events = text.split("Conditions:\n", 1)[1].split("Events:\n", 1)
    assert conditions.splitlines()[1].split()[:3] == ["Ready", "True", "FunctionRegistered"]
    rows = [line.split() for line in events.splitlines()]
    assert rows[0] == ["AGE", "KIND", "REASON", "HOST", "ATTEMPT", "MESSAGE"]
    phases = [row for row in rows[1:] if row[1] == "Phase"]
    assert phases[-1][2:5] == ["FunctionRegistered", fields["Host"], "1"], text

    missing = await krt(platform, "run", "describe", "no-such-run")
    assert missing.code == 3 and "not found" in one_error_line(missing.err)


async def test_get_watch_prints_the_run_and_ends_at_its_timeout(platform: Platform) -> None:
    name = await _ready_run(platform)
    done = await krt(platform, "run", "get", name, "-w", "--timeout", "1")
    assert done.code == 0, done.err
    header, row = done.out.splitlines()
    assert header.split()[0] == "NAME" and row.split()[:5] == [name, "default", "python", "function", "Ready"]

    as_yaml = await krt(platform, "run", "get", name, "-w", "--timeout", "1", "-o", "yaml")
    assert as_yaml.code == 0, as_yaml.err
    [document] = [d for d in yaml.safe_load_all(as_yaml.out) if d is not None]
    assert document["metadata"]["name"] == name and document["status"]["phase"] == "Ready"


async def test_list_watch_prints_each_change_until_interrupted(platform: Platform) -> None:
    name = await _ready_run(platform)
    await _listed(platform, name)
    watching = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kruntimes.cli.main", "run", "list", "--watch",
        env=platform.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert watching.stdout is not None and watching.stderr is not None
    try:
        lines: list[list[str]] = []

        async def row_of(phase: str) -> bool:
            while not any(line[:1] == [name] and line[4] == phase for line in lines):
                lines.append((await watching.stdout.readline()).decode().split())  # type: ignore[union-attr]
                if lines[-1] == []:
                    raise AssertionError(f"the watch ended: {lines}")
            return True

        await asyncio.wait_for(row_of("Ready"), 90)
        assert lines[0][0] == "NAME"
        async with Client(platform.config) as client:
            await client.cancel(name)
        await asyncio.wait_for(row_of("Cancelled"), 90)
        cancelled = next(line for line in lines if line[:1] == [name] and line[4] == "Cancelled")
        assert cancelled[5] == "Cancelled", "the row's REASON"
    finally:
        if watching.returncode is None:
            watching.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(watching.communicate(), 90)
    assert watching.returncode == 130, err
    assert b"Traceback" not in err


async def test_a_watch_of_an_empty_namespace_prints_the_header_with_the_first_run(platform: Platform) -> None:
    namespace = unique("empty")
    watching = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kruntimes.cli.main", "run", "list", "-n", namespace, "-w",
        env=platform.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert watching.stdout is not None and watching.stderr is not None
    try:
        said = (await asyncio.wait_for(watching.stderr.readline(), 90)).decode()
        assert said.startswith(f"No runs found in namespace {namespace}; watching."), said
        name = unique("late")
        async with Client(platform.config) as client:
            await client.create(Run.from_dict(manifest(name, namespace=namespace)))
        header = (await asyncio.wait_for(watching.stdout.readline(), 90)).decode().split()
        assert header[:2] == ["NAME", "NAMESPACE"]
        row = (await asyncio.wait_for(watching.stdout.readline(), 90)).decode().split()
        assert row[:2] == [name, namespace]
    finally:
        if watching.returncode is None:
            watching.send_signal(signal.SIGINT)
        await asyncio.wait_for(watching.communicate(), 90)
        async with Client(platform.config) as client:
            for run in await client.list(namespace=namespace):
                await client.delete(run.name, namespace)


async def test_a_closed_pipe_ends_the_list_quietly_as_kubectl_does(platform: Platform) -> None:
    name = await _ready_run(platform)
    await _listed(platform, name)
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before krt writes: `krt run list | head -0`
    try:
        closed = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kruntimes.cli.main", "run", "list",
            env=platform.env(), stdout=writer, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
    finally:
        os.close(writer)
    _, err = await asyncio.wait_for(closed.communicate(), 90)
    assert err == b"", "no `unexpected error: BrokenPipeError`"
    assert closed.returncode == -signal.SIGPIPE, "ended by SIGPIPE, as kubectl is (a shell shows 141)"

    shell = await asyncio.create_subprocess_exec(
        "sh", "-c", f"{sys.executable} -m kruntimes.cli.main run list | head -1",
        env=platform.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(shell.communicate(), 90)
    assert shell.returncode == 0 and err == b"", err
    assert out.decode().split()[0] == "NAME"


ECHO_INPUT = "def handle(p):\n    return {'got': p}\n"


async def test_a_task_runs_with_its_input_from_the_flag_a_manifest_or_the_sdk(
    platform: Platform, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.py").write_text(ECHO_INPUT)
    (tmp_path / "input.json").write_text('{"n": [1, 2, 3], "marker": "task-input-marker-4be1"}')
    name = unique("input")
    done = await krt(
        platform,
        "run", "create", name, "--runtime", "python", "--source", "src", "--handler", "main:handle",
        "--mode", "task", "--input", "@input.json", "--wait", "-o", "json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.code == 0, done.err
    run = json.loads(done.out)
    assert run["spec"]["mode"] == {"task": {"input": {"n": [1, 2, 3], "marker": "task-input-marker-4be1"}}}
    assert run["status"]["phase"] == "Succeeded"
    assert run["status"]["outputs"] == {"got": {"n": [1, 2, 3], "marker": "task-input-marker-4be1"}}

    assert "task-input-marker-4be1" not in await history_json(platform, name), "encrypted, as env is"

    from_manifest = unique("manifest-input")
    document = {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": from_manifest},
        "spec": {
            "runtime": "python",
            "mode": {"task": {"input": {"from": "manifest"}}},
            "source": {"path": "src"},
            "handler": "main:handle",
        },
    }
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(document))
    applied = await krt(platform, "apply", "-f", "task.yaml", "--wait", "-o", "json", cwd=tmp_path)
    assert applied.code == 0, applied.err
    assert json.loads(applied.out)["status"]["outputs"] == {"got": {"from": "manifest"}}

    async with Client(platform.config) as client:
        sdk = unique("sdk-input")
        await client.create(
            Run.new(sdk, runtime="python", handler="main:handle", inline={"main.py": ECHO_INPUT},
                    mode={"task": {"input": [1, "two", None]}})
        )  # fmt: skip
        finished = await client.wait(sdk)
    assert finished.status.outputs == {"got": [1, "two", None]}


async def test_a_task_without_input_is_called_with_null(platform: Platform) -> None:
    async with Client(platform.config) as client:
        name = unique("no-input")
        await client.create(Run.from_dict(manifest(name, source=ECHO_INPUT, mode={"task": {}})))
        assert (await client.wait(name)).status.outputs == {"got": None}
