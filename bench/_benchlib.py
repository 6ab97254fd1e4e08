"""Helpers the benchmarks share: server processes, /proc accounting, the measured paths and how
they are driven, the runtime host's requests, percentiles, ratios, tables and report formatting.

Importing it puts the repository root on sys.path, so a bench runs from any directory, also
without the editable install: import it before any module of the repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kruntimes.rpc.v1 import runtime_pb2 as pb  # noqa: E402 - needs the root on sys.path
from kruntimes.sdk import config as clientconfig  # noqa: E402 - needs the root on sys.path
from kruntimes.sdk.config import ClientConfig  # noqa: E402 - needs the root on sys.path
from kruntimes.system.serving import stop_event, write_ready_file  # noqa: E402 - needs the root on sys.path

CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 10.0  # the bound on one measured call
STOP_TIMEOUT_S = 10.0
PROBLEM_WORDS = ("ERROR", "Traceback", "error")  # a server log line with one of these is a problem


class BenchError(Exception):
    pass


class HttpStatusError(Exception):
    """An HTTP answer other than 200."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


# --- the embedded platform ----------------------------------------------------------------------


def krt_env(state: Path) -> dict[str, str]:
    """The environment of a `krt` command against the embedded platform in ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
    env["KRT_STATE_DIR"] = str(state)
    return env


def krt(state: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`krt ARGS` against the embedded platform in ``state``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.krt", *args],
        capture_output=True, text=True, env=krt_env(state), cwd=ROOT, timeout=timeout, check=False,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def embedded_platform(*, prefix: str, runtimes: str) -> AsyncIterator[tuple[Path, ClientConfig]]:
    """`krt up --detach` in a new state directory whose runtimes file is ``runtimes``, and
    `krt down` after: the state directory and the SDK's configuration of the platform. The
    directory is removed after `krt down` (a 10,000-Run platform leaves ~350 MB of SQLite)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    state = root / "state"
    try:
        state.mkdir()
        (state / "runtimes.yaml").write_text(runtimes)
        try:  # `krt down` after a failed `krt up` too: it stops what that one started
            up = await asyncio.to_thread(krt, state, "up", "--detach")
            if up.returncode != 0:
                raise RuntimeError(f"krt up failed: {up.stderr.strip()}")
            yield state, clientconfig.load({"KRT_STATE_DIR": str(state)})
        finally:
            await asyncio.to_thread(krt, state, "down")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- server processes -------------------------------------------------------------------------


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

    def problems(self) -> list[str]:
        """The lines of its log that report an error."""
        return [line for line in self.log_lines() if any(w in line for w in PROBLEM_WORDS)]


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


def write_ready(path: Path, **fields: str) -> None:
    """A bench server's side of `start_server`: {"pid", **fields} written to its ready file at once."""
    write_ready_file(path, **fields)


async def wait_for_signal() -> None:
    """Until SIGTERM or SIGINT (a bench server's way to stop)."""
    await stop_event().wait()


def note(message: str) -> None:
    """Progress and warnings, on stderr (stdout holds the report)."""
    print(message, file=sys.stderr, flush=True)


# --- /proc accounting -------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat from field 3 (state) on; field n is at index n - 3."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw.rsplit(")", 1)[1].split()


def _live_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process alive while /proc is read."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        yield int(entry.name), fields


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads; reaped children not included)."""
    try:
        fields = _stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine was busy (every CPU, user and kernel, not idle or waiting on
    I/O) since boot, from /proc/stat. Per-process figures miss what a host's function processes
    use: each runs in a session of its own, and their forks and copy-on-write faults are most of it."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks[:8]) - idle - iowait) / CLK_TCK


def sessions_cpu_seconds(sessions: Iterable[int]) -> dict[int, float]:
    """utime + stime of every live process in each of `sessions`, plus the reaped children of its
    leader, from one reading of /proc (a reading costs this process milliseconds when thousands
    of processes run: one per session was ~10 of them)."""
    ticks = dict.fromkeys(sessions, 0)
    for pid, fields in _live_stats():
        session = int(fields[3])
        if session not in ticks:
            continue
        ticks[session] += int(fields[11]) + int(fields[12])
        if pid == session:
            ticks[session] += int(fields[13]) + int(fields[14])
    return {session: t / CLK_TCK for session, t in ticks.items()}


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
    for pid, fields in _live_stats():
        with contextlib.suppress(IndexError, ValueError):
            if int(fields[1]) == ppid:
                pids.append(pid)
    return sorted(pids)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def zygote_of(host_pid: int) -> int | None:
    """The runtime host's zygote (the parent of its function processes)."""
    kids = children(host_pid)
    for pid in kids:
        if "kruntimes.runtime.zygote" in cmdline(pid):
            return pid
    return kids[0] if len(kids) == 1 else None


def function_pids(host_pid: int) -> list[int]:
    """The runtime host's function processes: every descendant of its zygote (an isolated
    function is the child of the init of its own PID namespace, itself the zygote's child)."""
    zygote = zygote_of(host_pid)
    found: list[int] = []
    level = children(zygote) if zygote is not None else []
    while level:
        found += level
        level = [grandchild for pid in level for grandchild in children(pid)]
    return sorted(found)


# --- the runtime host -------------------------------------------------------------------------

INVOKE_METHOD = "/kruntimes.rpc.v1.FunctionRuntime/InvokeFunction"
PAYLOAD = b'{"n": 1}'
HANDLER_SOURCE = b"def handle(payload):\n    return payload\n"


def register_request(
    index: int, *, namespace: str, run_uid: str = "", assignment: pb.SignedAssignment | None = None
) -> pb.RegisterFunctionRequest:
    """Function `fn-<index>`: the echo handler, inline (a fresh run uid unless given), with the
    control plane's signed assignment of it to the host."""
    return pb.RegisterFunctionRequest(
        assignment=assignment,
        run=pb.RunRef(
            run_uid=run_uid or str(uuid.uuid4()),
            attempt=1,
            namespace=namespace,
            name=f"fn-{index}",
            runtime="python",
        ),
        config=pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=HANDLER_SOURCE)]),
        ),
    )


def check_invoke(raw: bytes) -> None:
    """A serialized InvokeFunctionResponse must say Succeeded."""
    response = pb.InvokeFunctionResponse.FromString(raw)
    if response.status != pb.INVOCATION_STATUS_SUCCEEDED:
        raise BenchError(f"invoke: {pb.InvocationStatus.Name(response.status)} {response.error}")


# --- memory ------------------------------------------------------------------------------------

PAGE_PROBE = Path(__file__).resolve().with_name("_page_probe.py")
PAGE_PROBE_PAGES = 8192  # 32 MiB


def page_costs_us() -> dict[str, float]:
    """What this machine charges for memory, in µs a page: a first write to fresh anonymous
    memory, and the copy a forked child makes when it first writes a page it shares with its
    parent (each function process takes hundreds of these as it starts: runtime/zygote.py). On a
    virtual machine that hands free memory back to its hypervisor, both cost several times what
    they cost on hardware. Measured in a process of its own (bench/_page_probe.py): a bench's
    own process has gRPC's threads, and forking it would copy its page tables too."""
    done = subprocess.run(
        [sys.executable, str(PAGE_PROBE), str(PAGE_PROBE_PAGES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


# --- numbers ----------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def round_ratios(a: list[float], b: list[float]) -> list[float]:
    """a / b round by round (as many rounds as both have)."""
    return [ratio(x, y) for x, y in zip(a, b, strict=False)]


def ms(seconds: float) -> float:
    """Seconds as milliseconds, to 0.1 ms."""
    return round(seconds * 1000, 1)


def fmt(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def span(values: list[float], *, median: bool = False) -> str:
    """min–max of per-round values (with their median if asked)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    text = f"{min(finite):.2f}–{max(finite):.2f}"
    return f"{text} (median {percentile(finite, 50):.2f})" if median else text


def table(rows: list[list[str]], *, align_right: bool = True) -> Iterator[str]:
    """The rows under their header (rows[0]) and a rule; columns after the first right-aligned
    unless `align_right` is False."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        yield "  ".join(c.ljust(w) if i == 0 or not align_right else c.rjust(w) for i, (c, w) in pairs)
        if n == 0:
            yield "  ".join("-" * w for w in widths)


def _finite(value: Any) -> Any:
    """NaN (something that could not be measured) becomes null, so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def print_json_line(result: dict[str, Any]) -> None:
    """The bench's final line: its results as compact JSON (what could not be measured is null)."""
    print(json.dumps(_finite(result), separators=(",", ":"), allow_nan=False))


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


def error_name(exc: BaseException) -> str:
    """How a failed call is counted: its gRPC status code, its HTTP status, else its type."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    if isinstance(exc, HttpStatusError):
        return f"HTTP{exc.status}"
    return type(exc).__name__


@dataclass
class Subject:
    """One measured path and everything measured on it, summed over the rounds.

    `procs` names the server processes of the path (label -> pids); their CPU and context
    switches are summed per label.
    """

    key: str
    name: str
    call: Call
    procs: dict[str, list[int]]
    seq_ms: list[float] = field(default_factory=list)
    seq_cpu_s: Counter[str] = field(default_factory=Counter)
    load_ms: list[float] = field(default_factory=list)
    load_s: float = 0.0
    load_cpu_s: Counter[str] = field(default_factory=Counter)
    load_switches: Counter[str] = field(default_factory=Counter)
    client_cpu_s: float = 0.0
    round_p50: list[float] = field(default_factory=list)
    round_p99: list[float] = field(default_factory=list)
    round_rps: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    first_error: str = ""

    def cpu(self) -> dict[str, float]:
        return {label: sum(map(cpu_seconds, pids)) for label, pids in self.procs.items()}

    def switches(self) -> dict[str, int]:
        return {label: sum(map(context_switches, pids)) for label, pids in self.procs.items()}

    def switches_per_call(self, label: str) -> float:
        return self.load_switches[label] / len(self.load_ms) if self.load_ms else math.nan

    def seq(self, q: float) -> float:
        return percentile(self.seq_ms, q)

    @property
    def rps(self) -> float:
        return len(self.load_ms) / self.load_s if self.load_s > 0 else math.nan

    def load_cpu_us(self, label: str | None = None) -> float:
        """Server CPU per call in the concurrent phase: of one label, or of all of them."""
        seconds = sum(self.load_cpu_s.values()) if label is None else self.load_cpu_s[label]
        return seconds / len(self.load_ms) * 1e6 if self.load_ms else math.nan

    def seq_cpu_us(self, label: str | None = None) -> float:
        seconds = sum(self.seq_cpu_s.values()) if label is None else self.seq_cpu_s[label]
        return seconds / len(self.seq_ms) * 1e6 if self.seq_ms else math.nan

    @property
    def client_cpu_us(self) -> float:
        return self.client_cpu_s / len(self.load_ms) * 1e6 if self.load_ms else math.nan

    def record_error(self, exc: BaseException) -> None:
        self.errors[error_name(exc)] += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    def latency_cells(self) -> list[str]:
        """The row of LATENCY_HEADER."""
        return [
            self.name,
            fmt(self.seq(50)),
            fmt(self.seq(99)),
            fmt(max(self.seq_ms, default=math.nan), 2),
            fmt(self.rps, 0),
            fmt(percentile(self.load_ms, 50), 2),
            fmt(percentile(self.load_ms, 99), 2),
        ]

    def errors_cell(self) -> str:
        return ",".join(f"{k}:{v}" for k, v in self.errors.items()) or "0"

    def latency_summary(self) -> dict[str, Any]:
        return {
            "seq_calls": len(self.seq_ms),
            "seq_p50_ms": round(self.seq(50), 4),
            "seq_p99_ms": round(self.seq(99), 4),
            "seq_max_ms": round(max(self.seq_ms, default=math.nan), 3),
            "load_calls": len(self.load_ms),
            "rps": round(self.rps, 1),
            "load_p50_ms": round(percentile(self.load_ms, 50), 3),
            "load_p99_ms": round(percentile(self.load_ms, 99), 3),
        }


@dataclass(frozen=True)
class Ratios:
    """Path a against path b: sequential p50 and p99 and the rps, overall and round by round."""

    p50: float
    p99: float
    rps: float
    round_p50: list[float]
    round_p99: list[float]
    round_rps: list[float]


def ratios(a: Subject, b: Subject) -> Ratios:
    return Ratios(
        p50=ratio(a.seq(50), b.seq(50)),
        p99=ratio(a.seq(99), b.seq(99)),
        rps=ratio(a.rps, b.rps),
        round_p50=round_ratios(a.round_p50, b.round_p50),
        round_p99=round_ratios(a.round_p99, b.round_p99),
        round_rps=round_ratios(a.round_rps, b.round_rps),
    )


LATENCY_HEADER = [
    "path",
    "seq p50 ms",
    "seq p99 ms",
    "seq max ms",
    "32-way rps",
    "load p50 ms",
    "load p99 ms",
]


@dataclass(frozen=True)
class Plan:
    """How a bench measures its paths: in interleaved rounds, each round 1/`rounds` of every
    phase of every path (warm-up calls before each piece), so background load on a shared
    machine hits all paths alike."""

    rounds: int
    seq_chunk_max_s: float  # one round's sequential piece stops after this long
    load_max_calls_per_caller: int
    rounds_budget_s: float  # no new round starts after this many seconds of the bench
    warmup_calls: int = 200
    seq_calls: int = 2000  # over all rounds
    callers: int = 32
    load_seconds: float = 3.0  # over all rounds

    def describe(self, rounds_done: int) -> str:
        return (
            f"{self.seq_calls} sequential calls and {self.callers} callers x {self.load_seconds:g} s per "
            f"path, interleaved in {rounds_done} rounds"
        )

    async def warm_up(self, subject: Subject, *, concurrent: bool) -> None:
        await warm_up(subject.call, calls=self.warmup_calls, callers=self.callers, concurrent=concurrent)

    async def sequential(self, subject: Subject, calls: int) -> None:
        await self.warm_up(subject, concurrent=False)
        cpu0 = subject.cpu()
        latencies = await timed_sequential(
            subject.call, calls=calls, max_seconds=self.seq_chunk_max_s, on_error=subject.record_error
        )
        subject.seq_cpu_s.update({k: v - cpu0[k] for k, v in subject.cpu().items()})
        subject.seq_ms.extend(latencies)
        subject.round_p50.append(percentile(latencies, 50))
        subject.round_p99.append(percentile(latencies, 99))

    async def load(self, subject: Subject, seconds: float) -> tuple[int, float]:
        """`callers` callers, each calling back to back (caller i always uses function i)."""
        latencies, elapsed = await timed_concurrent(
            subject.call,
            callers=self.callers,
            seconds=seconds,
            max_calls_per_caller=self.load_max_calls_per_caller,
            on_error=subject.record_error,
        )
        subject.load_ms.extend(latencies)
        return len(latencies), elapsed

    async def concurrent(self, subject: Subject, seconds: float) -> None:
        await self.warm_up(subject, concurrent=True)
        cpu0, switches0, client0 = subject.cpu(), subject.switches(), time.process_time()
        calls, elapsed = await self.load(subject, seconds)
        subject.client_cpu_s += time.process_time() - client0
        subject.load_cpu_s.update({k: v - cpu0[k] for k, v in subject.cpu().items()})
        subject.load_switches.update({k: v - switches0[k] for k, v in subject.switches().items()})
        subject.load_s += elapsed
        subject.round_rps.append(calls / elapsed)

    async def run(
        self,
        subjects: dict[str, Subject],
        started: float,
        *,
        after_round: Callable[[int], Awaitable[None]] | None = None,
    ) -> int:
        """Every round that starts within the budget (each followed by `after_round(r)` if given:
        a bench's own paired measurement, spread over the run); returns how many ran."""
        rounds = 0
        order = list(subjects.values())
        for r in range(self.rounds):
            if time.perf_counter() - started > self.rounds_budget_s:
                note(f"warning: time budget spent; stopping after {rounds} rounds")
                break
            note(f"round {r + 1}/{self.rounds} ...")
            rotated = order[r % len(order) :] + order[: r % len(order)]
            for subject in rotated:
                await self.sequential(subject, self.seq_calls // self.rounds)
            for subject in rotated:
                await self.concurrent(subject, self.load_seconds / self.rounds)
            if after_round is not None:
                await after_round(r)
            rounds += 1
        return rounds


def run_bench(bench: Callable[[str], Awaitable[None]], *, deadline_s: float) -> None:
    """Run `bench(client_loop)` on uvloop when importable (else asyncio) within `deadline_s`;
    a BenchError or the deadline exits with the reason."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory, client_loop = uvloop.new_event_loop, "uvloop"
    except ImportError:
        loop_factory, client_loop = None, "asyncio"
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            runner.run(asyncio.wait_for(bench(client_loop), deadline_s))
        except BenchError as exc:
            sys.exit(f"bench failed: {exc}")
        except TimeoutError:
            sys.exit(f"bench failed: did not finish within {deadline_s:.0f} s")
