"""The cgroup v2 layout, on a tree laid out as the kernel lays one out, for machines (like a
cgroup v1 CI host) whose kernel offers no writable v2 hierarchy to test it on: where the host's
own cgroup delegates `memory` and `pids`, a function's group gets its limits and ends through
`cgroup.kill`; where it does not, the host falls back (no cgroup: rlimits and the uid)."""

from __future__ import annotations

from pathlib import Path

from kruntimes.runtime.sandbox import cgroups


def _own_v2_path() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:].lstrip("/")
    return ""


def _tree(root: Path, *, delegated: str) -> Path:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    own = root / _own_v2_path()
    own.mkdir(parents=True, exist_ok=True)
    (own / "cgroup.subtree_control").write_text(delegated)
    return own


def test_a_delegated_v2_tree_gives_each_function_a_group_with_its_limits(tmp_path: Path) -> None:
    own = _tree(tmp_path, delegated="memory pids\n")
    found = cgroups.detect("h1", root=str(tmp_path))
    assert found is not None and found.version == 2 and found.describe() == "cgroup v2"
    host = own / "kruntimes-h1"
    assert found.bases == (str(host),)
    assert (host / "cgroup.subtree_control").read_text() == "+memory +pids", "delegated to functions"
    group = found.group("f1")
    group.create(memory_bytes=128 * 2**20, max_processes=48)
    assert (host / "f1" / "memory.max").read_text() == str(128 * 2**20)
    assert (host / "f1" / "memory.swap.max").read_text() == "0"
    assert (host / "f1" / "pids.max").read_text() == "48"
    assert group.procs_files == (str(host / "f1" / "cgroup.procs"),)
    group.kill()
    assert (host / "f1" / "cgroup.kill").read_text() == "1", "every process of the group ends at once"


def test_a_v2_tree_that_does_not_delegate_memory_and_pids_means_no_cgroup(tmp_path: Path) -> None:
    _tree(tmp_path, delegated="cpu\n")
    assert cgroups.detect("h2", root=str(tmp_path)) is None
