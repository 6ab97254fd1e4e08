from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.sdk.stack import Platform


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


async def krt(
    platform: Platform,
    *args: str,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Done:
    """`krt ...` as a subprocess (without blocking the loop the platform runs on); `env`: more
    variables (KRT_IDENTITY, say)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kruntimes.cli.main",
        *args,
        env={**platform.env(), **(env or {})},
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 90)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("krt: "), f"not one `krt: ` line: {err!r}"
    assert "Traceback" not in err
    return lines[0]
