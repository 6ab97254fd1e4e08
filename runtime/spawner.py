"""The server's side of the zygote: spawn function processes, kill them, learn how they ended."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.zygote import MAX_MESSAGE

log = logging.getLogger(__name__)

SPAWN_TIMEOUT_S = 10.0
EXIT_GRACE_S = 2.0  # how long to wait for the zygote's exit report after a kill or EOF


class SpawnError(Exception):
    """The zygote could not start a function process."""


@dataclass(frozen=True, slots=True)
class SpawnSpec:
    kind: str  # "python" (warm), "python-once", "exec" or "launcher" (runtime/lanes.py)
    cwd: str
    env: dict[str, str]
    limits: ProcessLimits
    handler: str = ""
    argv: tuple[str, ...] = ()
    context: dict[str, str] = field(default_factory=dict)
    sandbox: SandboxSpec | None = None  # None: no isolation beyond the rlimits

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cwd": self.cwd,
            "env": self.env,
            "limits": self.limits.to_dict(),
            "handler": self.handler,
            "argv": list(self.argv),
            "context": self.context,
            "sandbox": self.sandbox.to_json() if self.sandbox is not None else None,
        }


class Exit:
    """How one child ended; `wait` blocks until the zygote reports it, `on_exit` calls back then."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.code: int | None = None

    def set(self, code: int) -> None:
        with self._lock:
            self.code = code
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("exit callback failed")

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in the zygote reader thread, or here if already exited) once it ended."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def wait(self, timeout: float | None) -> int | None:
        self._event.wait(timeout)
        return self.code

    @property
    def done(self) -> bool:
        return self._event.is_set()


class Spawner:
    """Owns one zygote process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future[tuple[int, Exit]]] = {}
        self._exits: dict[int, Exit] = {}
        self._next_id = 0
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._ready = threading.Event()
        # What the zygote found it can make for a sandboxed child (its "ready" message says).
        self.namespaces = False
        self.network_namespaces = False

    def start(self) -> None:
        """Start the zygote and wait until it has imported the adapters (so the first spawn is fast)."""
        with self._lock:
            self._start_locked()
        if not self._ready.wait(SPAWN_TIMEOUT_S):
            raise SpawnError("the zygote did not start")

    def _start_locked(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kruntimes.runtime.zygote", "--fd", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        self._sock = ours
        threading.Thread(target=self._read_loop, args=(ours,), name="zygote-reader", daemon=True).start()

    @property
    def zygote_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def spawn(self, spec: SpawnSpec, fds: list[int]) -> tuple[int, Exit]:
        """Start a process with `fds` as its 0, 1, 2 (and 3); returns its pid and exit handle."""
        with self._lock:
            if self._closed:
                raise SpawnError("the runtime host is shutting down")
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    log.error("zygote exited (code %s); starting a new one", self._proc.returncode)
                self._start_locked()
            self._next_id += 1
            ident = self._next_id
            future: Future[tuple[int, Exit]] = Future()
            self._pending[ident] = future
            sock = self._sock
        assert sock is not None
        message = json.dumps({"op": "spawn", "id": ident, "spec": spec.to_json()}).encode()
        if len(message) > MAX_MESSAGE:
            raise SpawnError("spawn request too large (environment too big)")
        try:
            with self._send_lock:
                socket.send_fds(sock, [message], fds)
            return future.result(timeout=SPAWN_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise SpawnError(f"zygote did not answer: {exc}") from exc
        finally:
            with self._lock:
                self._pending.pop(ident, None)

    def configure_seeds(self, base: SandboxSpec, *, count: int) -> None:
        """Keep `count` children planted with `base` waiting in the zygote, so a sandboxed spawn
        costs no fork and no namespace setup of its own (runtime/sandbox/child.py)."""
        self._control({"op": "seeds", "base": base.to_json(), "count": count})

    def plant(self, base: SandboxSpec) -> None:
        """Ask the zygote for one seed planted with `base` (in one function's cgroup), planted
        when it has nothing else to do; a spawn of that cgroup then finds it waiting."""
        self._control({"op": "plant", "base": base.to_json()})

    def retire(self, cgroup_procs: tuple[str, ...]) -> None:
        """No seed waits in this cgroup any longer (`plant`): its function starts a process per
        call, so a planted one would wait, for as long as it is registered, for that one call."""
        if cgroup_procs:
            self._control({"op": "retire", "cgroup": list(cgroup_procs)})

    def _control(self, message: dict[str, object]) -> None:
        """One message about seeds to the zygote (none once it is gone)."""
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            sock.send(json.dumps(message).encode())

    def kill(self, pid: int) -> None:
        """Kill the process group of a child (no-op once it has been reaped)."""
        sock = self._sock
        if sock is None:
            return
        try:
            with self._send_lock:
                sock.send(json.dumps({"op": "kill", "pid": pid}).encode())
        except OSError:
            log.warning("could not reach the zygote to kill pid %d", pid)

    def _read_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            op = msg["op"]
            if op == "ready":
                self.namespaces = bool(msg.get("namespaces"))
                self.network_namespaces = bool(msg.get("networkNamespaces"))
                self._ready.set()
                continue
            with self._lock:
                if op == "spawned":
                    pending = self._pending.get(msg["id"])
                    # the exit handle exists before "exited" can arrive for this pid
                    handle = self._exits.setdefault(msg["pid"], Exit())
                    if pending is not None and not pending.done():
                        pending.set_result((msg["pid"], handle))
                    else:  # the spawn call gave up waiting: nobody owns this process
                        threading.Thread(target=self.kill, args=(msg["pid"],), daemon=True).start()
                elif op == "spawn_failed":
                    pending = self._pending.get(msg["id"])
                    if pending is not None:
                        pending.set_exception(SpawnError(msg["error"]))
                elif op == "exited":
                    exited = self._exits.pop(msg["pid"], None)
                    if exited is not None:
                        exited.set(msg["code"])
        # The zygote is gone: its children died with it (parent-death signal).
        with self._lock:
            for pending in self._pending.values():
                if not pending.done():
                    pending.set_exception(SpawnError("zygote exited"))
            if sock is self._sock:
                for handle in self._exits.values():
                    handle.set(-9)
                self._exits.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, sock = self._proc, self._sock
        if sock is not None:
            # shutdown, not just close: the reader thread's blocked recv keeps a closed socket open
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()  # the zygote exits on EOF; its children get SIGKILL by parent death
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY)
