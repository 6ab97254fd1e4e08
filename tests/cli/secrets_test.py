"""`krt secret` and a Run's envFrom end to end: the value reaches the function, never Temporal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.sdk.client import Client, RunFailed
from tests.cli.conftest import krt
from tests.sdk.stack import Platform, history_json, manifest, unique

SECRET = "s3cr3t-from-the-store-5d1e"
READS_ENV = "import os\ndef handle(p):\n    return {'password': os.environ.get('DB_PASSWORD')}\n"


async def test_a_secret_created_with_krt_reaches_the_function_through_env_from(
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
    async with Client(platform.config) as client:
        await client.create(
            Run.from_dict(
                manifest(run, source=READS_ENV, envFrom=[{"secretRef": {"name": name}, "prefix": "DB_"}])
            )
        )
        await client.wait(run)
        assert (await client.invoke(run, {})).outputs == {"password": SECRET}
    assert SECRET not in await history_json(platform, run)
    assert (await krt(platform, "secret", "delete", name)).code == 0
    assert (await krt(platform, "secret", "delete", name)).code == 3


async def test_a_run_naming_a_missing_secret_fails_with_secret_not_found(platform: Platform) -> None:
    run = unique("no-secret")
    async with Client(platform.config) as client:
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
