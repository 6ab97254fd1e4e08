"""Routes live only as long as their host's heartbeats: a silent host is forgotten after three
intervals, a host that stops says `leaving` and is forgotten at once."""

from __future__ import annotations

import signal
import time

import aiohttp

from kruntimes.gateway.routes import MISSED_INTERVALS
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

    host.signal(signal.SIGSTOP)  # alive, but no heartbeat leaves it
    try:
        stopped = time.monotonic()
        await wait_for(lambda: gateway.routes.route(fn.uid) is None, "the route to expire", 5)
        gone = time.monotonic() - stopped
        assert gone <= MISSED_INTERVALS * HEARTBEAT_S + 2.0
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
    # a long interval: expiry would take 30 s, so only `leaving` can make the route go quickly
    host = await hosts.start("gw-leaving", interval_s=10.0)
    fn = await host.register(gateway, ECHO)
    (await invoke(client, gateway, fn.uid)).expect(200)
    hosts_before = gateway.routes.hosts()

    host.signal(signal.SIGTERM)
    took = await wait_for(lambda: gateway.routes.route(fn.uid) is None, "the route to go", 5)
    assert took < 5
    assert gateway.routes.hosts() == hosts_before - 1
    (await invoke(client, gateway, fn.uid)).expect(404, "RunNotFound")
    assert await host.exited(10)
