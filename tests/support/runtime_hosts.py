"""A Runtime Server for a test, in the test's process: on loopback ports picked when it starts,
with its host identity from the test PKI and the control plane's assignment key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kruntimes.runtime.server import HostOptions, RuntimeHost
from tests.support.pki import TestPKI


def loopback_host(
    pki: TestPKI, state_dir: Path, *, host_id: str, runtime: str = "python", **options: Any
) -> RuntimeHost:
    """Host `host_id` of `runtime` (not started); `options`: the rest of its HostOptions."""
    return RuntimeHost(
        HostOptions(
            host_id=host_id,
            runtime=runtime,
            listen="127.0.0.1:0",
            state_dir=state_dir,
            tls=pki.host_tls(host_id, runtime=runtime),
            assignments=pki.verifier(),
            **options,
        )
    )
