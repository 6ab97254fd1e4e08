"""Creates Runs and waits for each through the SDK, in a process of its own (as a user's program
would: the worker's event loop is not this one), and prints when each `wait` returned.

    python -m tests.sdk._waiters TEMPORAL_ADDRESS RUNTIME COUNT IN_FLIGHT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.runs import Runs


def manifest(name: str, runtime: str) -> Run:
    return Run.from_dict(
        {
            "apiVersion": "kruntimes.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "runtime": runtime,
                "mode": {"function": {}},
                "source": {"inline": [{"name": "main.sh", "content": "cat\n"}]},
                "handler": "main.sh",
            },
        }
    )


async def main(address: str, runtime: str, count: int, in_flight: int) -> None:
    runs = Runs(ClientConfig(temporalAddress=address, temporalNamespace="default"))
    gate = asyncio.Semaphore(in_flight)
    returned: dict[str, float] = {}

    async def one(i: int) -> None:
        name = f"wait-{i:04d}"
        async with gate:
            await runs.create(manifest(name, runtime))
        ready = await runs.wait(name, "default", until=None, timeout=240, interval=0.1, on_status=None)
        returned[name] = time.time()
        assert ready.status.phase is RunPhase.Ready, ready.status

    await asyncio.gather(*(one(i) for i in range(count)))
    print(json.dumps(returned))


if __name__ == "__main__":
    address, runtime, count, in_flight = sys.argv[1:5]
    asyncio.run(main(address, runtime, int(count), int(in_flight)))
    # As `krt` does (kruntimes/cli/main.py main): the Temporal client's Rust threads can crash the
    # interpreter's teardown (SIGSEGV, SIGABRT) after the work is done; the answer is printed,
    # so the process leaves without a teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
