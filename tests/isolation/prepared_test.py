"""Function identities made ahead of demand (FunctionIsolation.prepare): each is handed to one
function only, its cgroup is never handed out again, and what is left unused is freed."""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from pathlib import Path

from kruntimes.runtime.isolation import FunctionIsolation, Lease
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.sandbox.identity import DEFAULT_LOCK_DIR, UidRange
from kruntimes.runtime.sandbox.policy import Isolation, SandboxSettings
from tests.sandbox.conftest import ROOT
from tests.support.waiting import wait_until

# a range of their own, claimed through the machine's lock directory like every host's
UIDS = UidRange(2_150_000_000, 64)
PREPARED = 3


def _isolation(work_root: Path) -> FunctionIsolation:
    settings = SandboxSettings(
        uids=UIDS, isolation=Isolation.UID if ROOT else Isolation.SAME_USER, lock_dir=DEFAULT_LOCK_DIR
    )
    isolation = FunctionIsolation(settings, host_uid=f"prep-{uuid.uuid4().hex[:8]}", hide=(), keep=())
    isolation.start(namespaces=True, network_namespaces=False, work_root=work_root)
    return isolation


def _groups(lease: Lease) -> tuple[str, ...]:
    return lease.group.paths if lease.group is not None else ()


def test_a_prepared_identity_goes_to_one_function_and_its_cgroup_never_again(tmp_path: Path) -> None:
    isolation = _isolation(tmp_path)
    planted: list[SandboxSpec] = []
    try:
        isolation.prepare(count=PREPARED, plant=planted.append)
        if isolation.pool is None and isolation.cgroups is None:
            # a host without uids and cgroups has nothing to make ahead: every lease is made on demand
            assert isolation.prepared() == 0
            assert isolation.lease("on-demand").claim is None
            return
        assert wait_until(lambda: isolation.prepared() == PREPARED), "the prepared identities"
        prepared_groups = {b.cgroup_procs for b in planted}

        held: list[Lease] = []
        lock = threading.Lock()
        slots = itertools.count()  # a thread's ident is reused once it ended: slots are counted

        def take(n: int) -> None:
            for _ in range(n):
                lease = isolation.lease(f"t-{next(slots)}")
                isolation.replenish()
                with lock:
                    held.append(lease)

        threads = [threading.Thread(target=take, args=(4,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        uids = [lease.uid for lease in held if lease.uid is not None]
        assert len(uids) == len(set(uids)), "no uid is held by two functions at once"
        groups = [_groups(lease) for lease in held if lease.group is not None]
        assert len(groups) == len(set(groups)), "no cgroup is given to two functions"
        if isolation.plants_seeds:
            procs = [lease.base.cgroup_procs for lease in held]
            from_pool = [p for p in procs if p in prepared_groups]
            assert len(from_pool) >= PREPARED, "the prepared identities were handed out first"
            assert len(planted) == len({b.cgroup_procs for b in planted}), "one seed a prepared cgroup"
            for lease in held:
                seeds = [b for b in planted if b.cgroup_procs == lease.base.cgroup_procs]
                assert len(seeds) <= 1
                for seed in seeds:  # its seed may become this function's process and no other's
                    assert lease.sandbox(tmp_path).seeded_by(seed)
                    others = [o for o in held if o is not lease]
                    assert not any(o.sandbox(tmp_path).seeded_by(seed) for o in others)
        else:
            assert planted == [], "without a cgroup per function the zygote's generic seeds serve"

        seen = set(groups)
        for lease in held:
            isolation.release(lease)
        for group in groups:
            assert not any(os.path.exists(path) for path in group), "a released cgroup is removed"
        assert wait_until(lambda: isolation.prepared() == PREPARED), "the identities prepared again"
        again = [isolation.lease(f"again-{i}") for i in range(PREPARED + 2)]
        isolation.replenish()
        try:
            assert not seen & {_groups(lease) for lease in again if lease.group is not None}
        finally:
            for lease in again:
                isolation.release(lease)
        assert wait_until(lambda: isolation.prepared() == PREPARED), "the identities prepared again"
        unused = list(isolation._ready)
    finally:
        isolation.close()
    for lease in unused:  # closing frees what nobody took
        assert not any(os.path.exists(path) for path in _groups(lease))
        if lease.uid is not None:
            assert Path(DEFAULT_LOCK_DIR, str(lease.uid)).read_bytes() == b"clean"


def test_a_seed_planted_in_a_cgroup_becomes_a_process_of_that_cgroup_only() -> None:
    common = dict(pid_namespace=True, mount_namespace=True, keep=("/usr",), foreign_uid=True)
    mine, theirs = ("/cg/a/cgroup.procs",), ("/cg/b/cgroup.procs",)
    planted_for_mine = SandboxSpec(**common, cgroup_procs=mine)  # type: ignore[arg-type]
    generic = SandboxSpec(**common)  # type: ignore[arg-type]
    assert SandboxSpec(**common, cgroup_procs=mine).seeded_by(planted_for_mine)  # type: ignore[arg-type]
    assert not SandboxSpec(**common, cgroup_procs=theirs).seeded_by(planted_for_mine)  # type: ignore[arg-type]
    assert not SandboxSpec(**common).seeded_by(planted_for_mine), "nor a process of no cgroup"  # type: ignore[arg-type]
    assert SandboxSpec(**common, cgroup_procs=theirs).seeded_by(generic)  # type: ignore[arg-type]
