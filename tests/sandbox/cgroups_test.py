"""A function's cgroup: a memory limit across its processes, a process cap, and an end for all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from kruntimes.runtime.sandbox import cgroups
from tests.sandbox.conftest import NOT_ROOT, ROOT
from tests.support.isolation import needing, require_or_skip
from tests.support.waiting import wait_until

isolation_needed = needing(ROOT, NOT_ROOT)

JOIN = "import sys\nfor p in sys.argv[1:]:\n    open(p, 'w').write('0')\n"


@pytest.fixture
def host_groups():
    found = cgroups.detect(f"test-{uuid.uuid4().hex[:8]}")
    if found is None:
        require_or_skip(
            "no writable cgroup on this machine: the host falls back to rlimits"
            " (tests/isolation/cgroup_v2_test.py, tests/runtime/python_adapter_test.py)"
        )
    yield found
    found.remove()


def _in_group(group: cgroups.FunctionGroup, code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", JOIN + code, *group.procs_files],
        stdout=subprocess.PIPE,
    )


def test_the_memory_limit_holds_across_several_processes(host_groups):
    group = host_groups.group("mem")
    group.create(memory_bytes=64 * 1024 * 1024, max_processes=64)
    try:
        # four children of 24 MiB each: every one is under the limit, together they are not
        code = (
            "import os, time\n"
            "pids = []\n"
            "for _ in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        b = bytearray(24 * 1024 * 1024)\n"
            "        for i in range(0, len(b), 4096): b[i] = 1\n"
            "        time.sleep(30)\n"
            "        os._exit(0)\n"
            "    pids.append(pid)\n"
            "codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]\n"
            "print(codes)\n"
        )
        with _in_group(group, code):
            assert wait_until(lambda: group.oom_kills() > 0, within=30), (
                "the kernel to enforce the memory limit"
            )
            group.kill()
    finally:
        group.remove()
    assert not os.path.exists(group.paths[0])


def test_the_process_cap_stops_a_fork_bomb(host_groups):
    group = host_groups.group("pids")
    group.create(memory_bytes=None, max_processes=20)
    try:
        code = (
            "import os, json, time\n"
            "made, refused = 0, 0\n"
            "for _ in range(100):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n"
            "        made += 1\n"
            "    except OSError:\n"
            "        refused += 1\n"
            "print(json.dumps([made, refused]), flush=True)\n"
            "time.sleep(30)\n"
        )
        with _in_group(group, code) as proc:
            assert proc.stdout is not None
            made, refused = json.loads(proc.stdout.readline())
            assert made < 20 and refused > 0
            assert len(group.pids()) <= 20
            group.kill()
            assert group.pids() == []
    finally:
        group.remove()


def test_kill_ends_processes_that_left_their_session(host_groups):
    group = host_groups.group("escape")
    group.create(memory_bytes=None, max_processes=None)
    try:
        code = (
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(60)\n"
            "    os._exit(0)\n"
            "time.sleep(60)\n"
        )
        with _in_group(group, code) as proc:
            assert wait_until(lambda: len(group.pids()) >= 2), "the escaped grandchild"
            group.kill()
            assert group.pids() == []
            assert proc.wait(timeout=10) == -9
    finally:
        group.remove()


def test_a_slot_must_be_one_path_component(host_groups):
    for bad in ("", "a/b", "..", "."):
        with pytest.raises(ValueError):
            host_groups.group(bad)


def test_a_group_is_never_made_over_one_that_is_there(host_groups):
    """A function's cgroup is new: one of the same name already there (another function's, or
    what one left) is refused, and its processes are left alone."""
    first = host_groups.group("taken")
    first.create(memory_bytes=None, max_processes=None)
    try:
        with _in_group(first, "import time\ntime.sleep(60)\n") as proc:
            assert wait_until(lambda: len(first.pids()) == 1), "the first function's process"
            second = host_groups.group("taken")
            with pytest.raises(FileExistsError):
                second.create(memory_bytes=None, max_processes=None)
            assert not second.created
            second.remove()  # a group that made nothing removes nothing
            assert first.pids() == [proc.pid]
            assert all(os.path.isdir(p) for p in first.paths)
            proc.kill()
    finally:
        first.remove()
