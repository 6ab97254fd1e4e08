"""Every `temporal` command the docs give (docs/operations.md "Operating with the `temporal` CLI
and UI", and the README's) runs as written against a real platform, exits 0 and shows what the
docs say: the commands are read from the docs themselves and run by bash, with `cfg` and `T` as
the docs define them and `krt`, `python` and `temporal` on PATH.

The platform is this module's own: one command drains a host.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.sdk.client import Client, RunFailed, RunNotFound
from kruntimes.temporal.devserver import temporal_binary
from tests.sdk.stack import Platform, manifest, start
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
README = ROOT / "README.md"
SECTION = "## Operating with the `temporal` CLI and UI"
SUMMARY = re.compile(r"HandlerLoadFailed \(HandlerImportError\) on python-\d+ at attempt 1")


@dataclass(frozen=True)
class Ran:
    command: str
    code: int
    out: str
    err: str


def _block(text: str, after: str) -> str:
    """The first ```sh block after the line `after`."""
    rest = text[text.index(after) :]
    opened = rest.index("```sh\n") + len("```sh\n")
    return rest[opened : rest.index("```", opened)]


def _commands(block: str) -> list[str]:
    """The block's commands: comments and blank lines dropped, continued lines joined, a trailing
    comment kept (bash ignores it)."""
    joined = block.replace("\\\n", " ")
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _prelude() -> str:
    """`cfg` and `T` as the docs define them."""
    text = OPERATIONS.read_text()
    cfg = next(
        line
        for line in _block(text, "## Reading encrypted payloads").splitlines()
        if line.startswith("cfg()")
    )
    t = re.search(r'`(T="--address \$\(cfg temporalAddress\)")`', text)
    assert t is not None, "the section defines T"
    return f"{cfg}\n{t.group(1)}\n"


def section_commands() -> list[str]:
    return _commands(_block(OPERATIONS.read_text(), SECTION))


def readme_commands() -> list[str]:
    return [
        c for c in _commands(_block(README.read_text(), "A Run is an object")) if c.startswith("temporal ")
    ]


@pytest.fixture(scope="module")
async def platform(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    async with start(tmp_path_factory.mktemp("temporal-docs"), pki) as started:
        yield started


async def bash(platform: Platform, command: str) -> Ran:
    path = os.pathsep.join(
        [str(Path(sys.executable).parent), str(Path(temporal_binary()).parent), os.environ.get("PATH", "")]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRT_", "TEMPORAL_"))}
    env |= {"KRT_STATE_DIR": str(platform.state_dir), "PATH": path}
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        _prelude() + command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(command, proc.returncode, out.decode(), err.decode())


def test_the_docs_give_the_commands_this_test_runs() -> None:
    commands = section_commands()
    assert sum(c.startswith("temporal ") for c in commands) >= 12
    assert any("--name delete_now" in c for c in commands)
    assert readme_commands(), "the README has one"


async def test_every_temporal_command_of_the_operations_page_works_as_written(platform: Platform) -> None:
    async with Client(platform.config) as client:
        await _runs(client)
        scale_out = await _a_scale_out(client)
        ready = {"hello"}  # the Ready Runs the lists show (until the commands end them)
        for command in section_commands():
            command = command.replace("scaleout/python/REQUEST", scale_out)
            ran = await bash(platform, command)
            assert ran.code == 0, ran
            await _shows_what_the_docs_say(client, ran, ready)


async def test_the_readme_temporal_command_works_as_written(platform: Platform) -> None:
    async with Client(platform.config) as client:
        await client.create(Run.from_dict(manifest("readme")))
        await client.wait("readme")
    for command in readme_commands():
        ran = await bash(platform, command)
        assert ran.code == 0, ran
        assert "run/default/readme" in ran.out, ran


async def _runs(client: Client) -> None:
    """hello and other Ready, broken Failed: the Runs the commands name (no tenant is configured
    here: the tenant's list is empty)."""
    await client.create(Run.from_dict(manifest("hello")))
    await client.create(Run.from_dict(manifest("other")))
    await client.create(Run.from_dict(manifest("broken", source="import nowhere_to_be_found\n")))
    await client.wait("hello")
    await client.wait("other")
    with pytest.raises(RunFailed):
        await client.wait("broken")


async def _a_scale_out(client: Client) -> str:
    """A scale-out's workflow id, for the command that names one from the list."""
    temporal = await client.temporal()
    async for execution in temporal.list_workflows("WorkflowType='ScaleOutWorkflow'"):
        return execution.id
    raise AssertionError("the platform's hosts were started by scale-outs")


async def _shows_what_the_docs_say(client: Client, ran: Ran, ready: set[str]) -> None:
    command, out = ran.command, ran.out
    if command.startswith("temporal workflow list") and "ScaleOut" not in command and "Failed" not in command:
        if "KrtTenant" not in command:
            assert all(f"run/default/{name}" in out for name in ready), ran
    elif "ExecutionStatus='Failed'" in command:
        assert "run/default/broken" in out, ran
    elif "GROUP BY ExecutionStatus" in command:
        assert "Running" in out and "Failed" in out, ran
    elif "describe" in command and "run/default/broken" in command:
        assert SUMMARY.search(out), ran
        assert "Encoded failure" not in out, ran
    elif "--name delete" in command and "update execute" in command:
        assert "deleted run/default/other: Cancelled" in out, ran
        await _gone(client, "other")
    elif "--name cancel" in command:
        await client.wait("hello", until=RunPhase.Cancelled)  # closed: the next command deletes it
        ready.discard("hello")
    elif "--name delete_now" in command:
        await _gone(client, "hello")
    elif command.startswith("krt hosts drain"):
        hosts = await client.hosts()
        assert not any(h.host.hostId == "python-0" and h.host.state == HostState.Ready for h in hosts), hosts


async def _gone(client: Client, name: str) -> None:
    async def gone() -> bool:
        try:
            await client.get(name)
        except RunNotFound:
            return True
        return False

    await eventually(gone, within=60.0, what=f"run {name} is deleted")
