"""What a tool call of `krt mcp` costs over the same operation through the SDK.

Starts the embedded platform (`krt up --detach` in a new state directory), `krt mcp` over stdio
with the official MCP SDK's client, and prints a short session transcript (the tools listed, a
Run created, waited for and invoked), then the median latency of `invoke` and `run_get` through
MCP and through the SDK (kruntimes.Client) one call at a time, and their ratio.

    .venv/bin/python bench/mcp_calls.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import _benchlib  # noqa: F401 - puts the repository root on sys.path; first
from _benchlib import embedded_platform, krt_env
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kruntimes.sdk.client import Client

RUNTIMES = "runtimes:\n  - name: python\n    adapter: python\n    runs: 4\n    minHosts: 1\n    maxHosts: 1\n"
ECHO = "def handle(p):\n    return {'echo': p}\n"


async def median_ms(call: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(min(20, n)):  # warm: connections, caches
        await call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def say(line: str) -> None:
    print(line, flush=True)


async def main(calls: int) -> None:
    async with embedded_platform(prefix="krt-bench-mcp-", runtimes=RUNTIMES) as (state, config):
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "kruntimes.workers.krt", "mcp"], env=krt_env(state)
        )
        name = f"mcp-{uuid.uuid4().hex[:6]}"
        manifest = {
            "apiVersion": "kruntimes.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name},
            "spec": {
                "runtime": "python",
                "mode": {"function": {}},
                "source": {"inline": [{"name": "main.py", "content": ECHO}]},
                "handler": "main:handle",
            },
        }
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as mcp,
            Client(config) as sdk,
        ):
            await mcp.initialize()
            say("== session transcript")
            tools = (await mcp.list_tools()).tools
            say(f"> tools/list\n< {', '.join(t.name for t in tools)}")
            created = await mcp.call_tool("run_create", {"manifest": manifest, "wait": True})
            say(f"> tools/call run_create {{manifest: {name}, wait: true}}\n< {created.content[0].text}")  # type: ignore[union-attr]
            answer = await mcp.call_tool("invoke", {"name": name, "data": {"hello": "agent"}})
            say(f"> tools/call invoke {{name: {name}, data: {{hello: agent}}}}\n< {answer.content[0].text}")  # type: ignore[union-attr]
            history = await mcp.call_tool("run_history", {"name": name})
            say(f"> tools/call run_history {{name: {name}}}\n< {history.content[0].text}")  # type: ignore[union-attr]

            say(f"\n== latency, median of {calls} calls one at a time")
            rows = []
            for what, through_mcp, through_sdk in (
                (
                    "invoke",
                    lambda: mcp.call_tool("invoke", {"name": name, "data": {"n": 1}}),
                    lambda: sdk.invoke(name, {"n": 1}),
                ),
                ("run_get", lambda: mcp.call_tool("run_get", {"name": name}), lambda: sdk.get(name)),
            ):
                m = await median_ms(through_mcp, calls)
                s = await median_ms(through_sdk, calls)
                rows.append(
                    {"operation": what, "mcpMs": round(m, 2), "sdkMs": round(s, 2), "ratio": round(m / s, 2)}
                )
                say(f"{what:8} MCP {m:7.2f} ms   SDK {s:7.2f} ms   ratio {m / s:5.2f}")
            await sdk.delete(name)
            say(json.dumps({"bench": "mcp", "calls": calls, "rows": rows}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
