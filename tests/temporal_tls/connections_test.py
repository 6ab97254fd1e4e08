"""Every kruntimes client of Temporal — the SDK, the `krt` CLI, `krt worker` and the gateway's
known-Runs view — connects through TLS, mutual TLS and an API key as configured (TemporalSettings,
--temporal-* flags, KRT_* variables, client.json), and is refused without the right credentials,
never printing an API key."""

from __future__ import annotations

import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from kruntimes.contracts.names import run_workflow_id
from kruntimes.pki.local import ensure_tls
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import ConfigError
from kruntimes.temporal.connect import connect
from kruntimes.wire import search_typed
from tests.support.pki import GATEWAY, TestPKI
from tests.support.waiting import eventually
from tests.temporal_tls.conftest import (
    ALLOWED,
    API_KEY,
    REFUSED,
    Access,
    Stack,
    process,
    run,
    secret_free,
)

UNREACHABLE = 4  # kruntimes.cli.main's exit code for a ConfigError
WAIT_S = 30.0


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float = WAIT_S) -> None:
    await eventually(check, within=within, what=what, every=0.1)


# -- SDK ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALLOWED)
async def test_the_sdk_connects(stack: Stack, access: dict[str, Access], name: str) -> None:
    how = access[name]
    before = how.proxy.forwarded
    client = await connect(how.settings())
    await client.count_workflows()
    async with Client(ClientConfig(**how.client_json())) as krt:  # the facade, from client.json fields
        assert isinstance(await krt.list(), list)
    assert how.proxy.forwarded > before, "it came through the proxy"


@pytest.mark.parametrize("name", REFUSED)
async def test_the_sdk_is_refused_without_the_right_credentials(
    stack: Stack, access: dict[str, Access], name: str
) -> None:
    how = access[name]
    with pytest.raises(RuntimeError) as raw:
        await connect(how.settings())
    secret_free(str(raw.value))
    if how.system_roots:
        return  # client.json turns TLS on by its files: no system-roots case there
    async with Client(ClientConfig(**how.client_json())) as krt:
        with pytest.raises(ConfigError) as caught:
            await krt.list()
    secret_free(str(caught.value))


async def test_an_api_key_is_sent_only_as_the_bearer_credential(
    stack: Stack, access: dict[str, Access]
) -> None:
    refused = stack.api_key.refused
    await (await connect(access["api-key-file"].settings())).count_workflows()
    assert stack.api_key.refused == refused
    with pytest.raises(RuntimeError):
        await connect(access["api-key-wrong"].settings())
    assert stack.api_key.refused == refused + 1


# -- the krt CLI -----------------------------------------------------------------------------------


def cli_env(stack: Stack, extra: dict[str, str]) -> dict[str, str]:
    state = stack.root / f"cli-{uuid.uuid4().hex[:8]}"
    state.mkdir()
    return {"KRT_STATE_DIR": str(state), **extra}


@pytest.mark.parametrize("name", ["tls-server-name", "mtls", "api-key-file", "api-key"])
async def test_the_cli_connects_with_krt_variables(
    stack: Stack, access: dict[str, Access], name: str
) -> None:
    code, out, err = await run(
        ["-m", "kruntimes.workers.krt", "run", "list", "-o", "json"], env=cli_env(stack, access[name].env())
    )
    assert code == 0, err
    assert json.loads(out)["kind"] == "RunList"
    secret_free(out + err)


@pytest.mark.parametrize("name", ["mtls", "api-key"])
async def test_the_cli_connects_with_client_json(stack: Stack, access: dict[str, Access], name: str) -> None:
    env = cli_env(stack, {})
    clientconfig.write(Path(env["KRT_STATE_DIR"]), ClientConfig(**access[name].client_json()))
    code, out, err = await run(["-m", "kruntimes.workers.krt", "run", "list", "-o", "json"], env=env)
    assert code == 0, err
    secret_free(out + err)
    # `krt config view` shows where it connects, and no secret
    code, out, err = await run(["-m", "kruntimes.workers.krt", "config", "view", "-o", "json"], env=env)
    assert code == 0, err
    assert json.loads(out)["temporalAddress"] == access[name].proxy.address
    secret_free(out + err)


@pytest.mark.parametrize("name", ["plaintext", "mtls-no-certificate", "mtls-other-ca", "api-key-wrong"])
async def test_the_cli_is_refused_without_the_right_credentials(
    stack: Stack, access: dict[str, Access], name: str
) -> None:
    code, out, err = await run(
        ["-m", "kruntimes.workers.krt", "run", "list"], env=cli_env(stack, access[name].env())
    )
    assert code == UNREACHABLE, (code, err)
    assert "cannot reach Temporal" in err
    secret_free(out + err)


# -- krt worker ----------------------------------------------------------------------------------


async def pollers(stack: Stack, queue: str) -> int:
    answer = await stack.direct.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace="default",
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return len(answer.pollers)


def worker_argv(stack: Stack, how: Access, queue: str, pki: TestPKI) -> list[str]:
    state = stack.root / f"worker-{queue}"
    state.mkdir()
    trust = pki.worker_trust()
    return [
        "-m",
        "kruntimes.workers.worker",
        *how.flags(),
        *("--peer-tls", str(trust.peer_tls), "--assignment-key", str(trust.assignment_key)),
        *("--platform-ca", str(trust.platform_ca)),
        "--state-dir",
        str(state),
        "--queues",
        "runs",
        "--task-queue",
        queue,
        "--pool-task-queue",
        f"{queue}-pool",
        "--log-level",
        "warning",
    ]


@pytest.mark.parametrize("name", ["mtls", "api-key-file"])
async def test_the_worker_connects_and_polls(
    stack: Stack, access: dict[str, Access], name: str, pki: TestPKI
) -> None:
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    log = stack.root / f"{queue}.log"
    async with process(worker_argv(stack, access[name], queue, pki), log=log) as worker:

        async def polling() -> bool:
            assert worker.returncode is None, log.read_text()
            return await pollers(stack, queue) > 0

        await until(polling, "the worker to poll its task queue through the proxy")
    secret_free(log.read_text())


@pytest.mark.parametrize("name", ["mtls-no-certificate", "api-key-none"])
async def test_the_worker_is_refused_without_the_right_credentials(
    stack: Stack, access: dict[str, Access], name: str, pki: TestPKI
) -> None:
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    code, out, err = await run(worker_argv(stack, access[name], queue, pki))
    assert code != 0
    assert await pollers(stack, queue) == 0
    secret_free(out + err)


# -- the gateway's known-Runs view ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def known_run(stack: Stack) -> AsyncIterator[str]:
    """A RunWorkflow that exists and is not finished (no worker polls its queue): a known Run;
    terminated at the end."""
    uid, name = str(uuid.uuid4()), f"known-{uuid.uuid4().hex[:6]}"
    handle = await stack.direct.start_workflow(
        "RunWorkflow",
        id=run_workflow_id("default", name),
        task_queue=f"nobody-{uid}",
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(search_typed.KRT_RUN_UID, uid),
                SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                SearchAttributePair(search_typed.KRT_RUNTIME, "python"),
                SearchAttributePair(search_typed.KRT_PHASE, "Pending"),
            ]
        ),
    )
    try:
        yield uid
    finally:
        await handle.terminate("the test is over")


def gateway_argv(stack: Stack, how: Access, ready: Path, pki: TestPKI) -> tuple[list[str], str]:
    tls = ensure_tls(stack.root / "gateway-tls")
    token = f"gw-token-{uuid.uuid4().hex}"
    tokens, bindings = stack.root / f"tokens-{ready.stem}.csv", stack.root / "bindings.yaml"
    tokens.write_text(f'{token},alice,1000,"devs"\n')
    tokens.chmod(0o600)
    bindings.write_text("bindings:\n  - namespace: default\n    users: [alice]\n")
    argv = [
        "-m",
        "kruntimes.workers.gateway",
        "--listen",
        "127.0.0.1:0",
        "--cert",
        str(tls.cert),
        "--key",
        str(tls.key),
    ]
    argv += ["--token-file", str(tokens), "--role-bindings", str(bindings), "--ready-file", str(ready)]
    argv += ["--peer-tls", str(pki.directory(GATEWAY)), "--assignment-public-key", str(pki.public_key)]
    return [*argv, *how.flags(), "--log-level", "warning"], token


@pytest.mark.parametrize("name", ["tls-server-name", "mtls", "api-key-file"])
async def test_the_gateway_reads_known_runs_through_the_proxy(
    stack: Stack, access: dict[str, Access], name: str, pki: TestPKI
) -> None:
    ready = stack.root / f"gateway-{uuid.uuid4().hex[:8]}.json"
    argv, token = gateway_argv(stack, access[name], ready, pki)
    async with known_run(stack) as uid, process(argv, log=ready.with_suffix(".log")) as gateway:

        async def started() -> bool:
            assert gateway.returncode is None, ready.with_suffix(".log").read_text()
            return ready.exists()

        await until(started, "the gateway to serve")
        url = json.loads(ready.read_text())["url"]
        context = ssl.create_default_context(cafile=str(stack.root / "gateway-tls" / "ca.crt"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:

            async def status_of(run_uid: str) -> int:
                url_of = f"{url}/v1/namespaces/default/runtimes/python/functions/{run_uid}:invoke"
                async with http.post(url_of, headers={"Authorization": f"Bearer {token}"}) as answer:
                    return answer.status

            async def listed() -> bool:
                # an unknown uid: 503 while the gateway starts (nothing listed yet), then 404
                return await status_of(str(uuid.uuid4())) == 404

            await until(listed, "the gateway's known-Runs view to be read")
            assert await status_of(uid) == 503  # known, not ready: the view came through the proxy
    secret_free(ready.with_suffix(".log").read_text())


@pytest.mark.parametrize("name", ["api-key-none", "mtls-other-ca"])
async def test_the_gateway_does_not_start_without_the_right_credentials(
    stack: Stack, access: dict[str, Access], name: str, pki: TestPKI
) -> None:
    ready = stack.root / f"gateway-{uuid.uuid4().hex[:8]}.json"
    argv, _ = gateway_argv(stack, access[name], ready, pki)
    code, out, err = await run(argv)
    assert code != 0 and not ready.exists()
    assert "krt gateway: cannot connect to Temporal" in err
    secret_free(out + err)
    assert API_KEY not in err
