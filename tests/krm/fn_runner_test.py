"""`krt fn-runner` as a real process: serves on a port picked at run time, reads its
FunctionConfig directory while running, answers `krt fn eval --runner`, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kruntimes.krm import errors
from kruntimes.krm.client import RemoteEvaluator
from kruntimes.krm.resources import dump, load_all
from tests.krm.conftest import eventually, function_config, request
from tests.krm.runner_process import fn_runner


@pytest.fixture
async def runner(tmp_path: Path, functions: Path) -> AsyncIterator[tuple[str, Path]]:
    async with fn_runner(tmp_path, functions) as served:
        yield served.address, served.configs


async def test_the_runner_applies_config_changes_while_serving(runner) -> None:
    address, configs = runner
    remote = RemoteEvaluator(address)
    try:
        with pytest.raises(errors.NotFound):
            await remote.evaluate(request("example.com/fn/labels:v1.0.0"))
        config = function_config(
            "labels", prefixes=["example.com/fn/labels"], path="set-labels", tags=["1.x"]
        )
        (configs / "labels.yaml").write_text(dump(config))

        async def served() -> bool:
            try:
                await remote.evaluate(request("example.com/fn/labels:v1.0.0"))
            except errors.NotFound:
                return False
            return True

        await eventually(served, timeout=10, what="the new FunctionConfig is served")
    finally:
        await remote.close()


async def test_krt_fn_eval_runs_on_the_runner(runner, tmp_path: Path) -> None:
    address, configs = runner
    config = function_config("labels", prefixes=["example.com/fn/labels"], path="set-labels", tags=["1.x"])
    (configs / "labels.yaml").write_text(dump(config))
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "cm.yaml").write_text(
        dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    )
    krt = Path(sys.executable).with_name("krt")

    def evaluate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(krt), "fn", "eval", str(package), "--image", "example.com/fn/labels:v1.0.0", "--runner", address,
             "--", "remote=yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    async def done() -> bool:
        return (await asyncio.to_thread(evaluate)).returncode == 0

    await eventually(done, timeout=20, what="krt fn eval --runner succeeds")
    assert load_all((package / "cm.yaml").read_text())[0]["metadata"]["labels"] == {"remote": "yes"}
