"""`krt secret` and a Run's envFrom end to end: the value reaches the function of a Run whose
creator the role bindings let use it, never Temporal; a Run without a creator, or whose creator
is bound elsewhere, is refused, and the host's log holds an audit line of each decision."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.config import secret_store
from kruntimes.contracts.names import TASK_QUEUE, run_workflow_id
from kruntimes.contracts.run import RunInput
from kruntimes.sdk.client import Client, RunFailed
from tests.cli.conftest import krt
from tests.sdk.stack import Platform, history_json, manifest, unique
from tests.support.waiting import eventually

SECRET = "s3cr3t-from-the-store-5d1e"
READS_ENV = "import os\ndef handle(p):\n    return {'password': os.environ.get('DB_PASSWORD')}\n"
SENDS_ENV = "import os\ndef handle(p):\n    return dict(os.environ)\n"
OWNER = "owner"
# the embedded default (the owner, every namespace) and a tenant's CI bound to its own namespace
BINDINGS = f"""\
bindings:
  - namespace: "*"
    verbs: [use-secrets]
    users: [{OWNER}]
  - namespace: team-a
    verbs: [use-secrets]
    users: [team-a-ci]
"""


@pytest.fixture(scope="module", autouse=True)
def bindings(session_platform: Platform) -> Iterator[Path]:
    """The platform's role bindings, which its hosts read from its state directory."""
    path = session_platform.state_dir / "rolebindings.yaml"
    path.write_text(BINDINGS)
    path.chmod(0o644)
    yield path
    path.unlink()


def _as(platform: Platform, identity: str) -> Client:
    return Client(platform.config.model_copy(update={"identity": identity}))


def _audits(platform: Platform, run_uid: str) -> list[dict[str, object]]:
    """The audit lines the platform's hosts logged about `run_uid`."""
    found = []
    for log in (platform.state_dir / "hosts").glob("*/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"kruntimes.audit.secrets"' in line and run_uid in line:
                found.append(json.loads(line))
    return found


def _logged(platform: Platform, text: str) -> bool:
    return any(
        text in log.read_text(errors="replace") for log in (platform.state_dir / "hosts").glob("*/*.log")
    )


def _secret(platform: Platform, namespace: str) -> str:
    name = unique("db")
    secret_store.create(
        platform.state_dir, namespace=namespace, name=name, values={"PASSWORD": SECRET.encode()}
    )
    return name


async def test_a_secret_created_with_krt_reaches_the_function_of_a_bound_creator(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("db")
    cert = tmp_path / "cert"
    cert.write_text("-----BEGIN CERT-----")
    done = await krt(
        platform,
        "secret",
        "create",
        name,
        "--from-literal",
        f"PASSWORD={SECRET}",
        "--from-file",
        f"CERT={cert}",
    )
    assert done.code == 0, done.err
    listed = await krt(platform, "secret", "list")
    assert f"{name}\tCERT,PASSWORD" in listed.out and SECRET not in listed.out
    run = unique("env-from")
    async with _as(platform, OWNER) as client:
        created = await client.create(
            Run.from_dict(
                manifest(run, source=READS_ENV, envFrom=[{"secretRef": {"name": name}, "prefix": "DB_"}])
            )
        )
        await client.wait(run)
        assert (await client.invoke(run, {})).outputs == {"password": SECRET}
    uid = str(created.metadata.uid)
    audits = await eventually(lambda: _audits(platform, uid), what="the host's audit line")
    assert {
        (a["decision"], a["namespace"], a["secret"], a["creator"], a["attempt"], bool(a["time"]))
        for a in audits
    } == {("allowed", "default", name, f"sdk:{OWNER}", 1, True)}
    assert SECRET not in await history_json(platform, run) and not _logged(platform, SECRET)
    described = await platform.temporal.get_workflow_handle(run_workflow_id("default", run)).describe()
    assert await described.static_summary() == f"function python default/{run} by sdk:{OWNER}"
    assert (await krt(platform, "secret", "delete", name)).code == 0
    assert (await krt(platform, "secret", "delete", name)).code == 3


async def test_a_run_naming_a_missing_secret_fails_with_secret_not_found(platform: Platform) -> None:
    run = unique("no-secret")
    async with _as(platform, OWNER) as client:
        await client.create(
            Run.from_dict(
                manifest(
                    run,
                    source=READS_ENV,
                    envFrom=[{"secretRef": {"name": "absent"}}],
                    retryPolicy={"limit": 1},
                )
            )
        )
        with pytest.raises(RunFailed) as failed:
            await client.wait(run, timeout=60)
    status = failed.value.run.status
    assert status.phase is RunPhase.Failed
    assert "SecretNotFound" in json.dumps(status.model_dump(mode="json"))


async def test_a_run_started_with_plain_temporal_gets_no_secret_of_another_namespace(
    platform: Platform,
) -> None:
    """The attack: a local user's script starts a task Run in team-b naming team-b's secret, with
    a handler that would send its environment out."""
    name = _secret(platform, "team-b")
    run = Run.from_dict(
        manifest(
            unique("loot"),
            namespace="team-b",
            source=SENDS_ENV,
            mode={"task": {}},
            envFrom=[{"secretRef": {"name": name}}],
        )
    )
    run = run._replace(metadata=run.metadata._replace(uid=str(uuid.uuid4())))
    assert run.metadata.creator is None
    await platform.temporal.start_workflow(
        "RunWorkflow",
        RunInput(run=run),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=TASK_QUEUE,
    )
    async with Client(platform.config) as client:
        with pytest.raises(RunFailed) as failed:
            await client.wait(run.metadata.name, "team-b", timeout=60)
    status = failed.value.run.status
    said = json.dumps(status.model_dump(mode="json"))
    assert status.phase is RunPhase.Failed and "SecretForbidden" in said and "no creator" in said
    assert status.outputs is None and SECRET not in said
    audits = await eventually(lambda: _audits(platform, str(run.metadata.uid)), what="the audit line")
    assert {(a["decision"], a["creator"], a["namespace"], a["secret"]) for a in audits} == {
        ("refused", "", "team-b", name)
    }
    assert not _logged(platform, SECRET)


async def test_the_cli_records_its_creator_and_a_creator_bound_elsewhere_is_refused(
    platform: Platform, tmp_path: Path
) -> None:
    name = _secret(platform, "team-b")
    run = unique("cross")
    document = manifest(
        run, source=READS_ENV, envFrom=[{"secretRef": {"name": name}}], retryPolicy={"limit": 3}
    )
    document["metadata"]["namespace"] = "team-b"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(document))
    as_ci = {"KRT_IDENTITY": "team-a-ci"}
    done = await krt(platform, "run", "create", "-f", "run.yaml", cwd=tmp_path, env=as_ci)
    assert done.code == 0, done.err
    async with Client(platform.config) as client:
        with pytest.raises(RunFailed) as failed:
            await client.wait(run, "team-b", timeout=60)
    status = failed.value.run.status
    assert status.phase is RunPhase.Failed and status.attempt == 1, "refused for good at the first attempt"
    assert "SecretForbidden" in json.dumps(status.model_dump(mode="json"))
    assert "cli:team-a-ci is not bound to use secret" in status.message
    assert str(failed.value.run.metadata.creator) == "cli:team-a-ci"
    uid = str(failed.value.run.metadata.uid)
    audits = await eventually(lambda: _audits(platform, uid), what="the audit line")
    assert {(a["decision"], a["creator"]) for a in audits} == {("refused", "cli:team-a-ci")}
