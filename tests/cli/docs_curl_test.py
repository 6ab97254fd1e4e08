"""The curl example of docs/invoke-api.md, run as written (with `krt` and `python` on PATH) against
the whole platform: the URL, the token and the CA it reads answer the invocation."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from kruntimes.api.run import Run
from kruntimes.sdk.client import Client
from tests.sdk.stack import Platform, manifest, unique

DOC = Path(__file__).resolve().parents[2] / "docs" / "invoke-api.md"
ECHO_NAME = "def handle(p):\n    return {'hello': p['name']}\n"


def _example() -> str:
    section = DOC.read_text().split("## With curl", 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None, "the curl example is a sh block under '## With curl'"
    return found.group(1)


def _shims(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for name, command in (("krt", f"{sys.executable} -m kruntimes.workers.krt"), ("python", sys.executable)):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        shim.chmod(0o755)


async def test_the_embedded_curl_example_invokes_a_ready_run(platform: Platform, tmp_path: Path) -> None:
    name = unique("hello")
    async with Client(platform.config) as client:
        await client.create(Run.from_dict(manifest(name, source=ECHO_NAME)))
        await client.wait(name)
    script = _example()
    assert script.count("\n") == 3, "three lines: the config, the URL, curl"
    _shims(tmp_path / "bin")
    env = platform.env()
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    shell = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script.replace("krt run get hello", f"krt run get {name}"),
        env=env, cwd=Path(__file__).resolve().parents[2],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(shell.communicate(), 120)
    assert shell.returncode == 0, err.decode()
    answer = json.loads(out)
    assert answer["status"] == "Succeeded" and answer["outputs"] == {"hello": "curl"}
