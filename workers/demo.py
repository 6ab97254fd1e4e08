"""`make demo` / `krt demo`: the embedded platform end to end, on a fresh state dir.

Starts the platform (Temporal dev server, worker, gateway, warm hosts), deploys examples/hello
(python) and examples/bash-hello (bash) as function Runs with the SDK, waits until they are
Ready, invokes both over HTTPS through the gateway, prints the answers and the Temporal UI URL,
then deletes the Runs and stops everything. A failing step exits non-zero with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kruntimes.api.run import Run
from kruntimes.cli.main import leave
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client, KruntimesError
from kruntimes.temporal.devserver import temporal_binary
from kruntimes.workers.embedded.commands import down, up
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
READY_TIMEOUT_S = 90.0

FUNCTIONS = [
    ("hello", "python", "main:handle", {"name": "kruntimes"}),
    ("bash-hello", "bash", "hello.sh", {"from": "demo"}),
]


def _run(name: str, runtime: str, handler: str) -> Run:
    return Run.new(
        name,
        runtime=runtime,
        handler=handler,
        path=str(EXAMPLES / name),
        uid=str(uuid.uuid4()),
        mode={"function": {"idleTimeoutSeconds": 600}},
    )


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


async def _exercise(config: clientconfig.ClientConfig) -> None:
    async with Client(config) as krt:
        for name, runtime, handler, _ in FUNCTIONS:
            await krt.create(_run(name, runtime, handler))
            step(f"created Run {name} ({runtime})")
        for name, _, _, _ in FUNCTIONS:
            started = time.monotonic()
            ready = await krt.wait(name, timeout=READY_TIMEOUT_S)
            took = time.monotonic() - started
            print(f"    {name}: {ready.status.phase.value} on {ready.status.assignedHost} ({took:.1f}s)")
            print(f"    endpoint {ready.status.endpoint.url if ready.status.endpoint else '-'}")
        for name, _, _, payload in FUNCTIONS:
            answer = await krt.invoke(name, payload, invocation_id=f"demo-{name}-1")
            step(f"invoked {name} over HTTPS: {answer.status} in {answer.durationMs:.1f} ms")
            print(f"    outputs {answer.outputs}")
            if answer.stderr.data:
                print(f"    stderr  {answer.stderr.data.strip()}")
            if not answer.ok:
                raise PlatformError(f"{name} answered {answer.status}: {answer.error}")
        step("Runs seen by Temporal (temporal workflow list --query \"KrtPhase='Ready'\"):")
        listed = subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "list",
                *config.temporal_settings().cli_flags(),
                "--query",
                "KrtPhase='Ready'",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        print("    " + (listed.stdout.strip() or listed.stderr.strip()).replace("\n", "\n    "))
        print(f"    watch them in the Temporal UI: {config.uiUrl} (`krt ui` gives you a login link)")
        for name, _, _, _ in FUNCTIONS:
            final = await krt.delete(name)
            step(f"deleted Run {name} ({final.phase.value if final else 'gone'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="krt demo", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--keep", action="store_true", help="keep the platform running afterwards")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="krt-demo-"))
    layout = Layout(root)
    started = False
    try:
        step(f"starting the embedded platform (state in {root})")
        up(layout, detach=True)
        started = True
        config = clientconfig.load({"KRT_STATE_DIR": str(root)})
        asyncio.run(_exercise(config))
        step("demo finished: both functions answered over HTTPS")
        if args.keep:
            print(f"the platform keeps running: export KRT_STATE_DIR={root}; stop it with `krt down`")
            started = False
        return 0
    except (PlatformError, KruntimesError, OSError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if started:
            step("stopping the platform")
            down(layout)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    leave(main())
