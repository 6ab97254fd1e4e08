"""Routes live only as long as their host's heartbeats: a silent host is forgotten (after three
intervals: tests/trust/routes_test.py), a host that stops says `leaving` and is forgotten at once,
long before its routes could expire."""

from __future__ import annotations

import signal

import aiohttp

from kruntimes.gateway.routes import MAX_INTERVAL_MS
from kruntimes.gateway.server import Gateway
from tests.gateway.conftest import HEARTBEAT_S, Hosts, invoke, wait_for, wait_route

ECHO = """
def handle(payload):
    return payload
"""


async def test_a_silent_host_loses_its_routes_after_three_intervals(
    gateway: Gateway, client: aiohttp.ClientSession, hosts: Hosts
) -> None:
    host = await hosts.start("gw-silent", interval_s=HEARTBEAT_S)
    fn = await host.register(gateway, ECHO)
    (await invoke(client, gateway, fn.uid, {"a": 1})).expect(200)
    assert fn.uid not in gateway.known.runs

    hosts_before = gateway.routes.hosts()
    host.signal(signal.SIGSTOP)  # alive, but no heartbeat leaves it
    try:
        # How soon (MISSED_INTERVALS heartbeat intervals) is measured with a fake clock in
        # tests/trust/routes_test.py; here: that silence alone ends the host's routes.
        await wait_for(lambda: gateway.routes.route(fn.uid) is None, "the route to expire", 30)
        assert gateway.routes.hosts() == hosts_before - 1, "the silent host itself is forgotten"
        answer = await invoke(client, gateway, fn.uid)
        answer.expect(404, "RunNotFound")
    finally:
        host.signal(signal.SIGCONT)

    # heard from again: routed again
    await wait_route(gateway, fn.uid, host_uid=host.host_uid)
    assert (await invoke(client, gateway, fn.uid, {"b": 2})).expect(200).json["outputs"] == {"b": 2}


async def test_a_stopping_host_says_leaving_and_its_routes_go_at_once(
    gateway: Gateway, client: aiohttp.ClientSession, hosts: Hosts
) -> None:
    # The longest interval: its routes would expire only MISSED_INTERVALS of them after the last
    # beat, past this test's own timeout, so only `leaving` can make them go while it runs.
    host = await hosts.start("gw-leaving", interval_s=MAX_INTERVAL_MS / 1000)
    fn = await host.register(gateway, ECHO)
    (await invoke(client, gateway, fn.uid)).expect(200)
    hosts_before = gateway.routes.hosts()

    host.signal(signal.SIGTERM)
    await wait_for(lambda: gateway.routes.route(fn.uid) is None, "the route to go", 30)
    assert gateway.routes.hosts() == hosts_before - 1
    (await invoke(client, gateway, fn.uid)).expect(404, "RunNotFound")
    assert await host.exited(10)
