"""A uid goes to its next function only once nothing of its previous holder is left: no live
process (its containment may have missed one) and no zombie (the kernel counts a zombie toward
the uid's RLIMIT_NPROC until it is reaped, so the next holder would start with fewer forks)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from kruntimes.runtime.sandbox.identity import NoFreeUid, UidPool, UidRange, present, processes_of
from tests.support.isolation import needing
from tests.support.waiting import wait_until

isolation_needed = needing(os.geteuid() == 0, "switching uids needs root")

UID = 2_160_000_000


def _pool(tmp_path: Path, uid: int) -> UidPool:
    """A host's pool of the one uid `uid` (every pool of the test shares the lock directory, as
    every host of a machine does); its waits are short so a test does not wait out the bound."""
    return UidPool(UidRange(uid, 1), lock_dir=str(tmp_path / "uids"), drain_s=0.1, claim_drain_s=0.1)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _as(uid: int, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), user=uid, group=uid, extra_groups=[])


def test_a_uid_with_a_zombie_of_its_last_holder_is_not_handed_out_until_it_is_reaped(tmp_path: Path) -> None:
    uid = UID
    first = _pool(tmp_path, uid)
    claim = first.claim()
    zombie = _as(uid, "true")  # this test is its parent and does not reap it yet
    try:
        assert wait_until(lambda: _state(zombie.pid) == "Z"), "the process to end, unreaped"
        assert processes_of(uid) == [] and present(uid) == [zombie.pid]
        first.release(claim, contained=True)
        with pytest.raises(NoFreeUid):
            _pool(tmp_path, uid).claim()
    finally:
        zombie.wait()
    assert _pool(tmp_path, uid).claim().uid == uid, "reaped: the uid is free again"


def test_a_process_a_contained_release_missed_is_killed_before_the_uid_is_handed_out(tmp_path: Path) -> None:
    uid = UID + 1
    first = _pool(tmp_path, uid)
    claim = first.claim()
    leftover = _as(uid, "sleep", "300")
    reaper = threading.Thread(target=leftover.wait)  # its parent reaps it as soon as it dies
    reaper.start()
    try:
        assert wait_until(lambda: leftover.pid in processes_of(uid)), "the leftover to run"
        first.release(claim, contained=True)  # its containment claimed to have ended everything
        again = _pool(tmp_path, uid).claim()
        assert again.uid == uid
        assert present(uid) == [], "the leftover was killed and reaped before the claim returned"
        reaper.join(10)
        assert leftover.returncode == -9
    finally:
        if leftover.returncode is None:
            leftover.kill()
        reaper.join(10)
