"""`make demo` / `krt demo`: the end-to-end demo.

Until the embedded platform (Temporal, worker, gateway) lands, the demo drives the part that
exists: it starts a real runtime host process, registers examples/hello (python) and
examples/bash-hello (bash) with it over gRPC, invokes both, prints the answers and stops
everything. Any failing step exits non-zero with the reason.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
START_TIMEOUT_S = 30.0


class DemoFailed(Exception):
    pass


def _start_host(state: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = state / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.host", "--host-id", "demo-0", "--runtime", "python"]
        + ["--state-dir", str(state), "--ready-file", str(ready), "--log-level", "warning"],
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None:
            raise DemoFailed(f"the runtime host exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise DemoFailed("the runtime host did not start within 30 s")
        time.sleep(0.05)
    return proc, str(json.loads(ready.read_text())["address"])


def _deploy_and_invoke(
    stub: pb_grpc.FunctionRuntimeStub, *, name: str, adapter: str, handler: str, payload: dict[str, str]
) -> None:
    source = EXAMPLES / name
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name=name, runtime=adapter)
    config = pb.FunctionConfig(adapter=adapter, handler=handler, source_path=str(source))
    reg = stub.RegisterFunction(pb.RegisterFunctionRequest(run=run, config=config), timeout=30)
    print(f"registered {name} ({adapter}) as run {run.run_uid}")
    answer = stub.InvokeFunction(
        pb.InvokeFunctionRequest(
            registration_id=reg.registration_id,
            invocation_id=f"demo-{name}",
            payload=json.dumps(payload).encode(),
        ),
        timeout=30,
    )
    if answer.status != pb.INVOCATION_STATUS_SUCCEEDED:
        raise DemoFailed(f"{name}: {answer.error.type}: {answer.error.message}")
    took_ms = answer.duration_us / 1000
    print(f"  invoke {answer.invocation_id}: {answer.outputs_json.decode()}  ({took_ms:.1f} ms)")
    stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg.registration_id), timeout=30)


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="krt-demo-") as tmp:
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc, address = _start_host(Path(tmp))
            print(f"runtime host serving on {address}")
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.FunctionRuntimeStub(channel)
                _deploy_and_invoke(
                    stub, name="hello", adapter="python", handler="main:handle", payload={"name": "demo"}
                )
                _deploy_and_invoke(
                    stub, name="bash-hello", adapter="bash", handler="hello.sh", payload={"x": "y"}
                )
            print("demo finished: both functions answered")
            return 0
        except (DemoFailed, grpc.RpcError, OSError) as exc:
            detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
            print(f"demo failed: {detail}", file=sys.stderr)
            return 1
        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
