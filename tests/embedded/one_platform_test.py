"""One platform per state directory, through the real CLI: `krt up` on a directory whose platform
runs, or whose supervisor was SIGKILLed while its dev server, gateway, worker and hosts kept
running, refuses with the command that stops it and starts no second dev server on the database;
`krt down` then ends every process of the platform in one call and no host is started after it;
`krt up` again serves on the same ports, so a Run keeps its URL."""

from __future__ import annotations

import json

import pytest

from tests.embedded.platform_support import Embedded, dev_servers_on
from tests.support.procs import kill, same_alive
from tests.support.waiting import eventually_blocking

HELLO = ("--runtime", "python", "--source", "examples/hello", "--handler", "main:handle")


@pytest.mark.timeout(400)
def test_a_killed_supervisor_leaves_one_platform_that_down_ends_and_up_restores_at_the_same_urls(
    embedded: Embedded,
) -> None:
    created = json.loads(embedded.ok("run", "create", "hello", *HELLO, "--wait", "-o", "json").stdout)
    url = created["status"]["endpoint"]["url"]
    # an async invocation through `krt up`'s gateway, which records it sealed with the platform's
    # codec keys for its worker to read and run
    embedded.ok("invoke", "hello", "--async", "--id", "up-async-1", "-d", '{"name": "async"}')
    waited = embedded.ok("invocation", "wait", "hello", "up-async-1", "--timeout", "60", "-o", "json")
    assert json.loads(waited.stdout)["state"] == "Succeeded", waited.stdout
    ports = json.loads((embedded.state / "platform.json").read_text())
    stop_command = f"`KRT_STATE_DIR={embedded.state} krt down`"

    again = embedded.krt("up", "--detach")
    assert again.returncode == 4, again.stderr
    supervisor = embedded.proc("platform")
    assert again.stderr.strip() == (
        f"krt: the platform already runs from {embedded.state} (pid {supervisor.pid});"
        f" stop it with {stop_command}"
    )

    # the supervisor dies without a word; its components and hosts keep serving
    kill(supervisor)
    eventually_blocking(lambda: not same_alive(supervisor), within=30, what="the supervisor to end")
    platform = embedded.processes()
    hosts = embedded.hosts_running()
    assert hosts and {"temporal", "front", "gateway", "worker"} <= set(embedded.record().live_components())

    code, rows = embedded.status()
    assert code == 1 and rows["platform"]["state"] == "down"
    assert all(rows[name]["state"] == "running" for name in ("temporal", "front", "gateway", "worker")), rows
    told = embedded.krt("status")
    assert (
        "the supervisor is gone but temporal, front, gateway, worker" in told.stderr
        and "`krt down`" in told.stderr
    )

    refused = embedded.krt("up", "--detach")
    assert refused.returncode == 4
    assert refused.stderr.startswith(
        f"krt: the supervisor of the platform in {embedded.state} is gone but its temporal (pid "
    ), refused.stderr
    assert refused.stderr.strip().endswith(
        f"still run; stop them with {stop_command}, then `krt up` again (same ports)"
    )
    assert len(dev_servers_on(embedded.state)) == 1, "no second dev server on the same database"
    assert json.loads((embedded.state / "platform.json").read_text()) == ports

    down = embedded.ok("down")
    assert down.stdout.startswith(f"kruntimes is not running from {embedded.state} (stopped 4 component(s)")
    left = [p for p in platform if same_alive(p)]
    assert left == [], f"processes of the platform still run after `krt down`: {left}"
    assert embedded.hosts_running() == set(), "no host was started after `krt down`"
    assert dev_servers_on(embedded.state) == []
    code, rows = embedded.status()
    assert code == 1 and {row["state"] for row in rows.values()} == {"down"}

    embedded.ok("up", "--detach")
    assert json.loads((embedded.state / "platform.json").read_text()) == ports
    ready = eventually_blocking(
        lambda: json.loads(embedded.ok("run", "get", "hello", "-o", "json").stdout),
        until=lambda run: run["status"]["phase"] == "Ready",
        within=120,
        every=0.2,
        what="hello to be Ready again",
    )
    assert ready["metadata"]["uid"] == created["metadata"]["uid"]
    assert ready["status"]["endpoint"]["url"] == url
    answered = eventually_blocking(
        lambda: embedded.krt("invoke", "hello", "--data", '{"name": "again"}'),
        until=lambda done: done.returncode == 0,
        within=60,
        every=0.2,
        what="an invoke at the same URL to succeed",
    )
    assert json.loads(answered.stdout)["greeting"] == "hello, again"
