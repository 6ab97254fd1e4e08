"""`krt install-host`: a bundle copied whole, or a launcher of this installation that runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kruntimes.workers import install_host


def test_without_a_bundle_it_writes_a_launcher_of_this_installation(tmp_path: Path) -> None:
    assert install_host.main([str(tmp_path / "host")]) == 0
    krt = tmp_path / "host" / "bin" / "krt"
    done = subprocess.run([str(krt), "host", "--help"], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0 and "--krm-concurrency" in done.stdout


def test_a_bundle_is_copied_whole(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "krt").write_text("#!/bin/sh\necho bundled\n")
    (bundle / "lib").mkdir()
    (bundle / "lib" / "x").write_text("x")
    assert install_host.main([str(tmp_path / "host"), "--bundle", str(bundle)]) == 0
    assert (tmp_path / "host" / "lib" / "x").read_text() == "x"
    done = subprocess.run(
        [str(tmp_path / "host" / "bin" / "krt")], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "bundled\n"


def test_a_directory_that_is_not_a_bundle_is_refused(tmp_path: Path, capsys) -> None:
    assert install_host.main([str(tmp_path / "host"), "--bundle", str(tmp_path)]) == 1
    assert "has no bin/krt" in capsys.readouterr().err
