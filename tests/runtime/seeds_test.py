"""Seeds: sandboxed children the zygote keeps planted, so a registration costs no fork and no
namespace setup of its own; a seed becomes exactly the sandbox a directly started one would."""

from __future__ import annotations

import json
from pathlib import Path

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.sandbox.child import SandboxSpec, growth
from kruntimes.runtime.sandbox.fsview import Op
from tests.runtime.conftest import Host
from tests.support.isolation import needing, require_or_skip
from tests.support.waiting import wait_until

isolation_needed = needing(Path("/proc/self/ns/pid").exists(), "no PID namespaces on this machine")


def _children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _seeds(host: Host) -> set[int]:
    """The zygote's children that are no registration's process, once there are as many as the
    host keeps (skips on a host that makes no namespaces, which starts every function directly)."""
    zygote = host.runtime.spawner.zygote_pid
    assert zygote is not None
    in_force = host.runtime.in_force
    if in_force is None or not in_force.pid_namespace:
        require_or_skip("this host makes no namespaces: it starts every function directly")
    assert wait_until(lambda: len(_children(zygote) - set(_live(host))) >= host.runtime.options.seeds)
    return _children(zygote) - set(_live(host))


def test_a_registration_takes_a_waiting_seed_and_a_new_one_is_planted(host: Host) -> None:
    zygote = host.runtime.spawner.zygote_pid
    assert zygote is not None
    seeds_before = _seeds(host)
    reg = host.register("import os\ndef handle(p):\n    return {'uid': os.getuid(), 'cwd': os.getcwd()}\n")
    registration = host.runtime.registry.get(reg.registration_id)
    assert registration is not None and registration.process is not None
    assert registration.process.pid in seeds_before, "the function became a seed planted before"
    answer = json.loads(host.invoke(reg.registration_id).outputs_json)
    assert answer["uid"] != 0 and answer["cwd"] == str(registration.workdir)
    assert wait_until(lambda: len(_children(zygote) - set(_live(host))) >= host.runtime.options.seeds), (
        "the zygote plants a new seed"
    )


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _nice_or_gone(pid: int) -> int | None:
    try:
        return _nice(pid)
    except OSError:
        return None


def test_seeds_wait_at_the_lowest_priority_and_functions_run_at_the_hosts(host: Host) -> None:
    zygote = host.runtime.spawner.zygote_pid
    assert zygote is not None
    seeds = _seeds(host)
    # a seed lowers its own priority first thing after the fork
    assert wait_until(lambda: all(_nice_or_gone(seed) in (19, None) for seed in seeds)), (
        "a waiting seed takes CPU only from what nobody else needs"
    )
    regs = [host.register("import os\ndef handle(p):\n    return {'nice': os.nice(0)}\n") for _ in range(3)]
    for reg in regs:
        answer = json.loads(host.invoke(reg.registration_id).outputs_json)
        assert answer["nice"] == _nice(zygote), "the function runs at the zygote's priority"
        registration = host.runtime.registry.get(reg.registration_id)
        assert registration is not None and registration.process is not None
        assert _nice(registration.process.pid) == _nice(zygote)


def _cgroups_of(pid: int) -> set[str]:
    """The cgroup directories (below the hierarchies' mount points) of a process."""
    return {line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()}


def test_each_function_runs_in_a_cgroup_of_its_own_prepared_with_its_seed(host: Host) -> None:
    isolation = host.runtime.isolation
    assert isolation is not None
    regs = [host.register("def handle(p):\n    return p\n") for _ in range(3)]
    leases = []
    for reg in regs:
        registration = host.runtime.registry.get(reg.registration_id)
        assert registration is not None and registration.process is not None
        assert registration.lease is not None
        leases.append(registration.lease)
        if registration.lease.group is None:  # no writable cgroup: the uid alone holds it together
            assert isolation.cgroups is None and not isolation.plants_seeds
            continue
        found = _cgroups_of(registration.process.pid) - {"/"}
        for path in registration.lease.group.paths:  # one directory per hierarchy
            assert any(path.endswith(c) for c in found), "the function process is in its own cgroup"
    uids = [lease.uid for lease in leases]
    assert len(set(uids)) == len(uids)
    groups = [lease.group.paths for lease in leases if lease.group is not None]
    assert len(set(groups)) == len(groups)
    for reg in regs:
        host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg.registration_id))
    every = [p for paths in groups for p in paths]
    assert wait_until(lambda: not any(Path(p).exists() for p in every)), (
        "an unregistered one's cgroup is gone"
    )


def _live(host: Host) -> list[int]:
    return [r.process.pid for r in host.runtime.registry.snapshot() if r.process is not None]


def test_growth_is_what_the_function_adds_to_the_planted_view() -> None:
    base = SandboxSpec(
        pid_namespace=True, mount_namespace=True, keep=("/usr",), hide=("/srv",), foreign_uid=True
    )
    spec = SandboxSpec(
        pid_namespace=True, mount_namespace=True, keep=("/usr", "/tmp"), hide=("/srv",), foreign_uid=True
    )
    assert spec.seeded_by(base)
    planted = {(op.kind, op.path) for op in growth(base, base).ops}
    assert planted == set()
    assert all(isinstance(op, Op) for op in growth(spec, base).ops)
    other = SandboxSpec(pid_namespace=True, mount_namespace=True, keep=("/usr",), hide=(), foreign_uid=True)
    assert not other.seeded_by(base), "a seed never loses a hidden directory"


def test_functions_started_per_call_keep_no_seed_waiting_while_they_are_registered(host: Host) -> None:
    # A bash Run starts a process per call: the seed planted with its identity would wait for as
    # long as the Run is registered and not called, two processes and their memory each (500 idle
    # Runs: 1,000 processes on one host, and the machine's pids run out before its Runs do).
    zygote = host.runtime.spawner.zygote_pid
    assert zygote is not None
    kept = len(_seeds(host))
    regs = [
        host.register({"run.sh": "echo $$\n"}, adapter="bash", handler="run.sh").registration_id
        for _ in range(kept + 4)
    ]
    waiting = lambda: _children(zygote) - set(_live(host))  # noqa: E731
    assert wait_until(lambda: len(waiting()) <= kept), (
        f"{len(waiting())} processes wait in the zygote for {len(regs)} registrations never called"
    )
    for registration_id in regs:  # their calls are served all the same, each started directly
        answer = host.invoke(registration_id)
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer
