"""The server's ends of a function process's pipes: made, read, and pumped by a blocking poll.

`Pump` is the blocking side (loading a warm process, a one-shot run): it writes a payload to
stdin or the control socket, reads frames from the control socket and drains stdout/stderr
into captures, one `poll` at a time.
"""

from __future__ import annotations

import os
import select
import socket

from kruntimes.runtime.capture import Capture
from kruntimes.runtime.framing import pop_frame

READ_CHUNK = 65536
POLL_TICK_S = 0.1  # how often a blocking wait re-checks that its process is still alive


def child_pipes() -> tuple[int, int, int, int]:
    """(stdout read, stdout write, stderr read, stderr write); the server's read ends do not block."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    # the child's ends must block: user code expects ordinary blocking stdout/stderr
    os.set_blocking(out_w, True)
    os.set_blocking(err_w, True)
    return out_r, out_w, err_r, err_w


def read_chunk(fd: int) -> bytes | None:
    """One read of an output pipe: None when nothing is there yet, b"" when it is closed (or broken)."""
    try:
        return os.read(fd, READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class Pump:
    """Moves bytes between the server and one process: a payload out, a frame and output in."""

    def __init__(self, *, out_fd: int, err_fd: int, stdout: Capture, stderr: Capture) -> None:
        self.readers: dict[int, Capture] = {out_fd: stdout, err_fd: stderr}
        self.open_readers = set(self.readers)
        self.poller = select.poll()
        for fd in self.readers:
            self.poller.register(fd, select.POLLIN)
        self.writer: int | None = None
        self.pending = memoryview(b"")
        self.ctl: int | None = None
        self.frame = bytearray()
        self.ctl_eof = False

    def want_frame(self, ctl: socket.socket) -> None:
        self.ctl = ctl.fileno()
        self.poller.register(self.ctl, select.POLLIN)

    def watch(self, fd: int) -> None:
        """Let `fd` becoming readable end a `step` too (the caller reads it)."""
        self.poller.register(fd, select.POLLIN)

    def unwatch(self, fd: int) -> None:
        self.poller.unregister(fd)

    def want_write(self, fd: int, data: bytes) -> None:
        self.writer, self.pending = fd, memoryview(data)
        self.poller.register(fd, select.POLLOUT | (select.POLLIN if fd == self.ctl else 0))

    @property
    def waiting(self) -> bool:
        """True while some descriptor can still wake a poll."""
        return (
            bool(self.open_readers) or self.writer is not None or (self.ctl is not None and not self.ctl_eof)
        )

    def next_frame(self) -> tuple[int, bytes] | None:
        return pop_frame(self.frame)

    def step(self, timeout_s: float) -> None:
        for fd, events in self.poller.poll(max(timeout_s, 0.0) * 1000):
            if fd == self.writer and events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                self._write(events)
            if (
                fd == self.ctl
                and not self.ctl_eof
                and events & (select.POLLIN | select.POLLERR | select.POLLHUP)
            ):
                self._read_ctl()
            elif fd in self.open_readers:
                self._read(fd)

    def _write(self, events: int) -> None:
        assert self.writer is not None
        if self.pending and events & select.POLLOUT:
            try:
                self.pending = self.pending[os.write(self.writer, self.pending[:READ_CHUNK]) :]
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the process closed its end or died
                self.pending = memoryview(b"")
        elif not events & select.POLLOUT:
            self.pending = memoryview(b"")
        if self.pending:
            return
        fd, self.writer = self.writer, None
        if fd == self.ctl:
            if not self.ctl_eof:
                self.poller.modify(fd, select.POLLIN)
        else:
            self.poller.unregister(fd)
            os.close(fd)  # stdin of a one-shot process: EOF after the payload

    def _read_ctl(self) -> None:
        assert self.ctl is not None
        chunk = read_chunk(self.ctl)
        if chunk is None:
            return
        if chunk:
            self.frame += chunk
        else:
            self.ctl_eof = True
            self.poller.unregister(self.ctl)
            if self.writer == self.ctl:
                self.writer = None

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        if chunk:
            self.readers[fd].feed(chunk)
        else:
            self.open_readers.discard(fd)
            self.poller.unregister(fd)

    def drain(self) -> None:
        """Read whatever the output pipes hold now, without waiting."""
        for fd in list(self.open_readers):
            while fd in self.open_readers:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    break
                if not chunk:
                    self.open_readers.discard(fd)
                    self.poller.unregister(fd)
                else:
                    self.readers[fd].feed(chunk)
