"""The whole platform in this test process: the Temporal dev server (in memory), the worker, an
HTTPS gateway with the embedded token authorizer, and real runtime host processes.

tests/sdk and tests/cli share one instance per test session (the fixture in each conftest takes a
reference; the last one out stops everything). `client.json` in ``state_dir`` points the SDK and
the `krt` CLI (KRT_STATE_DIR) at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kruntimes.contracts.names import run_workflow_id
from kruntimes.contracts.providers import HostDefaults
from kruntimes.sdk import config as clientconfig
from kruntimes.temporal.devserver import temporal_binary
from tests.support.pki import TestPKI
from tests.support.stack import Stack, inline_manifest, running_stack

TOKEN = "krt-test-token-alice"
OTHER_TOKEN = "krt-test-token-bob"  # a known user bound to no namespace: 403
RUNTIME = "python"

ECHO = "import os\ndef handle(p):\n    return {'echo': p, 'pid': os.getpid()}\n"
SLEEPY = "import time\ndef handle(p):\n    time.sleep((p or {}).get('sleep', 0))\n    return {'slept': (p or {}).get('sleep', 0)}\n"
FAILING = "def handle(p):\n    print('about to fail')\n    raise ValueError('boom')\n"
TASK = "def handle(p):\n    return {'answer': 42}\n"


@dataclass
class Platform(Stack):
    shared: Path  # a directory functions see (they run as their own uid in their own mounts)

    def env(self) -> dict[str, str]:
        """The environment of a `krt` subprocess: this platform's state dir, no other KRT_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
        env["KRT_STATE_DIR"] = str(self.state_dir)
        return env


def manifest(name: str, *, source: str = ECHO, **spec: Any) -> dict[str, Any]:
    return inline_manifest(name, runtime=RUNTIME, source=source, **spec)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@contextlib.asynccontextmanager
async def start(
    root: Path, pki: TestPKI, *, runtimes: list[dict[str, Any]] | None = None
) -> AsyncIterator[Platform]:
    """The platform; `runtimes` (the runtimes file's entries) defaults to one python runtime."""
    shared = root / "shared"  # every function sees it: the tests exchange files with functions here
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    async with running_stack(
        root,
        pki,
        runtimes=runtimes or [{"name": RUNTIME, "adapter": "python", "runs": 8, "maxHosts": 2}],
        tokens={TOKEN: 'alice,1000,"devs"', OTHER_TOKEN: 'bob,1001,"others"'},
        codec=True,
        host_defaults=HostDefaults(
            allowedSourceRoots=[str(root.parent)],  # where the tests make their source dirs
            shared=[str(shared)],
        ),
    ) as started:
        clientconfig.write(started.state_dir, started.config)
        yield Platform(**started.parts(), shared=shared)


async def workflow_show(
    platform: Platform, name: str, *flags: str, timeout_s: float = 30.0
) -> tuple[int, str, str]:
    """`temporal workflow show --output json` of the Run `name`'s workflow with `flags`: its exit
    code, stdout and stderr. The TEMPORAL_* environment is left out: only the flags configure it."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "show",
        "--address",
        platform.config.temporalAddress,
        "--workflow-id",
        run_workflow_id("default", name),
        "--output",
        "json",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def history_json(platform: Platform, name: str) -> str:
    """The Run `name`'s workflow history, as `temporal workflow show --output json` prints it."""
    code, out, err = await workflow_show(platform, name)
    assert code == 0, err
    return out


async def delete_runs(platform: Platform) -> None:
    """Delete every Run a test left, so its slots are free for the next test."""
    from kruntimes.sdk.client import Client

    async with Client(platform.config) as client:
        runs = await client.list()
        await asyncio.gather(*(client.delete(r.metadata.name, r.metadata.namespace) for r in runs))


async def failing_pool_tasks(platform: Platform) -> list[str]:
    """For each runtime's pool whose workflow task fails again and again (a pool so stuck admits
    nothing; not one whose tasks time out on a starved machine): what failed and the run's last
    events, to tell from a test's output alone."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowExecutionStatus

    from kruntimes.sdk.client import Client

    found: list[str] = []
    async with Client(platform.config) as client:
        temporal = await client.temporal()
        query = "WorkflowType = 'RuntimePoolWorkflow' AND ExecutionStatus = 'Running'"
        async for pool in temporal.list_workflows(query, limit=20):
            handle = temporal.get_workflow_handle(pool.id, run_id=pool.run_id)
            described = await handle.describe()
            pending = described.raw_description.pending_workflow_task
            if described.status != WorkflowExecutionStatus.RUNNING or pending.attempt < 3:
                continue
            events = [e async for e in handle.fetch_history_events()]
            ended = [
                e
                for e in events
                if e.HasField("workflow_task_failed_event_attributes")
                or e.HasField("workflow_task_timed_out_event_attributes")
            ]
            if not ended or not ended[-1].HasField("workflow_task_failed_event_attributes"):
                continue  # tasks timed out on a starved machine: slow, not broken (it goes on after)
            last = ended[-1].workflow_task_failed_event_attributes
            why = f"{last.cause}: {last.failure.message}"
            tail = " ".join(
                f"{e.event_id}:{EventType.Name(e.event_type)[len('EVENT_TYPE_') :]}" for e in events[-60:]
            )
            found.append(f"{pool.id} task attempt {pending.attempt} fails ({why}); its last events: {tail}")
    return found


class _Shared:
    platform: Platform | None = None
    users = 0
    stack: contextlib.AsyncExitStack | None = None


@contextlib.asynccontextmanager
async def shared_platform(factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    if _Shared.platform is None:
        stack = contextlib.AsyncExitStack()
        _Shared.platform = await stack.enter_async_context(start(factory.mktemp("krt"), pki))
        _Shared.stack = stack
    _Shared.users += 1
    try:
        yield _Shared.platform
    finally:
        _Shared.users -= 1
        if _Shared.users == 0 and _Shared.stack is not None:
            stack, _Shared.stack, _Shared.platform = _Shared.stack, None, None
            await stack.aclose()
