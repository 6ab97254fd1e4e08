"""A package directory is read and written without following anything out of it: links (to files
or directories) and special files are skipped and reported, never pruned, never written through;
a file is read only up to the package's bound."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from kruntimes.krm import package
from kruntimes.krm.resources import dump, load_all, parse_resource_list
from kruntimes.workers import fn_eval as cli

SECRET = {"apiVersion": "v1", "kind": "Config", "metadata": {"name": "kubeconfig"}, "token": "s3cr3t"}


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A package with a link to a KRM file outside it, a link to a directory outside it holding
    one, a link to its own resource file and a FIFO named like a YAML file, beside one ordinary
    resource."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.yaml").write_text(dump(SECRET))
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "app.yaml").write_text(dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}))
    (root / "kube.yaml").symlink_to(outside / "config.yaml")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "same.yaml").symlink_to("app.yaml")
    os.mkfifo(root / "pipe.yaml")
    return root


def _read_in_thread(root: Path, skipped: list[str]) -> list[dict]:
    """package.read, bounded: a read that blocks (on the FIFO) fails the test instead of hanging."""
    result: list[list[dict]] = []
    reader = threading.Thread(target=lambda: result.append(package.read(root, skipped)), daemon=True)
    reader.start()
    reader.join(10)
    assert result, "reading the package blocked"
    return result[0]


def test_links_and_special_files_are_skipped_and_reported(hostile: Path) -> None:
    skipped: list[str] = []
    items = _read_in_thread(hostile, skipped)
    assert [i["metadata"]["name"] for i in items] == ["a"]
    assert sorted(skipped) == ["kube.yaml", "linked/", "pipe.yaml", "same.yaml"]


def test_the_function_never_sees_what_a_link_points_to(hostile: Path, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(hostile), "--exec", "/bin/cat", "-o", "stdout"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert "s3cr3t" not in out.getvalue()
    assert [i["metadata"]["name"] for i in parse_resource_list(out.getvalue().encode())["items"]] == ["a"]
    for name in ("kube.yaml", "linked/", "pipe.yaml", "same.yaml"):
        assert f"krt: warning: {name}: skipped" in err.getvalue()


def test_writing_in_place_keeps_links_and_leaves_their_targets_alone(hostile: Path, tmp_path: Path) -> None:
    err = io.StringIO()
    code = cli.main([str(hostile), "--exec", "/bin/cat"], stdout=io.StringIO(), stderr=err)
    assert code == 0, err.getvalue()
    assert all((hostile / n).is_symlink() for n in ("kube.yaml", "linked", "same.yaml")), "pruned a link"
    assert (hostile / "pipe.yaml").exists()
    assert list(load_all((tmp_path / "outside" / "config.yaml").read_text())) == [SECRET]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("kube.yaml", "leaves the package"),
        ("linked/config.yaml", "leaves the package"),
        ("linked/new.yaml", "leaves the package"),
        ("same.yaml", "same.yaml is a symbolic link"),
    ],
)
def test_a_resource_is_never_written_through_a_link(
    hostile: Path, tmp_path: Path, path: str, why: str
) -> None:
    app = (hostile / "app.yaml").read_text()
    item = {
        "apiVersion": "v1",
        "kind": "Config",
        "metadata": {"name": "x", "annotations": {package.PATH: path, package.INDEX: "0"}},
    }
    with pytest.raises(package.PackageError, match=why):
        package.write(hostile, [item], prune=True)
    assert list(load_all((tmp_path / "outside" / "config.yaml").read_text())) == [SECRET]
    assert (hostile / "app.yaml").read_text() == app
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["config.yaml"]


def test_a_special_file_is_not_written_to(hostile: Path) -> None:
    item = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "annotations": {package.PATH: "pipe.yaml"}},
    }
    with pytest.raises(package.PackageError, match="not a regular file"):
        package.write(hostile, [item], prune=False)


def test_a_file_is_read_only_up_to_the_package_bound(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    with (root / "huge.yaml").open("wb") as f:
        f.truncate(64 * 1024 * 1024 * 1024)  # sparse: 64 GiB that read whole would exhaust memory
    with pytest.raises(package.PackageError, match="over"):
        package.read(root)


def test_a_linked_package_directory_itself_is_read(hostile: Path, tmp_path: Path) -> None:
    """The directory named on the command line may be a link (the user's choice); only what is
    inside it is not followed."""
    alias = tmp_path / "alias"
    alias.symlink_to(hostile, target_is_directory=True)
    items = package.read(alias)
    assert [i["metadata"]["name"] for i in items] == ["a"]
    package.write(alias, items, prune=True)
    assert (hostile / "app.yaml").is_file() and (hostile / "kube.yaml").is_symlink()


def test_results_that_cannot_be_written_are_a_clear_error_and_leave_the_package_alone(
    hostile: Path, tmp_path: Path
) -> None:
    before = (hostile / "app.yaml").read_text()
    taken = tmp_path / "a-file"
    taken.write_text("")
    err = io.StringIO()
    argv = [str(hostile), "--exec", "/bin/sed 's/name: a/name: changed/'"]
    code = cli.main([*argv, "--results-dir", str(taken)], stdout=io.StringIO(), stderr=err)
    assert code == cli.FAILED
    assert f"krt: cannot write the results to {taken}: File exists" in err.getvalue()
    assert "Traceback" not in err.getvalue()
    assert (hostile / "app.yaml").read_text() == before
    assert cli.main(argv, stdout=io.StringIO(), stderr=io.StringIO()) == cli.OK
    assert "name: changed" in (hostile / "app.yaml").read_text(), "the same run, results aside, writes"


def test_results_are_not_written_through_a_link(hostile: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / cli.RESULTS_FILE).symlink_to(tmp_path / "outside" / "config.yaml")
    err = io.StringIO()
    code = cli.main([str(hostile), "--exec", "/bin/cat", "--results-dir", str(results)], stderr=err)
    assert code == cli.FAILED and "cannot write the results" in err.getvalue()
    assert list(load_all((tmp_path / "outside" / "config.yaml").read_text())) == [SECRET]


def test_an_output_directory_that_cannot_be_made_is_a_clear_error(hostile: Path) -> None:
    out = Path("/proc/self/krt-output")  # nothing may be created in /proc, whoever runs the test
    err = io.StringIO()
    code = cli.main([str(hostile), "--exec", "/bin/cat", "-o", str(out)], stderr=err)
    assert code == cli.FAILED
    assert f"krt: cannot write the output: {out}: cannot create the directory" in err.getvalue()
    assert "Traceback" not in err.getvalue()
