"""`krt status` tells the truth, through the real CLI against a real platform: each component
(the dev server, its front, the gateway, the worker) killed while its supervisor cannot start it again is
listed down and the command exits 1; one that keeps failing to start is listed restarting with
its attempt and last error; `--wait` on a Run that waits for a missing worker names it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.embedded.platform_support import Embedded
from tests.support.embedded import embedded_platform
from tests.support.procs import frozen, kill, same_alive
from tests.support.waiting import eventually_blocking

HELLO = ("--runtime", "python", "--source", "examples/hello", "--handler", "main:handle")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    """One platform for the tests below that each leave every component running again."""
    with embedded_platform(tmp_path_factory.mktemp("status") / "state") as platform:
        yield platform


def _all_running(embedded: Embedded) -> None:
    eventually_blocking(
        lambda: embedded.status()[0] == 0, within=120, every=0.2, what="every component to run again"
    )


@pytest.mark.timeout(600)
def test_each_component_killed_is_listed_down_and_status_exits_non_zero(shared: Embedded) -> None:
    embedded = shared
    code, rows = embedded.status()
    assert code == 0 and set(rows) >= {"platform", "temporal", "front", "gateway", "worker"}
    assert {row["state"] for row in rows.values()} == {"running"}, rows
    supervisor = embedded.proc("platform")
    for name in ("worker", "gateway", "front", "temporal"):
        component = embedded.proc(name)
        with frozen(supervisor.pid):  # it cannot start the component again meanwhile
            kill(component)
            eventually_blocking(lambda c=component: not same_alive(c), within=30, what=f"{name} to end")
            told = embedded.krt("status")
            assert told.returncode == 1, told.stdout
            line = next(ln for ln in told.stdout.splitlines() if ln.split()[0] == name)
            assert line.split()[1:3] == ["down", str(component.pid)], told.stdout
            assert told.stderr.startswith("not running: ") and name in told.stderr, told.stderr
            code, rows = embedded.status()
            assert code == 1 and rows[name]["state"] == "down" and rows["platform"]["state"] == "running"
        _all_running(embedded)


@pytest.mark.timeout(400)
def test_wait_names_the_missing_worker_instead_of_waiting_for_capacity(shared: Embedded) -> None:
    embedded = shared
    supervisor = embedded.proc("platform")
    with frozen(supervisor.pid):
        kill(embedded.proc("worker"))
        eventually_blocking(lambda: embedded.status()[1]["worker"]["state"] == "down", within=30)
        waited = embedded.krt("run", "create", "late", *HELLO, "--wait", "--wait-timeout", "8")
        assert waited.returncode != 0
        assert "run/late: Pending (" in waited.stderr
        assert "- the worker is down: the Run waits for it (`krt status` shows the platform)" in waited.stderr
    _all_running(embedded)
    done = embedded.krt("run", "wait", "late", "--timeout", "120")
    assert done.returncode == 0, done.stderr
    assert "waits for it" not in done.stderr, "nothing is missing any more"


@pytest.mark.timeout(400)
def test_a_component_that_keeps_failing_to_start_is_restarting_with_its_attempt_and_last_error(
    embedded: Embedded,
) -> None:
    """A platform of its own: its gateway's attempts and last error count from this test's kill."""
    supervisor = embedded.proc("platform")
    port = int(json.loads((embedded.state / "platform.json").read_text())["gateway"])
    with socket.socket() as taken:
        with frozen(supervisor.pid):
            gateway = embedded.proc("gateway")
            kill(gateway)
            eventually_blocking(lambda: not same_alive(gateway), within=30, what="the gateway to end")
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # the killed gateway's connections may hold the port a moment longer
            eventually_blocking(
                lambda: taken.bind(("127.0.0.1", port)) or True, ignoring=(OSError,), within=60
            )
            taken.listen()  # the gateway cannot listen on its port while this does
        row = eventually_blocking(
            lambda: embedded.status()[1]["gateway"],
            until=lambda row: row["state"] == "restarting" and row["attempt"] >= 2,
            within=120,
            every=0.2,
            what="the gateway to be restarting, a second attempt at least",
        )
        assert row["lastError"].startswith(
            "exited with code 1: OSError: [Errno 98] Address already in use"
        ), row
        told = embedded.krt("status")
        assert told.returncode == 1
        line = next(ln for ln in told.stdout.splitlines() if ln.startswith("gateway "))
        assert "restarting (attempt " in line and ": exited with code 1: OSError: " in line, line
        assert "Address already in use" in line, line
    _all_running(embedded)
