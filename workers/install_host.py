"""`krt install-host DIR [--bundle BUNDLE]`: put a runnable `krt` at DIR/bin/krt, for a host
container of an image without kruntimes in it (the init container of a runtime with
`kubernetes.hostInjection` runs this into the emptyDir the host container runs `krt host` from).

- With a bundle (`--bundle`, or $KRT_HOST_BUNDLE): a self-contained installation (its own
  interpreter and packages, relocatable, with `bin/krt`) is copied into DIR whole.
- Without one: DIR/bin/krt is a launcher of this interpreter and this installation, which runs
  wherever they are visible at the same paths (a node-local installation, the test kubelet).

Exit codes: 0 installed, 1 cannot install, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

import kruntimes

LAUNCHER = """#!/bin/sh
# Written by `krt install-host`: this installation's krt, run from where it is installed.
PYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}} exec {python} -m kruntimes.workers.krt "$@"
"""


def install(target: Path, *, bundle: Path | None) -> Path:
    """Install into `target`; the path of its `bin/krt`. ValueError says why it cannot."""
    krt = target / "bin" / "krt"
    if bundle is not None:
        if not (bundle / "bin" / "krt").is_file():
            raise ValueError(f"{bundle} is not a host bundle: it has no bin/krt")
        shutil.copytree(bundle, target, symlinks=True, dirs_exist_ok=True)
    else:
        root = Path(kruntimes.__file__).parent.parent  # the directory kruntimes is imported from
        krt.parent.mkdir(parents=True, exist_ok=True)
        krt.write_text(LAUNCHER.format(path=shlex.quote(str(root)), python=shlex.quote(sys.executable)))
    krt.chmod(0o755)
    if not os.access(krt, os.X_OK):
        raise ValueError(f"{krt} is not executable")
    return krt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="krt install-host", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="where to install (DIR/bin/krt)")
    parser.add_argument(
        "--bundle",
        type=Path,
        default=Path(os.environ["KRT_HOST_BUNDLE"]) if os.environ.get("KRT_HOST_BUNDLE") else None,
        help="a self-contained installation to copy (default: $KRT_HOST_BUNDLE; none: a launcher)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        krt = install(args.directory, bundle=args.bundle)
    except (OSError, ValueError) as e:
        print(f"krt install-host: {e}", file=sys.stderr)
        return 1
    print(f"installed {krt}")
    return 0
