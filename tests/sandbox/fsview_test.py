"""The file system view's plan: kept paths reachable with their real content, nothing else."""

from __future__ import annotations

import os
import stat

from kruntimes.runtime.sandbox.fsview import Op, plan


def _tree(modes: dict[str, int]):
    """A stat function over a made-up tree: path → mode bits (directories)."""

    def stat_of(path: str) -> os.stat_result | None:
        mode = modes.get(path)
        if mode is None:
            return None
        return os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, 0, 0, 0, 0, 0, 0))

    return stat_of


TREE = _tree(
    {
        "/": 0o755,
        "/root": 0o700,
        "/root/.pyenv": 0o755,
        "/root/.pyenv/versions": 0o755,
        "/root/.pyenv/versions/3.11": 0o755,
        "/root/.pyenv/versions/3.11/secret": 0o700,
        "/root/.pyenv/versions/3.11/secret/inner": 0o755,
        "/tmp": 0o1777,
        "/tmp/t": 0o700,
        "/tmp/t/state": 0o700,
        "/tmp/t/state/work": 0o711,
        "/tmp/t/state/work/host": 0o711,
        "/tmp/t/state/work/host/run.1": 0o700,
        "/tmp/t/state/work/host/run.2": 0o700,
        "/usr": 0o755,
        "/usr/lib": 0o755,
        "/srv": 0o755,
        "/srv/state": 0o755,
    }
)


def test_a_kept_path_under_an_untraversable_directory_is_bound_alone():
    ops = plan(keep=["/root/.pyenv/versions/3.11"], hide=[], needs_traversal=True, stat_of=TREE).ops
    assert [(o.kind, o.path) for o in ops] == [
        ("tmpfs", "/root"),
        ("mkdir", "/root/.pyenv"),
        ("mkdir", "/root/.pyenv/versions"),
        ("bind", "/root/.pyenv/versions/3.11"),
    ]


def test_world_traversable_paths_need_nothing():
    assert plan(keep=["/usr/lib"], hide=[], needs_traversal=True, stat_of=TREE).ops == ()


def test_the_same_user_needs_no_traversal_help_only_hiding():
    ops = plan(keep=["/root/.pyenv/versions/3.11"], hide=["/srv/state"], needs_traversal=False, stat_of=TREE)
    assert [(o.kind, o.path) for o in ops.ops] == [("tmpfs", "/srv/state")]


def test_a_workspace_under_a_hidden_state_dir_shows_only_itself():
    ops = plan(
        keep=["/tmp/t/state/work/host/run.1"],
        hide=["/tmp/t/state", "/tmp/t/state/work/host"],
        scratch={"/tmp": 1 << 20},
        needs_traversal=True,
        stat_of=TREE,
    ).ops
    kinds = {o.path: o.kind for o in ops}
    assert kinds == {
        "/tmp": "tmpfs",
        "/tmp/t": "mkdir",
        "/tmp/t/state": "mkdir",
        "/tmp/t/state/work": "mkdir",
        "/tmp/t/state/work/host": "mkdir",
        "/tmp/t/state/work/host/run.1": "bind",
    }
    assert "/tmp/t/state/work/host/run.2" not in kinds, "another workspace never shows"
    scratch = next(o for o in ops if o.path == "/tmp")
    assert scratch.options == f"mode=1777,size={1 << 20}"


def test_a_hidden_directory_on_no_kept_path_is_covered_empty():
    ops = plan(keep=[], hide=["/srv/state"], needs_traversal=True, stat_of=TREE).ops
    assert ops == (Op("tmpfs", "/srv/state", "mode=711,size=1m"),)


def test_an_untraversable_directory_inside_a_bound_one_is_covered_again():
    ops = plan(
        keep=["/root/.pyenv/versions/3.11", "/root/.pyenv/versions/3.11/secret/inner"],
        hide=[],
        needs_traversal=True,
        stat_of=TREE,
    ).ops
    kinds = [(o.kind, o.path) for o in ops]
    assert ("bind", "/root/.pyenv/versions/3.11") in kinds
    assert ("tmpfs", "/root/.pyenv/versions/3.11/secret") in kinds
    assert ("bind", "/root/.pyenv/versions/3.11/secret/inner") in kinds
    assert kinds.index(("bind", "/root/.pyenv/versions/3.11")) < kinds.index(
        ("tmpfs", "/root/.pyenv/versions/3.11/secret")
    ), "parents are mounted before what lies inside them"


def test_missing_paths_are_ignored():
    assert plan(keep=["/nope/x"], hide=["/nope"], needs_traversal=True, stat_of=TREE).ops == ()


def test_operations_come_parents_first():
    ops = plan(
        keep=["/tmp/t/state/work/host/run.1", "/root/.pyenv/versions/3.11"],
        hide=["/tmp/t/state"],
        needs_traversal=True,
        stat_of=TREE,
    ).ops
    for i, op in enumerate(ops):
        for later in ops[i + 1 :]:
            assert not op.path.startswith(later.path + "/"), f"{later.path} must come before {op.path}"


def test_what_stays_writable_is_the_scratch_and_the_writable_kept_paths_each_a_mount_of_its_own():
    view = plan(
        keep=["/usr/lib", "/srv/state", "/tmp/t/state/work/host/run.1"],
        hide=["/tmp/t/state"],
        scratch={"/tmp": 1 << 20},
        writable=["/srv/state", "/tmp/t/state/work/host/run.1"],
        needs_traversal=True,
        stat_of=TREE,
    )
    kinds = {o.path: o.kind for o in view.ops}
    # a writable path nothing covers is bound onto itself: the seal spares that mount only
    assert kinds["/srv/state"] == "bind"
    assert "/usr/lib" not in kinds, "a read-only kept path needs nothing (the seal covers it)"
    assert kinds["/tmp/t/state/work/host/run.1"] == "bind"
    assert set(view.writable) == {"/tmp", "/srv/state", "/tmp/t/state/work/host/run.1"}
    assert "/srv" not in view.writable and "/" not in view.writable


def test_a_writable_path_that_is_not_kept_or_does_not_exist_is_never_spared():
    view = plan(keep=[], hide=[], writable=["/srv/state", "/nope"], needs_traversal=True, stat_of=TREE)
    assert view.ops == () and view.writable == ()
