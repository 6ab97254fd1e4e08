"""What the pod evaluator's tests share: an embedded platform with a `krm` runtime (one per test
module) and FunctionConfigs whose podExecutor source is a test program (the programs hold a lock
file while they run: tests.support.locks tells when they are gone)."""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kruntimes.krm import config as fc
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.store import Store
from kruntimes.sdk.client import Client
from tests.sdk.stack import Platform, start
from tests.support import gated
from tests.support.pki import TestPKI

RUNTIME = "krm"
RUNTIMES = [
    {"name": RUNTIME, "adapter": "krm", "runs": 16, "maxHosts": 2},
]

# tests.support.gated's program, saying on stderr which Run served it.
GATED = gated.GATED + 'import os\nsys.stderr.write("run=" + os.environ["KRT_RUN_NAME"])\n'

# Echoes, saying which Run served it.
WHO = """
import os, sys
data = sys.stdin.read()
sys.stderr.write("run=" + os.environ["KRT_RUN_NAME"])
sys.stdout.write(data)
"""

# Holds an exclusive lock on LOCK (it and the child it forks, which ignores SIGTERM as it does),
# touches HELD and sleeps: the lock is free again only when both processes are gone.
_HOLD = """signal.signal(signal.SIGTERM, signal.SIG_IGN)
lock = open({lock!r}, "a")
fcntl.flock(lock, fcntl.LOCK_EX)
os.fork()
pathlib.Path({held!r}).touch()
time.sleep(60)
"""

# Does what _HOLD does, whatever its input.
HOLDER = (
    """
import fcntl, os, pathlib, signal, sys, time
sys.stdin.read()
"""
    + _HOLD
)

# Two kinds of evaluation on one Run: an input with "hold-me" in it does what _HOLD does (LOCK,
# HELD); any other touches STARTED, waits (at most 60 s) until RELEASE exists and echoes its input,
# saying which Run served it on stderr.
SHARED = (
    """
import fcntl, os, pathlib, signal, sys, time
data = sys.stdin.read()
if "hold-me" in data:
"""
    + textwrap.indent(_HOLD, "    ")
    + """pathlib.Path({started!r}).touch()
release, deadline = pathlib.Path({release!r}), time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.stderr.write("run=" + os.environ["KRT_RUN_NAME"])
sys.stdout.write(data)
"""
)


@contextlib.asynccontextmanager
async def krm_platform(factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    async with start(factory.mktemp("krm-platform"), pki, runtimes=RUNTIMES) as platform:
        yield platform


def pod_config(
    name: str,
    body: str,
    *,
    tags: list[str] | None = None,
    entrypoint: list[str] | None = None,
    prefix: str | None = None,
    **executor: Any,
) -> fc.FunctionConfig:
    """`example.com/pod/NAME` (or `prefix`) served by the Python program `body` on Runs."""
    document = {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": "FunctionConfig",
        "metadata": {"name": name},
        "spec": {
            "prefixes": [prefix or f"example.com/pod/{name}"],
            "podExecutor": {
                "tags": tags if tags is not None else ["1.x"],
                "source": {
                    "inline": [{"name": "main.py", "content": body}],
                    "entrypoint": entrypoint or [sys.executable, "main.py"],
                },
                **executor,
            },
        },
    }
    return fc.parse(document, source=name)


def image(name: str, version: str = "v1.0.0") -> str:
    return f"example.com/pod/{name}:{version}"


@contextlib.asynccontextmanager
async def evaluator(platform: Platform, *configs: fc.FunctionConfig) -> AsyncIterator[PodEvaluator]:
    """A pod evaluator over `configs` on the platform; its Runs are deleted after."""
    store = Store()
    store.replace("test", configs)
    async with Client(platform.config) as client:
        pods = PodEvaluator(store, client=client, runtime=RUNTIME, start_timeout=60)
        try:
            yield pods
        finally:
            await pods.close()
