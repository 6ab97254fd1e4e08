"""py-spy helper for bench/invoke.py --profile: sample server processes while a load runs.

Each target process gets a `py-spy record --format raw` (collapsed stacks, one line per distinct
stack: `frame;frame;... count`, the format speedscope and flamegraph.pl read) for the middle of
the load window. py-spy (non-blocking) drops threads that are not runnable (blocked in epoll, a
lock, a pipe read), so a frame's share of the samples approximates its share of the process's
CPU; on a busy machine runnable-but-waiting threads are sampled too, so the raw sample time
overstates CPU. The summary therefore spreads the process's measured CPU over the sampling
window (utime + stime from /proc) across frames by their share of samples: µs of CPU per call.
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

from _benchlib import cpu_seconds

LEAD_IN_S = 0.5  # the load runs this long before sampling starts
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str:
    local = Path(sys.executable).with_name("py-spy")
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def _short_file(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        at = path.find(marker)
        if at >= 0:
            rest = path[at + len(marker) :]
            return rest.split("/", 1)[1] if marker == "/lib/python3" and "/" in rest else rest
    return path


def _frame_key(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({_short_file(m['file'])})"


@dataclass
class Target:
    label: str
    pid: int
    share: float = 1.0  # the fraction of the calls this process serves (one of n function processes: 1/n)


@dataclass
class Profile:
    label: str
    pid: int
    path: Path
    rate: int
    share: float
    window_fraction: float  # sampled seconds / load seconds
    cpu_s: float = 0.0  # the process's CPU over the sampling window
    samples: int = 0
    self_: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    error: str = ""

    def load(self) -> None:
        try:
            text = self.path.read_text(errors="replace")
        except OSError as exc:
            self.error = str(exc)
            return
        for line in text.splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_frame_key(f) for f in stack.split(";") if f]
            if not frames:
                continue
            self.samples += count
            self.self_[frames[-1]] += count
            for key in set(frames):
                self.inclusive[key] += count

    def us_per_call(self, samples: int, calls: int) -> float:
        """CPU µs per call attributed to `samples` of this profile (by share of all samples)."""
        calls_here = calls * self.window_fraction * self.share
        if not calls_here or not self.samples:
            return math.nan
        return samples / self.samples * self.cpu_s / calls_here * 1e6

    def render(self, calls: int, *, top: int = 30) -> str:
        if self.error or not self.samples:
            return f"\n-- {self.label} (pid {self.pid}): no samples {self.error}".rstrip()
        raw_us = self.samples / self.rate / max(calls * self.window_fraction * self.share, 1) * 1e6
        lines = [
            f"\n-- {self.label} (pid {self.pid}): {self.samples} samples at {self.rate}/s "
            f"({raw_us:.0f} µs/call of runnable time), CPU {self.us_per_call(self.samples, calls):.0f} "
            f"µs/call measured; {self.path}",
            f"   top {top} by self time (CPU µs/call, % of samples):",
        ]
        for key, n in self.self_.most_common(top):
            lines.append(f"   {self.us_per_call(n, calls):7.1f} {n / self.samples:6.1%}  {key}")
        lines.append(f"   top {top} by inclusive time:")
        for key, n in self.inclusive.most_common(top):
            lines.append(f"   {self.us_per_call(n, calls):7.1f} {n / self.samples:6.1%}  {key}")
        return "\n".join(lines)


async def profile_processes(
    targets: list[Target],
    driver: Awaitable[None],
    *,
    seconds: float,
    out_dir: Path,
    prefix: str,
    rate: int = 250,
    native: bool = False,
    gil: bool = False,
) -> list[Profile]:
    """Run `driver` (a load lasting `seconds`) while py-spy samples each target for most of it."""
    exe = py_spy()
    duration = max(1, int(seconds - LEAD_IN_S - 0.5))
    load = asyncio.ensure_future(driver)
    await asyncio.sleep(LEAD_IN_S)
    procs: list[tuple[Profile, asyncio.subprocess.Process]] = []
    for target in targets:
        path = out_dir / f"{prefix}-{target.label}.txt"
        argv = [exe, "record", "-p", str(target.pid), "-d", str(duration), "-r", str(rate), "-f", "raw"]
        argv += ["-o", str(path)]
        argv += ["--native"] if native else ["--nonblocking"]
        argv += ["--gil"] if gil else []
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        profile = Profile(target.label, target.pid, path, rate, target.share, duration / seconds)
        profile.cpu_s = -cpu_seconds(target.pid)
        procs.append((profile, proc))
    started = time.perf_counter()
    profiles = []
    for profile, proc in procs:
        _, err = await proc.communicate()
        profile.cpu_s += cpu_seconds(profile.pid)
        profile.window_fraction = min(1.0, (time.perf_counter() - started) / seconds)
        if proc.returncode != 0:
            profile.error = f"py-spy exited {proc.returncode}: {err.decode(errors='replace')[-300:]}"
        profiles.append(profile)
    await load
    for profile in profiles:
        if not profile.error:
            profile.load()
    return profiles
