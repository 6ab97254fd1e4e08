"""One uid per function, unique across every host of the machine; leftovers of a dead holder die."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from kruntimes.runtime.sandbox.identity import NoFreeUid, UidPool, UidRange, kill_uid, present, processes_of
from tests.sandbox.conftest import NOT_ROOT, ROOT
from tests.support.isolation import needing
from tests.support.waiting import wait_until

isolation_needed = needing(ROOT, NOT_ROOT)


def _pool(tmp_path, first: int, count: int) -> UidPool:
    return UidPool(UidRange(first, count), lock_dir=str(tmp_path / "uids"))


def _sleeper(uid: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])


def test_two_hosts_on_one_machine_never_share_a_uid(tmp_path):
    first = 2_100_000_000
    a, b = _pool(tmp_path, first, 4), _pool(tmp_path, first, 4)
    claims = [a.claim(), b.claim(), a.claim(), b.claim()]
    assert sorted(c.uid for c in claims) == [first, first + 1, first + 2, first + 3]
    with pytest.raises(NoFreeUid):
        a.claim()
    a.release(claims[0], contained=True)
    assert b.claim().uid == first, "a released uid can be claimed again"


def test_a_uid_left_busy_by_a_dead_host_is_cleared_before_reuse(tmp_path):
    uid = 2_100_000_100
    dead = _pool(tmp_path, uid, 1)
    claim = dead.claim()
    leftover = _sleeper(uid)
    # its parent reaps it once it dies, as the init a dead host's processes fall to would
    reaper = threading.Thread(target=leftover.wait)
    reaper.start()
    try:
        assert wait_until(lambda: leftover.pid in processes_of(uid)), "the leftover to run"
        os.close(claim.fd)  # the host died: its lock is gone, the file still says busy
        again = _pool(tmp_path, uid, 1).claim()
        assert again.uid == uid
        reaper.join(10)
        assert leftover.returncode == -9, "the dead holder's process was killed"
    finally:
        if leftover.returncode is None:
            leftover.kill()
        reaper.join(10)


def test_a_clean_release_does_not_scan_on_the_next_claim(tmp_path):
    uid = 2_100_000_200
    pool = _pool(tmp_path, uid, 1)
    pool.release(pool.claim(), contained=True)
    with open(tmp_path / "uids" / str(uid), "rb") as f:
        assert f.read() == b"clean"


def test_release_without_containment_kills_every_process_of_the_uid(tmp_path):
    uid = 2_100_000_300
    pool = _pool(tmp_path, uid, 1)
    claim = pool.claim()
    procs = [_sleeper(uid) for _ in range(3)]
    reapers = [threading.Thread(target=p.wait) for p in procs]
    for reaper in reapers:
        reaper.start()
    try:
        assert wait_until(lambda: len(processes_of(uid)) == 3), "three processes of the uid"
        pool.release(claim, contained=False)
        assert present(uid) == [], "killed and reaped before the release returned"
        with open(tmp_path / "uids" / str(uid), "rb") as f:
            assert f.read() == b"clean"
        for reaper in reapers:
            reaper.join(10)
        assert [p.returncode for p in procs] == [-9, -9, -9]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_kill_uid_of_an_unused_uid_finds_nothing():
    assert kill_uid(2_100_000_400) == 0


@pytest.mark.parametrize("text", ["", "5", "10-5", "a-b", "0-10", "4294967290-4294967299"])
def test_malformed_or_out_of_range_uid_ranges_are_refused(text):
    with pytest.raises(ValueError):
        UidRange.parse(text)


def test_a_range_parses_inclusively():
    assert UidRange.parse("200000-200009") == UidRange(200000, 10)
