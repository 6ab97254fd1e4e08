"""`python -m kruntimes.workers.embedded.hidden_temporal`: the embedded platform's Temporal dev
server, where no other local user and no function reaches it (the `temporal` component of `krt up`).

The dev server has no TLS or authentication of its own. So, first, while it is one thread, this
process moves into a network namespace of its own — as root a new one (CLONE_NEWNET), otherwise a
new user namespace mapping this user to itself, with its own network namespace (`unshare -rn`'s
way, where the kernel lets unprivileged users make them) — and brings its loopback up. Then it
starts the dev server on that loopback and serves the frontend, the UI and the metrics on Unix
sockets in the state directory (sockets/frontend.sock, ui.sock, metrics.sock; 0600 in a 0700
directory): the front (kruntimes.workers.temporal_front) and the owner's tools open them. Where no
namespace can be made, the dev server listens on the machine's 127.0.0.1, and the ready file says
so (mode "exposed", with why): `krt up` says it at start.

It ends when told (SIGTERM, SIGINT: the dev server is stopped first), or with code 1 when the dev
server exits (the supervisor starts it again); the dev server dies with it (PR_SET_PDEATHSIG), so
no second one ever starts on the same database while the first still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path

from kruntimes.runtime.sandbox import syscalls
from kruntimes.system.serving import stop_event, write_ready_file
from kruntimes.temporal.devserver import DevServer, DevServerError
from kruntimes.temporal.front import Bounds, Forwarder, tcp_upstream, unix_listener

NETNS, USERNS, EXPOSED = "netns", "userns", "exposed"
SOCKETS = {"frontend": "frontend.sock", "ui": "ui.sock", "metrics": "metrics.sock"}
WATCH_S = 0.2  # how often the dev server is looked at


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kruntimes.workers.embedded.hidden_temporal")
    p.add_argument("--database-dir", type=Path, required=True, help="where temporal.db is")
    p.add_argument("--sockets", type=Path, required=True, help="the directory of the Unix sockets")
    p.add_argument("--log-file", type=Path, required=True, help="the dev server's log")
    p.add_argument("--ui-codec-endpoint", help="the codec endpoint the UI decodes with")
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument(
        "--avoid-port",
        type=int,
        action="append",
        default=[],
        help="a port the dev server must not take (the front's: the same loopback when exposed)",
    )
    return p.parse_args(argv)


def isolate() -> tuple[str, str]:
    """Move this process into a network namespace of its own with its loopback up: (mode, why
    none could be made, when EXPOSED). Call it while the process is one thread."""
    failed = []
    if os.geteuid() == 0:
        try:
            syscalls.unshare(syscalls.CLONE_NEWNET)
            syscalls.loopback_up()
            return NETNS, ""
        except OSError as e:
            failed.append(f"a network namespace: {e.strerror}")
    # tried in a child first: a user namespace entered whose map then fails leaves no way back
    why = _in_child(_own_user_namespace)
    if why is None:
        _own_user_namespace()
        return USERNS, ""
    failed.append(f"a user namespace with one: {why}")
    return EXPOSED, "; ".join(failed)


def _own_user_namespace() -> None:
    """A new user namespace mapping this user and group to themselves, its own network namespace
    with it, and that namespace's loopback up."""
    uid, gid = os.geteuid(), os.getegid()
    syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNET)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    syscalls.loopback_up()


def _in_child(attempt: Callable[[], None]) -> str | None:
    """Run `attempt` in a forked child: None when it succeeded, else what failed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into the caller's code
        os.close(read)
        try:
            attempt()
            os._exit(0)
        except OSError as e:
            os.write(write, (e.strerror or type(e).__name__).encode()[:200])
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read(256).decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else (said or "refused")


def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:
        syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return preexec


class _Avoiding(DevServer):
    """A dev server whose picked ports are never the front's: they are on the same loopback when
    no namespace could be made, and the front may not have bound them yet."""

    avoid: frozenset[int] = frozenset()

    def pick_port(self) -> tuple[int, socket.socket]:
        while True:
            port, held = super().pick_port()
            if port not in self.avoid:
                return port, held
            held.close()


async def _exited(server: DevServer) -> None:
    while server.process is not None and server.process.poll() is None:
        await asyncio.sleep(WATCH_S)


async def serve(server: DevServer, args: argparse.Namespace, *, mode: str, why: str) -> int:
    """Forward the sockets to the dev server until told to stop (0) or it exits (1)."""
    ports = {"frontend": server.port, "ui": server.ui_port, "metrics": server.metrics_port}
    forwarders = []
    for name, port in ports.items():
        sock = unix_listener(args.sockets / SOCKETS[name])
        forwarders.append(Forwarder(sock, tcp_upstream("127.0.0.1", port), bounds=Bounds(), name=name))
    for forwarder in forwarders:
        await forwarder.start()
    assert server.process is not None
    write_ready_file(
        args.ready_file,
        mode=mode,
        why=why,
        devServerPid=server.process.pid,
        ports=ports,  # on the loopback of its namespace (of the machine's, when exposed)
        sockets={name: str(args.sockets / file) for name, file in SOCKETS.items()},
    )
    stopping = asyncio.ensure_future(stop_event().wait())
    exited = asyncio.ensure_future(_exited(server))
    try:
        await asyncio.wait({stopping, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        exited.cancel()
        for forwarder in forwarders:
            await forwarder.close()
    if exited.done() and not exited.cancelled():
        print(f"the dev server exited with code {server.process.returncode}", file=sys.stderr, flush=True)
        return 1
    return 0


def _run(main: Coroutine[object, object, int]) -> int:
    """On uvloop when installed: each forwarded byte costs less CPU on it than on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode, why = isolate()  # first: unshare needs one thread
    os.umask(0o077)
    if mode == EXPOSED:
        print(f"the dev server is exposed on 127.0.0.1: no network namespace ({why})", file=sys.stderr)
    server = _Avoiding(
        state_dir=args.database_dir,
        headless=False,
        persistent=True,
        log_file=args.log_file,
        ui_codec_endpoint=args.ui_codec_endpoint,
        preexec=_die_with_parent(os.getpid()),
    )
    server.avoid = frozenset(args.avoid_port)
    try:
        server.start()
        return _run(serve(server, args, mode=mode, why=why))
    except DevServerError as e:
        print(f"the dev server did not start: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        server.stop()
        for file in SOCKETS.values():
            with contextlib.suppress(OSError):
                (args.sockets / file).unlink()


if __name__ == "__main__":
    sys.exit(main())
