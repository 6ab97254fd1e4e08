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
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client as TemporalClient

from activities.hosts.process import stop_all
from gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from gateway.server import Gateway, GatewayOptions
from kruntimes import clientconfig
from kruntimes.clientconfig import ClientConfig
from kruntimes.codec import ensure_key
from kruntimes.config import parse_config
from kruntimes.devserver import DevServer
from kruntimes.hosts import HostDefaults
from kruntimes.lifecycle import PlatformInfo
from kruntimes.temporal import TemporalSettings, connect
from kruntimes.tls import ensure_tls
from tests.pki import TestPKI
from workers.worker import WorkerSettings, running_workers

TOKEN = "krt-test-token-alice"
OTHER_TOKEN = "krt-test-token-bob"  # a known user bound to no namespace: 403
RUNTIME = "python"

ECHO = "import os\ndef handle(p):\n    return {'echo': p, 'pid': os.getpid()}\n"
SLEEPY = "import time\ndef handle(p):\n    time.sleep((p or {}).get('sleep', 0))\n    return {'slept': (p or {}).get('sleep', 0)}\n"
FAILING = "def handle(p):\n    print('about to fail')\n    raise ValueError('boom')\n"
TASK = "def handle(p):\n    return {'answer': 42}\n"


@dataclass
class Platform:
    state_dir: Path
    config: ClientConfig
    temporal: TemporalClient
    gateway: Gateway
    dev_server: DevServer
    shared: Path  # a directory functions see (they run as their own uid in their own mounts)

    def env(self) -> dict[str, str]:
        """The environment of a `krt` subprocess: this platform's state dir, no other KRT_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
        env["KRT_STATE_DIR"] = str(self.state_dir)
        return env


def manifest(
    name: str,
    *,
    source: str = ECHO,
    mode: dict[str, Any] | None = None,
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtime": RUNTIME,
            "mode": mode or {"function": {}},
            "source": {"inline": [{"name": "main.py", "content": source}]},
            "handler": "main:handle",
            **spec,
        },
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def until(check: Callable[[], bool], *, within: float, what: str) -> None:
    """Wait until ``check()`` holds, for at most ``within`` seconds; else fail saying ``what``."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {within:g} s for {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def start(
    root: Path, pki: TestPKI, *, runtimes: list[dict[str, Any]] | None = None
) -> AsyncIterator[Platform]:
    """The platform; `runtimes` (the runtimes file's entries) defaults to one python runtime."""
    state = root / "state"
    state.mkdir(parents=True)
    shared = root / "shared"  # every function sees it: the tests exchange files with functions here
    shared.mkdir()
    shared.chmod(0o1777)
    server = DevServer(state_dir=root / "temporal", persistent=False)
    await asyncio.to_thread(server.start)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(server.stop)
        codec_keys = ensure_key(root / "codec-keys")
        temporal = await connect(TemporalSettings(address=server.address, codecKeys=str(codec_keys)))
        tls = ensure_tls(root / "tls")
        tokens = root / "tokens.csv"
        tokens.write_text(f'{TOKEN},alice,1000,"devs"\n{OTHER_TOKEN},bob,1001,"others"\n')
        tokens.chmod(0o600)
        bindings = RoleBindings.from_yaml("bindings:\n- namespace: '*'\n  groups: [devs]\n")
        gateway = Gateway(
            GatewayOptions(
                listen_host="127.0.0.1",
                listen_port=0,
                heartbeat_listen="127.0.0.1:0",
                cert_file=tls.cert,
                key_file=tls.key,
                authorizer=CachingAuthorizer(EmbeddedAuthorizer(TokenFile(tokens), bindings)),
                temporal=temporal,
                known_refresh_s=0.5,
                peer_tls=pki.gateway,
                assignments=pki.verifier(),
            )
        )
        url = await gateway.start()
        stack.push_async_callback(gateway.stop)
        settings = WorkerSettings(
            temporal=TemporalSettings(address=server.address, namespace="default"),
            config=parse_config(
                {"runtimes": runtimes or [{"name": RUNTIME, "adapter": "python", "runs": 8, "maxHosts": 2}]}
            ),
            host_defaults=HostDefaults(
                allowedSourceRoots=[str(root.parent)],  # where the tests make their source dirs
                shared=[str(shared)],
            ),
            platform=PlatformInfo(
                gatewayUrl=url,
                caBundle=tls.ca_cert.read_text(),
                stateDir=str(state),
                gatewayHeartbeats=[gateway.heartbeat_address],
                heartbeatIntervalSeconds=0.5,
            ),
            trust=pki.worker_trust(),
        )
        stack.push_async_callback(stop_all, state)
        await stack.enter_async_context(running_workers(temporal, settings))
        stack.push_async_callback(_terminate_runs, temporal)
        config = ClientConfig(
            temporalAddress=server.address,
            temporalNamespace="default",
            gatewayUrl=url,
            caFile=str(tls.ca_cert),
            token=TOKEN,
            uiUrl=server.ui_url,
            codecKeys=str(codec_keys),
            stateDir=str(state),
        )
        clientconfig.write(state, config)
        yield Platform(state, config, temporal, gateway, server, shared)


async def _terminate_runs(temporal: TemporalClient) -> None:
    """Stop what the tests left running, so the worker shuts down at once."""
    async for execution in temporal.list_workflows("ExecutionStatus='Running'"):
        with contextlib.suppress(Exception):
            await temporal.get_workflow_handle(execution.id).terminate("test session finished")


async def delete_runs(platform: Platform) -> None:
    """Delete every Run a test left, so its slots are free for the next test."""
    from kruntimes.client import Client

    async with Client(platform.config) as client:
        runs = await client.list()
        await asyncio.gather(*(client.delete(r.metadata.name, r.metadata.namespace) for r in runs))


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
