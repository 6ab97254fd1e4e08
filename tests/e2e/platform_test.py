"""A user's path through the CLI: real `krt up --detach` on a fresh state dir, real HTTPS, a
function that reaches none of the platform's listeners, and a restart of the platform on the same
state dir that keeps a Ready Run invokable."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import krt_cli
from tests.support.waiting import eventually_blocking


class Krt:
    def __init__(self, state: Path) -> None:
        self.state = state

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        done = krt_cli.krt(self.state, *args, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"krt {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args).stdout)


@pytest.fixture
def krt(tmp_path: Path) -> Iterator[Krt]:
    cli = Krt(tmp_path / "state")
    try:
        yield cli
    finally:
        cli("down", check=False)


# Tries each port of the platform on 127.0.0.1, as a tenant's function would (#48).
PROBE = """
import socket
def handle(payload, context):
    found = {}
    for name, port in payload["ports"].items():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
            found[name] = "connected"
        except OSError as exc:
            found[name] = type(exc).__name__
    return found
"""


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    except OSError:
        return False
    return True


def _wait_ready(krt: Krt, name: str, timeout: float = 90) -> dict[str, Any]:
    run: dict[str, Any] = eventually_blocking(
        lambda: krt.json("run", "get", name, "-o", "json"),
        until=lambda run: run["status"]["phase"] == "Ready",
        within=timeout,
        every=0.2,
        what=f"{name} to be Ready",
    )
    return run


def test_create_ready_invoke_restart_cancel_delete_through_the_cli(krt: Krt, tmp_path: Path) -> None:
    up = krt("up", "--detach")
    assert "Temporal UI" in up.stdout
    status = json.loads(krt("status", "-o", "json").stdout)
    assert {c["component"] for c in status["components"]} >= {"platform", "gateway", "worker", "temporal"}
    assert all(c["state"] == "running" for c in status["components"]), status
    table = krt("status").stdout.splitlines()
    assert table[0].split() == ["COMPONENT", "STATE", "PID", "ISOLATION"]
    assert table[1].split()[:2] == ["platform", "running"]
    assert any(line.startswith("host python-") for line in table), table
    hosts = [c for c in status["components"] if c["component"].startswith("host ")]
    assert hosts and all("own uid per function" in c["isolation"] for c in hosts), (
        "krt status says which isolation is in force (the tests run as root)"
    )
    config = krt.json("config", "view", "-o", "json")
    assert config["gatewayUrl"].startswith("https://127.0.0.1:") and config["token"]

    created = krt.json(
        "run",
        "create",
        "hello",
        "--runtime",
        "python",
        "--source",
        "examples/hello",
        "--handler",
        "main:handle",
        "--wait",
        "-o",
        "json",
    )
    assert created["apiVersion"] == "kruntimes.io/v1alpha1" and created["kind"] == "Run"
    assert created["metadata"]["name"] == "hello" and created["metadata"]["uid"]
    assert created["status"]["phase"] == "Ready"
    assert created["status"]["endpoint"]["url"].startswith(config["gatewayUrl"])

    answer = krt.json(
        "invoke", "hello", "--data", '{"name": "e2e"}', "--invocation-id", "e2e-1", "-o", "json"
    )
    assert answer["outputs"]["greeting"] == "hello, e2e"
    assert answer["invocationId"] == "e2e-1"

    listed = krt("run", "list")
    assert "hello" in listed.stdout and "Ready" in listed.stdout

    # a function (network outbound, the default) reaches none of the platform's listeners: the
    # Temporal frontend, its UI, the gateway, its heartbeat port, the worker's metrics
    ports = json.loads((krt.state / "platform.json").read_text())
    live = {name: port for name, port in ports.items() if _listening(port)}
    assert {"temporal", "gateway"} <= set(live), live
    manifest = tmp_path / "probe.yaml"
    manifest.write_text(
        json.dumps(
            {
                "apiVersion": "kruntimes.io/v1alpha1",
                "kind": "Run",
                "metadata": {"name": "probe"},
                "spec": {
                    "runtime": "python",
                    "source": {"inline": [{"name": "main.py", "content": PROBE}]},
                    "handler": "main:handle",
                },
            }
        )
    )
    krt("run", "create", "-f", str(manifest), "--wait")
    reached = krt.json("invoke", "probe", "--data", json.dumps({"ports": live}), "-o", "json")["outputs"]
    assert reached == dict.fromkeys(live, "ConnectionRefusedError")
    krt("run", "delete", "probe")

    # a restart on the same state dir keeps the Run: its host went away, it recovers onto a new one
    krt("down")
    krt("up", "--detach")
    again = _wait_ready(krt, "hello")
    assert again["metadata"]["uid"] == created["metadata"]["uid"]
    assert again["status"]["endpoint"]["url"] == created["status"]["endpoint"]["url"]
    done = eventually_blocking(  # the new host's first heartbeat reaches the gateway within moments
        lambda: krt("invoke", "hello", "--data", '{"name": "again"}', check=False),
        until=lambda done: done.returncode == 0,
        within=30,
        every=0.2,
        what="an invoke to succeed",
    )
    assert json.loads(done.stdout)["greeting"] == "hello, again"  # without -o: the outputs alone

    krt("run", "cancel", "hello")
    eventually_blocking(
        lambda: krt.json("run", "get", "hello", "-o", "json")["status"]["phase"] == "Cancelled",
        within=60,
        every=0.2,
        what="hello to be Cancelled",
    )
    refused = krt("invoke", "hello", "--data", "{}", check=False)
    assert refused.returncode != 0 and refused.stderr.startswith("krt: ")
    krt("run", "delete", "hello")
    missing = krt("run", "get", "nope", check=False)
    assert missing.returncode == 3 and "Traceback" not in missing.stderr
