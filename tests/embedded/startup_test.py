"""`krt up` says why it cannot start, soon: a bad runtimes file before anything starts, and a
worker that died before the pools got their warm hosts as soon as it died, with its last words."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout, prepare
from kruntimes.workers.embedded.supervise import _wait_min_hosts, run_foreground


def test_a_bad_runtimes_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.root.mkdir(exist_ok=True)
    layout.runtimes.write_text("runtimes:\n- name: python\n  bogus: 1\n")
    with pytest.raises(PlatformError) as caught:
        run_foreground(layout, on_ready=lambda _: pytest.fail("the platform must not start"))
    assert str(caught.value).startswith(f"{layout.runtimes}: invalid kruntimes configuration:")
    assert "runtimes.0.bogus: Extra inputs are not permitted" in str(caught.value)
    assert not layout.log("temporal").exists() and not layout.log("worker").exists()
    assert not layout.up.exists()


async def test_a_worker_that_died_during_startup_is_said_with_its_last_line(
    tmp_path: Path, dev_server: DevServer
) -> None:
    layout = Layout(tmp_path)
    prepare(layout)
    with layout.log("worker").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('ValueError: address already in use'); sys.exit(3)"],
            stdout=log,
            stderr=log,
        )
    worker.wait(timeout=30)
    with pytest.raises(PlatformError) as caught:
        # a deadline far off: only the worker's death ends the wait
        await _wait_min_hosts(dev_server.address, layout, time.monotonic() + 3600, worker=worker)
    assert str(caught.value) == (
        "the worker exited with code 3 before runtime 'python' got its warm host(s):"
        f" ValueError: address already in use (log: {layout.log('worker')})"
    )
