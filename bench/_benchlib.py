"""Helpers the benchmarks share: /proc accounting, percentiles, ratios, tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class BenchError(Exception):
    pass


@dataclass
class Server:
    """A server process of a bench; `ready` is the JSON it wrote to its --ready-file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return str(self.ready["address"])

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []


async def start_server(name: str, argv: list[str], tmp: Path, servers: list[Server]) -> Server:
    """Start a server that writes a JSON object to the --ready-file appended to `argv`."""
    ready = tmp / f"{name}.ready.json"
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*argv, "--ready-file", str(ready)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Server(name, proc, log_path)
    servers.append(server)  # from here on the caller's finally stops it
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None:
            tail = "\n".join(server.log_lines()[-20:])
            raise BenchError(f"{name} exited with {proc.returncode} before serving:\n{tail}")
        if time.monotonic() > deadline:
            raise BenchError(f"{name} did not write {ready} within {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.02)
    server.ready = json.loads(ready.read_text())
    return server


def stop_server(server: Server) -> None:
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"warning: {server.name} (pid {proc.pid}) ignored SIGTERM; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat from field 3 (state) on; field n is at index n - 3."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw.rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads; reaped children not included)."""
    try:
        fields = _stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of all threads of a process."""
    total = 0
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                for line in Path(task.path, "status").read_text().splitlines():
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
    return total


def children(ppid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[1]) == ppid:
                pids.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return sorted(pids)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def table(rows: list[list[str]]) -> Iterator[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        yield "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)
        if n == 0:
            yield "  ".join("-" * w for w in widths)


# --- driving calls ----------------------------------------------------------------------------
# A "call" is `call(i)`: one request on behalf of caller i (caller i always uses function i).

Call = Callable[[int], Awaitable[object]]
OnError = Callable[[BaseException], None]


async def warm_up(call: Call, *, calls: int, callers: int, concurrent: bool) -> None:
    """`calls` untimed calls, one after another or spread over `callers` concurrent callers."""
    if not concurrent:
        for _ in range(calls):
            await call(0)
        return
    per_caller = math.ceil(calls / callers)

    async def warm(i: int) -> None:
        for _ in range(per_caller):
            await call(i)

    await asyncio.gather(*(warm(i) for i in range(callers)))


async def timed_sequential(call: Call, *, calls: int, max_seconds: float, on_error: OnError) -> list[float]:
    """Up to `calls` calls one after another (stopping after `max_seconds`): latencies in ms."""
    latencies: list[float] = []
    deadline = time.perf_counter() + max_seconds
    for _ in range(calls):
        t0 = time.perf_counter()
        if t0 > deadline:
            break
        try:
            await call(0)
        except Exception as exc:
            on_error(exc)
            continue
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


async def timed_concurrent(
    call: Call, *, callers: int, seconds: float, max_calls_per_caller: int, on_error: OnError
) -> tuple[list[float], float]:
    """`callers` callers calling back to back for `seconds`: (latencies in ms, elapsed s)."""
    latencies: list[list[float]] = [[] for _ in range(callers)]
    stop_at = time.perf_counter() + seconds

    async def caller(i: int) -> None:
        out = latencies[i]
        for _ in range(max_calls_per_caller):
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            try:
                await call(i)
            except Exception as exc:
                on_error(exc)
                continue
            out.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return [x for lat in latencies for x in lat], time.perf_counter() - started
