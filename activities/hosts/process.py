"""The process provider: every host a detached local process, recorded in the state directory.

The files of one host, under ``{stateDir}/hosts/{runtime}/``::

    {hostId}.pid         its pid, written as soon as it is spawned
    {hostId}.ready.json  {"pid", "address", "hostUid"}, written by the host once it serves
    {hostId}.json        the record (a CreatedHost), written once the host passed its health check
    {hostId}.log         its stdout and stderr, appended across incarnations and kept on delete
    {hostId}.tls/        its certificate directory (0700; tls.key 0600) and the assignment public
                         key, issued at create by the provider's HostIssuer, renewed by
                         ``renew_certificates``, removed with the host

A pid is signalled only while /proc/<pid>/cmdline names that host's --host-id and --ready-file,
so a recycled pid is never killed. Linux only.

Outside this module: ``ProcessProvider``, its registration ``ProcessHosts``, and over a state
directory ``list_records``, ``stop_all``, ``host_running(record)``, ``work_root`` and
``remove_workspaces``; everything with a leading underscore is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kruntimes.activities.hosts._rpc import HostIdentity, HostRpcError, identify, serves
from kruntimes.activities.hosts.base import Fenced, ProviderSetup, options_of, provider_error, spec_error
from kruntimes.api._base import ApiModel
from kruntimes.api.names import validate_dns1123_label
from kruntimes.contracts.providers import CreatedHost, HostSandbox, HostSpec
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation
from kruntimes.pki import ASSIGNMENT_PUBLIC_KEY, HostIssuer
from kruntimes.system.paths import under

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "NAME",
    "ProcessHosts",
    "ProcessOptions",
    "ProcessProvider",
    "certificate_dirs",
    "host_running",
    "list_records",
    "remove_workspaces",
    "stop_all",
    "work_root",
]

log = logging.getLogger(__name__)

NAME = "process"

_POLL_S = 0.05
_LOG_TAIL_BYTES = 2048
_KILL_WAIT_S = 5.0
# Children this process spawned, kept until reaped so they never linger as zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}

# A slot's files, each `{hostId}{suffix}` (see above). A ready file's name ends in the record's
# suffix too: look for it first.
_PID = ".pid"
_READY = ".ready.json"
_RECORD = ".json"
_LOG = ".log"
_TLS = ".tls"


class _ReadyFile(ApiModel):
    pid: int
    address: str
    hostUid: str
    isolation: str = ""


# What a host process inherits of the worker's environment: nothing that could be a secret (a
# function that read its host's /proc/<pid>/environ — or a host that leaked it — finds only these).
_HOST_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")


def host_environment() -> dict[str, str]:
    env = {name: os.environ[name] for name in _HOST_ENVIRONMENT if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    return env


def host_flags(sandbox: HostSandbox) -> list[str]:
    """The `krt host` flags that carry a host's isolation settings and function limits."""
    limits = sandbox.limits
    argv = ["--isolation", sandbox.isolation, "--network", sandbox.network]
    for allowed in sandbox.egressAllow:
        argv += ["--egress-allow", allowed]
    argv += ["--open-files", str(limits.openFiles), "--processes", str(limits.processes)]
    argv += ["--memory-limit-mib", str((limits.memoryBytes or 0) // 2**20)]
    argv += ["--address-space-mib", str(limits.addressSpaceBytes // 2**20)]
    argv += ["--cpu-seconds", str(limits.cpuSeconds), "--file-size-mib", str(limits.fileSizeBytes // 2**20)]
    argv += ["--tmp-size-mib", str(limits.tmpBytes // 2**20)]
    for root in sandbox.allowedSourceRoots:
        argv += ["--allowed-source-root", root]
    for hidden in sandbox.hide:
        argv += ["--hide", hidden]
    for shared in sandbox.shared:
        argv += ["--share", shared]
    return argv


@dataclass(frozen=True)
class _Slot:
    """Where the files of one (state dir, runtime, hostId) live."""

    directory: Path
    host_id: str

    @classmethod
    def of(cls, state_dir: Path, runtime: str, host_id: str) -> _Slot:
        return cls(state_dir / "hosts" / runtime, host_id)

    def _file(self, suffix: str) -> Path:
        return self.directory / f"{self.host_id}{suffix}"

    @property
    def record(self) -> Path:
        return self._file(_RECORD)

    @property
    def ready(self) -> Path:
        return self._file(_READY)

    @property
    def pid_file(self) -> Path:
        return self._file(_PID)

    @property
    def log(self) -> Path:
        return self._file(_LOG)

    @property
    def tls(self) -> Path:
        return under(self.directory, f"{self.host_id}{_TLS}")

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is alive and is this slot's host (not a recycled pid)."""
        argv = _cmdline(pid)
        return (
            argv is not None
            and _flag(argv, "--host-id") == self.host_id
            and _flag(argv, "--ready-file") == str(self.ready)
        )

    def pids(self) -> set[int]:
        """Every pid the slot's files mention."""
        pids: set[int] = set()
        record = _read_record(self.record)
        if record is not None and record.pid is not None:
            pids.add(record.pid)
        ready = _read_ready(self.ready)
        if ready is not None:
            pids.add(ready.pid)
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(self.pid_file.read_text()))
        return pids

    def remove(self) -> None:
        for path in (self.record, self.ready, self.pid_file):
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".tmp").unlink(missing_ok=True)  # ours, see _write_atomic
        self.ready.with_suffix(".tmp").unlink(missing_ok=True)  # the host's
        shutil.rmtree(self.tls, ignore_errors=True)


class ProcessProvider:
    """Hosts as detached ``python -m kruntimes.workers.host`` processes on this machine, on 127.0.0.1.

    ``state_dir`` is where ``delete`` looks for records when this provider has not created the host
    itself (e.g. after a worker restart); the state directories of created hosts are remembered.
    """

    def __init__(
        self,
        *,
        name: str = NAME,
        python: str = sys.executable,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        state_dir: str | os.PathLike[str] | None = None,
        issuer: HostIssuer | None = None,
    ) -> None:
        """`issuer` gives every host it starts its certificate; without one, create refuses."""
        self.name = name
        self.issuer = issuer
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._state_dirs: dict[Path, None] = {}  # an ordered set
        if state_dir is not None:
            self._state_dirs[_absolute(state_dir)] = None
        self._locks: weakref.WeakValueDictionary[_Slot, asyncio.Lock] = weakref.WeakValueDictionary()

    async def create(self, spec: HostSpec) -> CreatedHost:
        state_dir = _absolute(spec.stateDir)
        self._state_dirs[state_dir] = None
        slot = _Slot.of(state_dir, spec.runtime, spec.hostId)
        try:
            slot.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._error(
                FailureReason.OperationRejected, spec, f"cannot use state directory {spec.stateDir!r}: {e}"
            ) from e
        async with self._lock(slot):
            try:
                existing = await self._serving_record(slot, spec)
                if existing is not None:
                    return existing
                await _stop_slot(slot, grace_s=self.stop_timeout_s)
                return await self._start(slot, spec, state_dir)
            except OSError as e:
                raise self._error(FailureReason.OperationFailed, spec, f"{type(e).__name__}: {e}") from e

    async def delete(self, *, runtime: str, host_id: str, host_uid: str) -> bool:
        try:
            validate_dns1123_label(runtime, field="runtime")
            validate_dns1123_label(host_id, field="hostId")
        except ValueError as e:
            raise provider_error(
                FailureReason.OperationRejected,
                provider=self.name,
                operation=ProviderOperation.Delete,
                host=host_id,
                message=str(e),
            ) from e
        if not self._state_dirs:
            raise provider_error(
                FailureReason.OperationRejected,
                provider=self.name,
                operation=ProviderOperation.Delete,
                host=host_id,
                message="the process provider knows no state directory (construct it with state_dir=...)",
            )
        stopped = False
        for state_dir in list(self._state_dirs):
            slot = _Slot.of(state_dir, runtime, host_id)
            async with self._lock(slot):
                try:
                    stopped |= await _stop_slot(slot, grace_s=self.stop_timeout_s, host_uid=host_uid)
                except OSError as e:
                    raise provider_error(
                        FailureReason.OperationFailed,
                        provider=self.name,
                        operation=ProviderOperation.Delete,
                        host=host_id,
                        message=f"{type(e).__name__}: {e}",
                    ) from e
        return stopped

    async def probe(self, host: CreatedHost) -> bool:
        return await serves(host, timeout_s=self.rpc_timeout_s)

    async def gone(self, host: CreatedHost) -> bool:
        """That incarnation's process no longer runs (or never was one of ours)."""
        slots = [_Slot.of(d, host.runtime, host.hostId) for d in self._state_dirs]
        return not any(self._incarnation_pid(slot, host) for slot in slots)

    async def fence(self, host: CreatedHost) -> Fenced:
        """Kill that incarnation's process group (SIGKILL: a frozen host cannot handle SIGTERM),
        see it gone, then remove its files and its workspaces: nothing of it can serve again."""
        if not self._state_dirs:
            return Fenced(False, "the process provider knows no state directory")
        killed: list[int] = []
        for state_dir in list(self._state_dirs):
            slot = _Slot.of(state_dir, host.runtime, host.hostId)
            async with self._lock(slot):
                pid = self._incarnation_pid(slot, host)
                if pid is not None:
                    _kill(pid)
                    if not await _wait_gone(pid, timeout_s=_KILL_WAIT_S):
                        return Fenced(False, f"process {pid} survived SIGKILL for {_KILL_WAIT_S:g}s")
                    killed.append(pid)
                record = _read_record(slot.record)
                if record is not None and record.hostUid == host.hostUid:
                    slot.remove()
                remove_workspaces(state_dir, host.hostUid)
        if killed:
            return Fenced(True, f"process {', '.join(map(str, killed))} killed and gone")
        return Fenced(True, f"process {host.pid or '?'} is gone")

    def _incarnation_pid(self, slot: _Slot, host: CreatedHost) -> int | None:
        """The live pid of exactly this incarnation of the slot's host, if it still runs."""
        pids = {host.pid} if host.pid is not None else set()
        for found in (_read_record(slot.record), _read_ready(slot.ready)):
            if found is not None and found.hostUid == host.hostUid and found.pid is not None:
                pids.add(found.pid)
        return next((pid for pid in sorted(pids) if slot.owns(pid)), None)

    def _lock(self, slot: _Slot) -> asyncio.Lock:
        lock = self._locks.get(slot)
        if lock is None:
            lock = self._locks[slot] = asyncio.Lock()
        return lock

    async def _serving_record(self, slot: _Slot, spec: HostSpec) -> CreatedHost | None:
        """The recorded host of this slot if its process still runs and serves as that host."""
        record = _read_record(slot.record)
        if record is None or record.pid is None or not slot.owns(record.pid):
            return None
        try:
            identity = await identify(record.address, timeout_s=self.rpc_timeout_s)
        except HostRpcError:
            return None
        if identity.host_uid != record.hostUid or identity.host_id != spec.hostId:
            return None
        return record

    def records(self, state_dir: str | os.PathLike[str]) -> list[CreatedHost]:
        return [r for r in list_records(state_dir) if r.provider == self.name]

    def running(self, record: CreatedHost) -> bool:
        return host_running(record)

    def work_root(self, state_dir: str | os.PathLike[str]) -> Path:
        return work_root(state_dir)

    def renew_certificates(self) -> int:
        """Re-issue the certificates of this provider's hosts that are due; returns how many."""
        if self.issuer is None:
            return 0
        directories = [d for state_dir in list(self._state_dirs) for d in certificate_dirs(state_dir)]
        return self.issuer.renew_due(directories)

    async def _start(self, slot: _Slot, spec: HostSpec, state_dir: Path) -> CreatedHost:
        if self.issuer is None:
            raise self._error(
                FailureReason.OperationRejected, spec, "the process provider has no certificate issuer"
            )
        self.issuer.issue(slot.tls, runtime=spec.runtime, host_id=spec.hostId)
        argv = [
            self.python,
            "-m",
            "kruntimes.workers.host",
            "--host-id",
            spec.hostId,
            "--runtime",
            spec.runtime,
        ]
        argv += ["--listen", "127.0.0.1:0", "--state-dir", str(state_dir), "--ready-file", str(slot.ready)]
        argv += [
            "--peer-tls",
            str(slot.tls),
            "--assignment-public-key",
            str(slot.tls / ASSIGNMENT_PUBLIC_KEY),
        ]
        argv += host_flags(spec.sandbox)
        for gateway in spec.gateways:
            argv += ["--gateway", gateway]
        argv += ["--heartbeat-interval", str(spec.heartbeatIntervalSeconds)]
        log_offset = slot.log.stat().st_size if slot.log.exists() else 0
        with open(slot.log, "ab") as log_file:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=host_environment(),
                )
            except OSError as e:
                raise self._error(
                    FailureReason.OperationRejected, spec, f"cannot start {self.python!r}: {e}"
                ) from e
        _CHILDREN[proc.pid] = proc
        try:
            _write_atomic(slot.pid_file, str(proc.pid))
            ready, identity = await self._await_ready(slot, spec, proc, log_offset)
            host = CreatedHost(
                provider=self.name,
                runtime=spec.runtime,
                hostId=spec.hostId,
                hostUid=identity.host_uid,
                address=ready.address,
                pid=proc.pid,
                createdAt=datetime.now(UTC),
                isolation=ready.isolation,
            )
            _write_atomic(slot.record, host.model_dump_json())
            log.info("host started", extra={"host": spec.hostId, "address": host.address, "pid": proc.pid})
            return host
        except asyncio.CancelledError:
            _kill(proc.pid)
            slot.remove()
            raise
        except Exception:
            _kill(proc.pid)
            await _wait_gone(proc.pid, timeout_s=_KILL_WAIT_S)
            slot.remove()
            raise

    async def _await_ready(
        self, slot: _Slot, spec: HostSpec, proc: subprocess.Popen[bytes], log_offset: int
    ) -> tuple[_ReadyFile, HostIdentity]:
        """Wait for the ready file, then for the health check; bounded by start_timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        ready: _ReadyFile | None = None
        problem = "it wrote no ready file"
        while True:
            code = proc.poll()
            if code is not None:
                raise self._error(
                    FailureReason.OperationFailed,
                    spec,
                    f"host process exited with status {code} before it was ready; "
                    f"log {slot.log}: {_log_tail(slot.log, log_offset)}",
                )
            if ready is None:
                found = _read_ready(slot.ready)
                ready = found if found is not None and found.pid == proc.pid else None
            if ready is not None:
                try:
                    identity = await identify(
                        ready.address, timeout_s=max(min(self.rpc_timeout_s, deadline - loop.time()), _POLL_S)
                    )
                except HostRpcError as e:
                    problem = f"its health check failed: {e}"
                else:
                    if (identity.host_id, identity.host_uid, identity.runtime) == (
                        spec.hostId,
                        ready.hostUid,
                        spec.runtime,
                    ):
                        return ready, identity
                    raise self._error(
                        FailureReason.OperationFailed,
                        spec,
                        f"{ready.address} serves host {identity.host_id!r} ({identity.runtime}, "
                        f"uid {identity.host_uid}), not the host that was started",
                    )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._error(
                    FailureReason.ReadinessTimeout,
                    spec,
                    f"host was not ready within {self.start_timeout_s:g}s ({problem}); "
                    f"log {slot.log}: {_log_tail(slot.log, log_offset)}",
                )
            await asyncio.sleep(min(_POLL_S, remaining))

    def _error(self, reason: FailureReason, spec: HostSpec, message: str) -> ProviderError:
        return spec_error(
            reason, spec, provider=self.name, operation=ProviderOperation.Create, message=message
        )


class ProcessOptions(ApiModel):
    """The process provider's own settings (the worker's state directory and issuer aside)."""

    python: str = sys.executable  # the interpreter its hosts run on
    startTimeoutSeconds: float = 30.0  # a host that does not serve by then is stopped


# Host certificates are checked this often for renewal: a small part of their lifetime, at most
# a minute (a check reads a few files).
_RENEW_MAX = timedelta(minutes=1)
_RENEW_PARTS = 30


def renewal_interval(lifetime: timedelta) -> float:
    return min(_RENEW_MAX.total_seconds(), lifetime.total_seconds() / _RENEW_PARTS)


class ProcessHosts:
    """The process provider's registration: always started; its start-up task renews the
    certificates of its hosts as they come due (when the worker has the platform CA)."""

    name = NAME

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def options_from(self, args: argparse.Namespace) -> ProcessOptions | None:
        return None

    def check(self, setup: ProviderSetup) -> None:
        options_of(setup, self.name, ProcessOptions)

    @contextlib.asynccontextmanager
    async def start(self, setup: ProviderSetup, *, client: Client | None) -> AsyncIterator[ProcessProvider]:
        options = options_of(setup, self.name, ProcessOptions)
        provider = ProcessProvider(
            name=self.name,
            python=options.python,
            start_timeout_s=options.startTimeoutSeconds,
            state_dir=setup.state_dir or None,
            issuer=setup.issuer,
        )
        if setup.issuer is None:
            yield provider
            return
        every_s = renewal_interval(setup.issuer.lifetime)
        renewing = asyncio.create_task(_renew_certificates(provider, every_s=every_s))
        try:
            yield provider
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)


async def _renew_certificates(provider: ProcessProvider, *, every_s: float) -> None:
    """Re-issue the certificates of the provider's hosts as they come due, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(provider.renew_certificates)
        except OSError:
            log.warning("renewing host certificates failed", exc_info=True)


def list_records(state_dir: str | os.PathLike[str]) -> list[CreatedHost]:
    """Every host recorded under ``state_dir``, of every runtime, by runtime then hostId."""
    hosts = []
    for path in sorted(_absolute(state_dir).glob(f"hosts/*/*{_RECORD}")):
        if path.name.endswith(_READY):
            continue
        record = _read_record(path)
        if record is None:
            log.warning("unreadable host record", extra={"path": str(path)})
        else:
            hosts.append(record)
    return hosts


def certificate_dirs(state_dir: str | os.PathLike[str]) -> list[Path]:
    """The certificate directories of the hosts under ``state_dir``."""
    return sorted(p for p in _absolute(state_dir).glob(f"hosts/*/*{_TLS}") if p.is_dir())


def work_root(state_dir: str | os.PathLike[str]) -> Path:
    """Where the hosts of a state directory keep their workspaces: one directory per host uid."""
    return _absolute(state_dir) / "work"


def remove_workspaces(state_dir: str | os.PathLike[str], host_uid: str) -> bool:
    """Remove the workspaces of one host incarnation (a dead or deleted one); True if there were."""
    if not host_uid or "/" in host_uid or host_uid in (".", ".."):
        raise ValueError(f"not a host uid: {host_uid!r:.80}")
    path = work_root(state_dir) / host_uid
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def host_running(record: CreatedHost) -> bool:
    """Whether the process of a recorded host still runs (a zombie does not); False without a pid."""
    return record.pid is not None and _alive(record.pid)


async def stop_all(state_dir: str | os.PathLike[str], *, grace_s: float = 10.0) -> int:
    """Stop every host recorded (or still starting) under ``state_dir``; returns how many were running."""
    stopped = 0
    for slot in _slots(_absolute(state_dir)):
        try:
            stopped += await _stop_slot(slot, grace_s=grace_s)
        except OSError as e:
            raise provider_error(
                FailureReason.OperationFailed,
                provider=NAME,
                operation=ProviderOperation.Delete,
                host=slot.host_id,
                message=f"{type(e).__name__}: {e}",
            ) from e
    return stopped


def _slots(state_dir: Path) -> list[_Slot]:
    slots: dict[_Slot, None] = {}
    for path in sorted(state_dir.glob("hosts/*/*")):
        for suffix in (_READY, _RECORD, _PID):
            if path.name.endswith(suffix):
                slots[_Slot(path.parent, path.name.removesuffix(suffix))] = None
                break
    return list(slots)


async def _stop_slot(slot: _Slot, *, grace_s: float, host_uid: str | None = None) -> bool:
    """Stop the slot's processes and remove its files; with ``host_uid``, only that incarnation.

    Returns whether a live process was stopped.
    """
    if host_uid is not None:
        record, ready = _read_record(slot.record), _read_ready(slot.ready)
        if host_uid not in {r.hostUid for r in (record, ready) if r is not None}:
            return False
    stopped = False
    for pid in sorted(slot.pids()):
        if slot.owns(pid):
            await _terminate(pid, grace_s=grace_s)
            stopped = True
    slot.remove()
    return stopped


async def _terminate(pid: int, *, grace_s: float) -> None:
    """SIGTERM (the host cleans up and exits), then SIGKILL to its process group after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if await _wait_gone(pid, timeout_s=grace_s):
        return
    log.warning("host ignored SIGTERM; killing it", extra={"pid": pid})
    _kill(pid)
    await _wait_gone(pid, timeout_s=_KILL_WAIT_S)


def _kill(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (start_new_session), and ``pid`` itself."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _alive(pid)  # reap it if it is our child and already gone


async def _wait_gone(pid: int, *, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while _alive(pid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (and one of our children is reaped here)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        # Reaped (now or before): whatever runs under this pid now is another process, which
        # /proc tells about. (Pids are reused: an old host's entry must not hide a new process.)
        del _CHILDREN[pid]
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": comm may contain spaces and parentheses, the state follows the last ")".
    state = stat.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"], [])


def _cmdline(pid: int) -> list[str] | None:
    if not _alive(pid):
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[i + 1]
    return None


def _read_record(path: Path) -> CreatedHost | None:
    try:
        return CreatedHost.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def _read_ready(path: Path) -> _ReadyFile | None:
    try:
        return _ReadyFile.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _log_tail(path: Path, offset: int) -> str:
    """The end of what the host wrote to its log since ``offset``: whole lines, at most 2 KiB."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(offset, size - _LOG_TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except OSError as e:
        return f"(unreadable: {e})"
    if start > offset and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    return data.decode(errors="replace").strip() or "(empty)"


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path))
