"""What an invocation through `krt mcp --listen` (streamable HTTPS) costs over the same one through
the SDK: over HTTP the tool carries the caller's own token to the gateway in an HTTPS session of
its own (docs/mcp.md), where stdio (bench/mcp_calls.py) reuses the server's.

Starts the embedded platform (`krt up --detach` in a new state directory), `krt mcp --listen` with
its defaults (the gateway's certificate, token file and bindings), a Run and a Function of one
replica, and prints the median latency of `invoke` and `functions_invoke` through MCP with the
admin's token, and of the same invocations through the SDK (kruntimes.Client), one at a time.

    .venv/bin/python bench/mcp_http_calls.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import _benchlib  # noqa: F401 - puts the repository root on sys.path; first
import httpx2
from _benchlib import embedded_platform, krt_env
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_calls import RUNTIMES, median_ms, say

from kruntimes.api.function import Function
from kruntimes.api.run import Run
from kruntimes.sdk.client import Client

ECHO = "def handle(p):\n    return {'echo': p}\n"


def document(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "runtime": "python",
            "mode": {"function": {}},
            "source": {"inline": [{"name": "main.py", "content": ECHO}]},
            "handler": "main:handle",
        },
    }


async def main(calls: int) -> None:
    async with embedded_platform(prefix="krt-bench-mcp-http-", runtimes=RUNTIMES) as (state, config):
        ready = Path(tempfile.mkdtemp(prefix="krt-bench-mcp-http-ready-")) / "ready.json"
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "kruntimes.workers.krt", "mcp", "--listen", "127.0.0.1:0", "--ready-file", str(ready)),
            env=krt_env(state),
            stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                while not ready.exists() or not ready.read_text():
                    if server.returncode is not None:
                        raise RuntimeError("krt mcp --listen ended")
                    await asyncio.sleep(0.1)
            url = json.loads(ready.read_text())["url"]
            run, fn = f"mcph-{uuid.uuid4().hex[:6]}", f"mcphf-{uuid.uuid4().hex[:6]}"
            verify = ssl.create_default_context(cafile=str(state / "tls" / "ca.crt"))
            async with (
                Client(config) as sdk,
                httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {config.token}"}, verify=verify, timeout=60
                ) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as mcp,
            ):
                await mcp.initialize()
                await sdk.create(Run.from_dict(document("Run", run)))
                await sdk.functions.apply(Function.from_dict(document("Function", fn)))
                await sdk.wait(run, timeout=120)
                await sdk.functions.wait_ready(fn, timeout=120)
                say(f"== latency over HTTPS MCP, median of {calls} calls one at a time")
                rows = []
                for what, through_mcp, through_sdk in (
                    (
                        "invoke",
                        lambda: mcp.call_tool("invoke", {"name": run, "data": {"n": 1}}),
                        lambda: sdk.invoke(run, {"n": 1}),
                    ),
                    (
                        "functions_invoke",
                        lambda: mcp.call_tool("functions_invoke", {"name": fn, "data": {"n": 1}}),
                        lambda: sdk.functions.invoke(fn, {"n": 1}),
                    ),
                ):
                    answer = await through_mcp()
                    assert not answer.is_error, answer.content
                    m = await median_ms(through_mcp, calls)
                    s = await median_ms(through_sdk, calls)
                    rows.append(
                        {
                            "operation": what,
                            "mcpMs": round(m, 2),
                            "sdkMs": round(s, 2),
                            "ratio": round(m / s, 2),
                        }
                    )
                    say(f"{what:17} MCP {m:7.2f} ms   SDK {s:7.2f} ms   ratio {m / s:5.2f}")
                await sdk.functions.delete(fn)
                await sdk.delete(run)
                say(json.dumps({"bench": "mcp-http", "calls": calls, "rows": rows}))
        finally:
            if server.returncode is None:
                server.terminate()
                await server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
