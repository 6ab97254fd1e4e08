"""The hop both certificate-rotation suites build: a gateway on loopback whose one bearer token is
alice's (allowed every namespace), a runtime host process with a certificate directory of its own
heartbeating to it, and the echo function registered on the host."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.server import Gateway
from kruntimes.pki import ASSIGNMENT_PUBLIC_KEY, PeerTLS
from kruntimes.pki.assignments import Verifier
from kruntimes.pki.local import ensure_tls
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.support.stack import local_gateway_options
from tests.support.waiting import eventually

HOST_READY_S = 30.0  # a host process writes its ready file within this
HOST_STOP_S = 10.0  # a host process ends within this of SIGTERM, else it is killed
ECHO = b"def handle(p):\n    return p\n"


def token_gateway(root: Path, token: str, *, peer_tls: PeerTLS, assignments: Verifier) -> Gateway:
    """A gateway (not started) serving HTTPS with a certificate of its own under `root`, whose one
    bearer token `token` is alice's, allowed every namespace."""
    tokens = root / "tokens.csv"
    tokens.write_text(f'{token},alice,1,"devs"\n')
    tokens.chmod(0o600)
    return Gateway(
        local_gateway_options(
            ensure_tls(root / "serving"),
            authorizer=CachingAuthorizer(
                EmbeddedAuthorizer(
                    TokenFile(tokens),
                    RoleBindings.from_yaml("bindings:\n- namespace: '*'\n  users: [alice]\n"),
                )
            ),
            peer_tls=peer_tls,
            assignments=assignments,
        )
    )


@contextlib.asynccontextmanager
async def host_process(
    root: Path, host_id: str, *, tls: Path, gateway: Gateway
) -> AsyncIterator[dict[str, Any]]:
    """`python -m kruntimes.workers.host` as python host `host_id` with the certificate directory `tls`
    (its assignment public key beside the certificate), heartbeating to `gateway` every 0.2 s;
    what it wrote to its ready file. Stopped at the end (SIGTERM, then SIGKILL)."""
    ready = root / f"{host_id}.ready.json"
    log_path = root / f"{host_id}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kruntimes.workers.host", "--host-id", host_id, "--runtime", "python"]
            + ["--state-dir", str(root / f"{host_id}.state"), "--ready-file", str(ready)]
            + ["--gateway", gateway.heartbeat_address, "--heartbeat-interval", "0.2"]
            + ["--peer-tls", str(tls), "--assignment-public-key", str(tls / ASSIGNMENT_PUBLIC_KEY)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            await eventually(
                lambda: ready.exists() or proc.poll() is not None,
                within=HOST_READY_S,
                every=0.05,
                what=f"{host_id} ready",
            )
            assert ready.exists(), log_path.read_text()
            yield json.loads(ready.read_text())
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=HOST_STOP_S)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def echo_registration(run: pb.RunRef, assignment: pb.SignedAssignment) -> pb.RegisterFunctionRequest:
    """The RegisterFunction request of `run` as the echo function (it answers its payload)."""
    return pb.RegisterFunctionRequest(
        run=run,
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=ECHO)]),
        ),
        assignment=assignment,
    )
