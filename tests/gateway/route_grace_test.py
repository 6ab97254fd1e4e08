"""A Run's invocation that reaches the gateway a moment before the Run's route (its host's beat
still on its way, as when the worker sees Ready first) is answered by the Run, not 404."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp

from kruntimes.gateway.server import Gateway
from tests.gateway.conftest import HostProcess, invoke

ECHO = """
def handle(payload):
    return payload
"""


async def test_an_invocation_just_ahead_of_its_runs_route_is_answered_not_404(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess
) -> None:
    uid = str(uuid.uuid4())
    assert gateway.routes.route(uid) is None
    # sent before the Run exists anywhere: its route comes with the registration's beat
    pending = asyncio.create_task(invoke(client, gateway, uid, {"early": 1}))
    await main_host.register(gateway, ECHO, uid=uid, name="early")
    answer = await pending
    assert answer.expect(200).json["outputs"] == {"early": 1}


async def test_an_unknown_run_uid_is_still_404(gateway: Gateway, client: aiohttp.ClientSession) -> None:
    (await invoke(client, gateway, str(uuid.uuid4()))).expect(404, "RunNotFound")
