"""A real Temporal dev server behind three TLS-terminating loopback proxies (tests/temporal_tls/
proxy.py): server TLS, mutual TLS, and TLS with an API key. `Access` is one way of connecting,
spelled as each client takes it: TemporalSettings (SDK), the --temporal-* flags (worker, gateway),
KRT_* variables and client.json fields (CLI, SDK).

Everything listens on 127.0.0.1 with ports picked at run time; every process a test starts is
stopped by its pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import Client as TemporalClient

from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from tests.temporal_tls.pki import Pair, Pki, make_pki
from tests.temporal_tls.proxy import TemporalProxy

REPO = Path(__file__).resolve().parents[2]
API_KEY = f"temporal-api-key-{uuid.uuid4().hex}"
WRONG_KEY = f"temporal-wrong-key-{uuid.uuid4().hex}"
PROCESS_WAIT_S = 60.0


@dataclass
class Stack:
    root: Path
    server: DevServer
    pki: Pki
    tls: TemporalProxy
    mtls: TemporalProxy
    api_key: TemporalProxy
    key_file: Path
    wrong_key_file: Path
    direct: TemporalClient  # plain, to the dev server itself: for looking at what clients did

    def proxy(self, mode: str) -> TemporalProxy:
        return {"tls": self.tls, "mtls": self.mtls, "api-key": self.api_key}[mode]


@dataclass(frozen=True)
class Access:
    """One way of connecting to Temporal through a proxy."""

    proxy: TemporalProxy
    ca: Path | None = None
    cert: Pair | None = None
    server_name: str | None = None
    api_key_file: Path | None = None
    api_key: str | None = None  # the key itself (KRT_TEMPORAL_API_KEY, client.json temporalApiKey)
    system_roots: bool = False  # TLS, verified with the system's roots

    def settings(self) -> TemporalSettings:
        return TemporalSettings(
            address=self.proxy.address,
            tls=self.system_roots,
            tlsCa=str(self.ca) if self.ca else None,
            tlsCert=str(self.cert.cert) if self.cert else None,
            tlsKey=str(self.cert.key) if self.cert else None,
            tlsServerName=self.server_name,
            apiKeyFile=str(self.api_key_file) if self.api_key_file else None,
            apiKey=self.api_key,
        )

    def flags(self) -> list[str]:
        flags = ["--temporal-address", self.proxy.address]
        if self.system_roots:
            flags.append("--temporal-tls")
        if self.ca:
            flags += ["--temporal-tls-ca", str(self.ca)]
        if self.cert:
            flags += ["--temporal-tls-cert", str(self.cert.cert), "--temporal-tls-key", str(self.cert.key)]
        if self.server_name:
            flags += ["--temporal-tls-server-name", self.server_name]
        if self.api_key_file:
            flags += ["--temporal-api-key-file", str(self.api_key_file)]
        assert self.api_key is None, "the flags take the API key from a file"
        return flags

    def client_json(self) -> dict[str, str]:
        """client.json's Temporal fields (those the ClientConfig of the SDK and CLI takes)."""
        fields = {"temporalAddress": self.proxy.address}
        for name, value in (
            ("temporalTlsCa", self.ca),
            ("temporalTlsCert", self.cert.cert if self.cert else None),
            ("temporalTlsKey", self.cert.key if self.cert else None),
            ("temporalTlsServerName", self.server_name),
            ("temporalApiKeyFile", self.api_key_file),
            ("temporalApiKey", self.api_key),
        ):
            if value is not None:
                fields[name] = str(value)
        assert not self.system_roots, "client.json turns TLS on by its files"
        return fields

    def env(self) -> dict[str, str]:
        """The same as KRT_* variables."""
        names = {
            "temporalAddress": "KRT_TEMPORAL_ADDRESS",
            "temporalTlsCa": "KRT_TEMPORAL_TLS_CA",
            "temporalTlsCert": "KRT_TEMPORAL_TLS_CERT",
            "temporalTlsKey": "KRT_TEMPORAL_TLS_KEY",
            "temporalTlsServerName": "KRT_TEMPORAL_TLS_SERVER_NAME",
            "temporalApiKeyFile": "KRT_TEMPORAL_API_KEY_FILE",
            "temporalApiKey": "KRT_TEMPORAL_API_KEY",
        }
        return {names[k]: v for k, v in self.client_json().items()}


def accesses(stack: Stack) -> dict[str, Access]:
    pki = stack.pki
    return {
        # allowed
        "tls": Access(stack.tls, ca=pki.ca),
        "tls-server-name": Access(stack.tls, ca=pki.ca, server_name="localhost"),
        "mtls": Access(stack.mtls, ca=pki.ca, cert=pki.client),
        "api-key-file": Access(stack.api_key, ca=pki.ca, api_key_file=stack.key_file),
        "api-key": Access(stack.api_key, ca=pki.ca, api_key=API_KEY),
        # refused
        "plaintext": Access(stack.tls),
        "tls-system-roots": Access(stack.tls, system_roots=True),
        "mtls-no-certificate": Access(stack.mtls, ca=pki.ca),
        "mtls-other-ca": Access(stack.mtls, ca=pki.ca, cert=pki.rogue_client),
        "api-key-none": Access(stack.api_key, ca=pki.ca),
        "api-key-wrong": Access(stack.api_key, ca=pki.ca, api_key_file=stack.wrong_key_file),
    }


ALLOWED = ["tls", "tls-server-name", "mtls", "api-key-file", "api-key"]
REFUSED = [
    "plaintext",
    "tls-system-roots",
    "mtls-no-certificate",
    "mtls-other-ca",
    "api-key-none",
    "api-key-wrong",
]


def secret_free(text: str) -> None:
    assert API_KEY not in text and WRONG_KEY not in text, "an API key was printed"


@pytest.fixture(scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    root = tmp_path_factory.mktemp("temporal-tls")
    pki = make_pki(root / "pki")
    server = DevServer(state_dir=root / "temporal", persistent=False)
    await asyncio.to_thread(server.start)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(server.stop)
        proxies = [
            TemporalProxy(upstream=server.address, pki=pki, mode="tls"),
            TemporalProxy(upstream=server.address, pki=pki, mode="mtls"),
            TemporalProxy(upstream=server.address, pki=pki, mode="api-key", api_key=API_KEY),
        ]
        for proxy in proxies:
            await proxy.start()
            stack.push_async_callback(proxy.stop)
        key_file, wrong_key_file = root / "api-key", root / "wrong-api-key"
        for path, key in ((key_file, API_KEY), (wrong_key_file, WRONG_KEY)):
            path.write_text(key + "\n")
            path.chmod(0o600)
        direct = await connect(server.address)
        yield Stack(root, server, pki, *proxies, key_file, wrong_key_file, direct)


@pytest.fixture(scope="session")
def access(stack: Stack) -> dict[str, Access]:
    return accesses(stack)


# -- processes ---------------------------------------------------------------------------------


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRT_", "TEMPORAL_"))}
    env.update(extra or {})
    return env


@contextlib.asynccontextmanager
async def process(
    argv: list[str], *, log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A child process of this interpreter, output to `log`; stopped by its pid at the end."""
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            cwd=REPO,
            env=child_env(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()


async def run(argv: list[str], *, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run a child to its end (bounded): exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=REPO,
        env=child_env(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PROCESS_WAIT_S)
    except TimeoutError:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
