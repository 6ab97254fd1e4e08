"""Real host processes on 127.0.0.1, each test in its own state directory, all stopped afterwards."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kruntimes.activities.hosts import CreatedHost, HostSpec, ProcessProvider, stop_all
from kruntimes.pki import HostIssuer
from tests.support.pki import TestPKI
from tests.support.procs import alive
from tests.support.waiting import NotInTime, eventually


def spec(state_dir: Path, host_id: str = "python-0", **changes: Any) -> HostSpec:
    fields: dict[str, Any] = {
        "runtime": "python",
        "hostId": host_id,
        "adapter": "python",
        "provider": "process",
        "stateDir": str(state_dir),
        **changes,
    }
    return HostSpec.model_validate(fields)


def host_record(provider: str, **changes: Any) -> CreatedHost:
    """`provider`'s record of host python-0 (uid-1, at 127.0.0.1:1, created now), with `changes`."""
    fields: dict[str, Any] = {
        "provider": provider,
        "runtime": "python",
        "hostId": "python-0",
        "hostUid": "uid-1",
        "address": "127.0.0.1:1",
        "createdAt": datetime.now(UTC),
        **changes,
    }
    return CreatedHost.model_validate(fields)


def host_pids(state_dir: Path) -> list[int]:
    """Live processes whose command line mentions ``state_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(state_dir) in cmdline and alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


async def gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether process `pid` ended within `seconds`."""
    try:
        await eventually(lambda: not alive(pid), within=seconds, every=0.05, what=f"pid {pid} to end")
    except NotInTime:
        return False
    return True


async def killed_host(process: ProcessProvider, state_dir: Path) -> CreatedHost:
    """Host python-0 created, then SIGKILLed and gone: an older incarnation, as a next create finds it."""
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    os.kill(host.pid, signal.SIGKILL)
    assert await gone(host.pid)
    return host


@pytest.fixture
async def state_dir(tmp_path: Path) -> AsyncIterator[Path]:
    state = tmp_path / "state"
    try:
        yield state
    finally:
        await stop_all(state, grace_s=5)
        leftovers = [pid for pid in host_pids(state) if not await gone(pid, seconds=1)]
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"processes {leftovers} of {state} outlived stop_all"


@pytest.fixture(autouse=True)
def issuer(pki: TestPKI) -> HostIssuer:
    """Gives the hosts a process provider starts their certificates (and channels to hosts the
    control plane's: `pki` sets that up)."""
    return pki.issuer()


@pytest.fixture
def process(issuer: HostIssuer) -> ProcessProvider:
    return ProcessProvider(start_timeout_s=30, issuer=issuer)
