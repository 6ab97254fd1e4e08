"""The control plane the end-to-end suites run against, in this test process: the real Temporal
dev server (in memory), an HTTPS gateway with the embedded token authorizer on ports picked at run
time, and the worker (started again should one of its Temporal workers stop on its own, as `krt up`
does). Each suite adds what it runs hosts on (tests/sdk: runtime host processes;
tests/kubernetes: the test cluster) and keeps its own view of the platform."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from temporalio.client import Client as TemporalClient

from kruntimes.activities.hosts.kubernetes import KubernetesAccess
from kruntimes.activities.hosts.process import stop_all
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.providers import HostDefaults
from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.server import Gateway, GatewayOptions
from kruntimes.gateway.visibility import Visibility
from kruntimes.pki.local import TlsFiles, ensure_tls
from kruntimes.sdk.config import ClientConfig
from kruntimes.temporal.codec import ensure_key
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import RunningWorkers, running_workers, until_stopped
from kruntimes.workers.settings import WorkerSettings
from tests.support.pki import TestPKI

log = logging.getLogger(__name__)

# Every user in a stack's token file belongs to `devs` or to a group bound to nothing.
BINDINGS = "bindings:\n- namespace: '*'\n  groups: [devs]\n"
# A stack whose workers keep ending stops starting them: its tests then fail on what ended.
MAX_WORKER_STARTS = 4


class SupervisedWorkers:
    """The stack's workers, started again when one of their Temporal workers stops without being
    asked, as `krt up` starts `krt worker` again when it exits (workers/worker.py): left as they
    were, the stack would serve only some of its task queues, and every later Run would wait for a
    pool nobody polls. `endings` says what ended, for the fixtures to report
    (`take_endings`)."""

    def __init__(self, temporal: TemporalClient, settings: WorkerSettings) -> None:
        self.temporal = temporal
        self.settings = settings
        self.running: RunningWorkers | None = None
        self.endings: list[str] = []
        self._stop = asyncio.Event()
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def take_endings(self) -> list[str]:
        """What ended since the last call."""
        taken, self.endings = self.endings, []
        return taken

    async def __aenter__(self) -> SupervisedWorkers:
        self._stop.clear()  # entered again after an exit: a test stopped the workers for a while
        self._up.clear()
        self._task = asyncio.create_task(self._supervise())
        up = asyncio.ensure_future(self._up.wait())
        try:
            await asyncio.wait({up, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        if self._task.done():
            await self._task  # the first start failed: its error, as running_workers raised it
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _supervise(self) -> None:
        for starts in range(1, MAX_WORKER_STARTS + 1):
            async with running_workers(self.temporal, self.settings) as running:
                self.running = running
                self._up.set()
                ended = await until_stopped(self._stop, running)
            if ended is None or self._stop.is_set():
                return
            self.endings.append(ended)
            again = starts < MAX_WORKER_STARTS
            log.warning("%s; the stack %s its workers again", ended, "starts" if again else "does not start")
        await self._stop.wait()


@dataclass
class Stack:
    state_dir: Path
    config: ClientConfig  # what the SDK needs to reach this stack, as the first token's user
    temporal: TemporalClient
    gateway: Gateway
    dev_server: DevServer
    tls: TlsFiles
    workers: SupervisedWorkers

    def parts(self) -> dict[str, Any]:
        """The fields, to build a suite's view of the platform (a subclass) from."""
        return {f.name: getattr(self, f.name) for f in fields(Stack)}


def local_gateway_options(tls: TlsFiles, **options: Any) -> GatewayOptions:
    """A gateway on 127.0.0.1 serving ``tls``'s certificate, its HTTPS and heartbeat ports picked
    when it starts; ``options``: the rest of its GatewayOptions."""
    return GatewayOptions(
        listen_host="127.0.0.1",
        listen_port=0,
        heartbeat_listen="127.0.0.1:0",
        cert_file=tls.cert,
        key_file=tls.key,
        **options,
    )


def inline_manifest(
    name: str,
    *,
    runtime: str,
    source: str,
    mode: dict[str, Any] | None = None,
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """A Run of an inline python function `main:handle` whose main.py is ``source``."""
    return {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtime": runtime,
            "mode": mode or {"function": {}},
            "source": {"inline": [{"name": "main.py", "content": source}]},
            "handler": "main:handle",
            **spec,
        },
    }


@contextlib.asynccontextmanager
async def running_stack(
    root: Path,
    pki: TestPKI,
    *,
    runtimes: list[dict[str, Any]],
    tokens: dict[str, str],
    codec: bool = False,
    host_defaults: HostDefaults | None = None,
    probe_interval_s: float | None = 60.0,
    kubernetes: KubernetesAccess | None = None,
    control_plane_id: str | None = None,
) -> AsyncIterator[Stack]:
    """The stack under ``root``; ``tokens`` maps each bearer token to its token-file fields
    (`user,uid,"groups"`), the first one is the client config's. With ``codec``, payloads in
    Temporal are encrypted with a key made under ``root``. On exit the Runs left are terminated,
    then the worker, the process hosts under the state dir, the gateway and the dev server stop."""
    state = root / "state"
    state.mkdir(parents=True)
    server = DevServer(state_dir=root / "temporal", persistent=False)
    await asyncio.to_thread(server.start)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(server.stop)
        codec_keys = str(ensure_key(root / "codec-keys")) if codec else None
        temporal = await connect(TemporalSettings(address=server.address, codecKeys=codec_keys))
        tls = ensure_tls(root / "tls")
        token_file = root / "tokens.csv"
        token_file.write_text("".join(f"{token},{user}\n" for token, user in tokens.items()))
        token_file.chmod(0o600)
        gateway = Gateway(
            local_gateway_options(
                tls,
                authorizer=CachingAuthorizer(
                    EmbeddedAuthorizer(TokenFile(token_file), RoleBindings.from_yaml(BINDINGS))
                ),
                temporal=await Visibility.connect(
                    TemporalSettings(address=server.address, codecKeys=codec_keys)
                ),
                known_refresh_s=0.5,
                peer_tls=pki.gateway,
                assignments=pki.verifier(),
            )
        )
        url = await gateway.start()
        stack.push_async_callback(gateway.stop)
        settings = WorkerSettings(
            temporal=TemporalSettings(address=server.address, namespace="default"),
            config=parse_config({"runtimes": runtimes}),
            host_defaults=host_defaults or HostDefaults(),
            platform=PlatformInfo(
                gatewayUrl=url,
                caBundle=tls.ca_cert.read_text(),
                stateDir=str(state),
                gatewayHeartbeats=[gateway.heartbeat_address],
                heartbeatIntervalSeconds=0.5,
            ),
            probe_interval_s=probe_interval_s,
            trust=pki.worker_trust(),
            provider_options={"kubernetes": kubernetes} if kubernetes is not None else {},
            control_plane_id=control_plane_id,
        )
        stack.push_async_callback(stop_all, state)
        workers = await stack.enter_async_context(SupervisedWorkers(temporal, settings))
        stack.push_async_callback(terminate_runs, temporal)
        config = ClientConfig(
            temporalAddress=server.address,
            temporalNamespace="default",
            gatewayUrl=url,
            caFile=str(tls.ca_cert),
            token=next(iter(tokens)),
            uiUrl=server.ui_url,
            codecKeys=codec_keys,
            stateDir=str(state),
        )
        yield Stack(state, config, temporal, gateway, server, tls, workers)


async def terminate_runs(temporal: TemporalClient) -> None:
    """Stop what the tests left running, so the worker shuts down at once."""
    async for execution in temporal.list_workflows("ExecutionStatus='Running'"):
        with contextlib.suppress(Exception):
            await temporal.get_workflow_handle(execution.id).terminate("tests finished")
