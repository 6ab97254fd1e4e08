"""What a function orphans is reaped by the zygote: without a PID namespace (whose init would
reap it) nothing else might — a host that is PID 1 of its pod does not — and a zombie counts
toward its uid's process limit until it is reaped, keeping the uid from its next function."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.spawner import Spawner, SpawnSpec
from tests.support.waiting import wait_until


@pytest.fixture
def spawner() -> Iterator[Spawner]:
    spawner = Spawner()
    spawner.start()
    try:
        yield spawner
    finally:
        spawner.close()


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def test_an_orphan_of_a_function_without_a_pid_namespace_is_adopted_and_reaped_by_the_zygote(
    spawner: Spawner, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    r, w = os.pipe()
    try:
        # the function starts a child in the background that says its pid and waits for the
        # test to open `go`, then the function exits at once
        spec = SpawnSpec(
            kind="exec",
            cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin"},
            limits=ProcessLimits(),
            argv=("/bin/sh", "-c", "sh -c 'echo $$; read line < go' & exit 0"),
        )
        _, ended = spawner.spawn(spec, [w, w, w])
        os.close(w)
        w = -1
        orphan = int(os.read(r, 64).split()[0])
        assert ended.wait(10) == 0, "the function process ended, leaving its child behind"
        assert _parent(orphan) == spawner.zygote_pid, "the orphan is the zygote's to reap"
        os.close(os.open(go, os.O_WRONLY))  # the orphan reads the end of `go` and ends
        assert wait_until(lambda: not os.path.exists(f"/proc/{orphan}")), "and is reaped, not left a zombie"
    finally:
        with contextlib.suppress(OSError):  # a test that failed early still lets the orphan end
            os.close(os.open(go, os.O_WRONLY | os.O_NONBLOCK))
        os.close(r)
        if w != -1:
            os.close(w)
