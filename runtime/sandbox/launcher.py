"""A call launcher: the process that starts a per-call function's processes (bash, krm) inside
its sandbox, one call at a time, as a pod's wrapper server would.

The zygote makes it like any function process (runtime/zygote.py, kind "launcher"): its own PID
namespace (it is PID 2, under the namespace's privileged init), the function's mount namespace
and view, its cgroup, its limits, then its uid, no capabilities and no_new_privs. Then, instead
of the function, it runs `serve`: for each call it starts the entrypoint with posix_spawn (vfork
semantics: no page table copied, nothing to copy on write), in a session and process group of
its own, with the three descriptors it was sent as stdin, stdout and stderr; it waits for that
process and, before it reports the end, kills everything else in the namespace (`kill(-1)`:
every process the namespace holds but the launcher and the init, all of the function's uid),
waits until nothing is left, and removes what the call left in the private /tmp and /dev/shm.
Each call so starts in a namespace holding the launcher alone, with scratch directories as the
view made them, as a process started directly did; what the calls share is the function's
workspace, uid and cgroup.

A Python lane: where the entrypoint is `python SCRIPT ARGS...` with the zygote's own
interpreter and an environment that sets no PYTHON* variable (`forkable`), a call would spend
most of its time starting that interpreter (site and .pth files, for a script that takes far
less). There the zygote execs, in place of the launcher it would run, the
entrypoint's interpreter running this file (`python_lane`: `-E -s -c`, this file and
kruntimes.system.fdpass compiled where the zygote imported them), and each call is a fork of that
launcher that becomes the script as the interpreter would run it (`_script`: its own session,
the call's descriptors as fresh standard streams, the interpreter's signal dispositions and
`sys.modules` from before the launcher ran, `sys.argv`, `sys.path[0]`, a fresh `__main__`, the
interpreter's exit). The launcher is a fresh exec'd interpreter, not the zygote: nothing of the
platform's memory is in it, and it holds no call's data (a call's input and output go through
the descriptors it passes on, never through it); each call's process is a copy made before that
call started, so nothing an earlier call did in its own process is in it. What the forks share,
and a fresh start would not: the interpreter's hash secret and address layout, and `sys.flags`
showing -E -s (the user site directory is not on the path). The clean-up after a call is the
same in both kinds of lane.

It is not dumpable (a process of its uid cannot ptrace it or read its memory) and ignores every
signal that would end it, except those it cannot ignore: a call that kills it (SIGKILL) ends
the namespace and its own processes with it; one that stops it (SIGSTOP) never gets its end
reported and times out; one that changes what the next call would inherit from it (its limits
with prlimit, its priority, scheduling policy or CPUs: `_standing`) gets its end reported as
not clean. In each case the host discards the lane (runtime/lanes.py) and the next call starts
in a new one.

Protocol on the SOCK_SEQPACKET socket `ctl_fd`, one JSON object per message:
  request  {"op": "run"} with three descriptors (SCM_RIGHTS): the call's stdin, stdout, stderr
  started  {"op": "started", "pid": P, "forked": F}  (P in the lane's namespace; F: a Python
           lane's fork)
           or {"op": "failed", "error": "..."} when it did not start
  exited   {"op": "exited", "code": C, "clean": B, "cpu": U, "wall": W, "delay": D}  C as
           waitstatus_to_exitcode; B false when something of the call outlived the bound: the
           launcher exits after this message; U the CPU seconds the call's process used (with
           what it reaped), W the seconds from its start to its end, D the seconds it was
           ready to run and waited for a CPU (0 where the kernel does not say)
At end of file on the socket it exits. Standard library only (and kruntimes.system.fdpass, which is):
it runs in the forked zygote, or alone in the function's interpreter.
"""

from __future__ import annotations

import atexit
import binascii
import builtins
import contextlib
import ctypes
import errno
import importlib.machinery
import io
import marshal
import os
import resource
import signal
import sys
import time
from _socket import socket

from kruntimes.system import fdpass

# What a Python lane imports is on each of its starts' path: typing, json, shutil and the
# socket module's enums are left out of it (a third of what the launcher adds to the
# interpreter's own start, here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MESSAGE = 4096
FDS = 3
CLEAN_TIMEOUT_S = 2.0  # how long the leftovers of a call may take to disappear
SCRATCH = ("/tmp", "/dev/shm")  # in a mount namespace of its own: private tmpfs, emptied after each call
_CLEAN_POLL_S = 0.0005
_PR_SET_DUMPABLE = 4
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# what its own processes report to it, and faults (only ever sent: ignoring them is undefined)
_KEPT = {signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _undumpable() -> None:
    _dumpable(0)


_prctl: Any = None  # libc's prctl, found once: a CDLL makes a ctypes class, costly in each fork


def _dumpable(value: int) -> None:
    global _prctl
    if _prctl is None:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    if _prctl(_PR_SET_DUMPABLE, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl PR_SET_DUMPABLE: {os.strerror(code)}")


def _shield() -> dict[int, Any]:
    """Ignore every signal that could end or stop this process and that it may ignore; the
    dispositions they had, which a call must get back (what the function process of a direct
    start had)."""
    before = {}
    for sig in range(1, signal.NSIG):
        if sig in _UNCATCHABLE or sig in _KEPT:
            continue
        try:
            handler = signal.getsignal(sig)
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            continue  # not a signal this platform lets a process handle
        before[sig] = handler if handler is not None else signal.SIG_DFL
    return before


def _receive(sock: socket) -> list[int] | None:
    try:
        data, fds = fdpass.receive(sock, MAX_MESSAGE, FDS)
    except ValueError:
        return None  # the host does not speak this protocol: nothing to serve
    if not data:
        return None  # the host went away
    return fds  # the request says nothing more than "run"


def _clean() -> bool:
    """Kill every other process of the namespace (the init and this one are spared by the
    kernel) and wait until none is left; whether that happened within the bound."""
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True  # nothing to signal: nothing left (zombies the init has not reaped count)
        except PermissionError:
            return False  # something of another uid: never the function's; the lane must end
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(_CLEAN_POLL_S)


def _contents(scratch: tuple[str, ...]) -> dict[str, tuple[int, frozenset[str]]]:
    """What the view put in each scratch directory (the way to a path kept under it, a bind of
    a shared directory): its device and entries, which `_scrub` never touches."""
    found = {}
    for directory in scratch:
        with contextlib.suppress(OSError):  # none there, or not listable: not scrubbed
            found[directory] = (os.stat(directory).st_dev, frozenset(os.listdir(directory)))
    return found


def _scrub(contents: dict[str, tuple[int, frozenset[str]]]) -> bool:
    """Remove what a call left in the private /tmp and /dev/shm (entries the view did not put
    there, on the scratch tmpfs itself), so that each call finds them as a process started
    directly did; whether that worked (what cannot be removed ends the lane)."""
    for directory, (device, planted) in contents.items():
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name in planted:
                        continue
                    if entry.stat(follow_symlinks=False).st_dev != device:
                        return False  # not the call's: nothing it could have made
                    if entry.is_dir(follow_symlinks=False):
                        import shutil  # only then: it is on a Python lane's start's path

                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
        except OSError:
            return False
    return True


def _run(argv: list[str], env: dict[str, str], fds: list[int], restore: tuple[int, ...]) -> int | str:
    """Start one call's process; its pid, or why it did not start."""
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    try:
        return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=restore)
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror or exc}"
    finally:
        for fd in fds:
            os.close(fd)


# -- a Python lane: the launcher in the function's own interpreter, each call a fork of it ------

_PYTHON_ENV = "PYTHON"  # an environment that sets any PYTHON* variable: not a Python lane


def _compiled(path: str, name: str) -> Any:
    with open(path) as source:
        return compile(source.read(), name, "exec")


# What a Python lane runs, compiled where the zygote imports this (before any view hides the
# files; the lane's interpreter is the zygote's, `forkable`): a Python lane has no file of its own
_LANE_CODE = (
    binascii.b2a_base64(
        marshal.dumps(
            {
                "kruntimes.system.fdpass": _compiled(fdpass.__file__, "kruntimes/system/fdpass.py"),
                "launcher": _compiled(__file__, "runtime/sandbox/launcher.py"),
            }
        ),
        newline=False,
    ).decode()
    if "__file__" in globals()
    else ""
)


def forkable(argv: list[str], env: dict[str, str]) -> bool:
    """Whether the entrypoint is `python SCRIPT ARGS...` with the zygote's own interpreter
    (this version of this file runs in it) and an environment the interpreter does not read:
    its calls can then be forks of an interpreter started once (`python_lane`)."""
    return (
        len(argv) >= 2
        and not argv[1].startswith("-")
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
        and not any(name.startswith(_PYTHON_ENV) for name in env)
    )


def python_lane(argv: list[str]) -> list[str]:
    """The command line that runs this launcher in the entrypoint's interpreter (`-E -s`: no
    environment variable and no user site directory reach its start; `-c`'s "" is taken off
    its path before it imports anything), serving calls on descriptor 3 as forks of itself."""
    boot = (
        "import sys\n"
        "del sys.path[0]\n"
        "_loaded = frozenset(sys.modules)\n"
        "import binascii, marshal, os, types\n"
        f"_code = marshal.loads(binascii.a2b_base64({_LANE_CODE!r}))\n"
        "_package = sys.modules['kruntimes'] = types.ModuleType('kruntimes')\n"
        "_package.__path__ = []\n"
        "_fdpass = sys.modules['kruntimes.system.fdpass'] = types.ModuleType('kruntimes.system.fdpass')\n"
        "_package.fdpass = _fdpass\n"
        "exec(_code['kruntimes.system.fdpass'], _fdpass.__dict__)\n"
        "_launcher = {'__name__': 'kruntimes_launcher'}\n"
        "exec(_code['launcher'], _launcher)\n"
        "sys.exit(_launcher['serve'](ctl_fd=3, argv=sys.argv[1:], env=dict(os.environ),"
        " scratch=_launcher['SCRATCH'], loaded=_loaded))\n"
    )
    return [argv[0], "-E", "-s", "-c", boot, *argv]


def _fork(argv: list[str], fds: list[int], dispositions: dict[int, Any], extra: frozenset[str]) -> int:
    """Fork the call's process, which runs the script as `python SCRIPT ARGS...` would; its pid."""
    try:
        pid = os.fork()
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    if pid == 0:
        _script(argv, fds, dispositions, extra)
    for fd in fds:
        os.close(fd)
    return pid


def _script(argv: list[str], fds: list[int], dispositions: dict[int, Any], extra: frozenset[str]) -> None:
    """In the forked call's process: become `python SCRIPT ARGS...` — its own session, the
    call's stdin, stdout and stderr as fresh standard streams made as the interpreter made
    its own, the dispositions and `sys.modules` the interpreter had before the launcher ran,
    `sys.argv`, `sys.path[0]`, a fresh `__main__`; at the end the interpreter's exit (threads
    waited for, atexit functions, streams flushed: 120 if stdout cannot be). Never returns."""
    status = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target, inheritable=True)
        os.closerange(FDS, os.sysconf("SC_OPEN_MAX"))  # the host's socket among them
        for sig, handler in dispositions.items():
            signal.signal(sig, handler)
        _dumpable(1)  # as a process the interpreter's exec made
        old = (sys.stdin, sys.stdout, sys.stderr)
        for name in extra:  # the launcher's modules: the script imports its own
            sys.modules.pop(name, None)
        for name, fd, stream in (("stdin", 0, old[0]), ("stdout", 1, old[1]), ("stderr", 2, old[2])):
            fresh = _stdio(fd, stream, write=fd != 0)
            setattr(sys, name, fresh)
            setattr(sys, f"__{name}__", fresh)
        script = os.path.abspath(argv[1])  # as the interpreter names its `__main__`'s file
        sys.argv = argv[1:]
        sys.orig_argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
        namespace = sys.modules["__main__"].__dict__
        namespace.clear()
        namespace.update(
            __name__="__main__",
            __doc__=None,
            __package__=None,
            __loader__=importlib.machinery.SourceFileLoader("__main__", script),
            __spec__=None,
            __annotations__={},
            __builtins__=builtins,
            __file__=script,
            __cached__=None,
        )
        try:
            with open(script, "rb") as source:
                code = compile(source.read(), script, "exec")
        except OSError as exc:  # as the interpreter says it
            sys.stderr.write(f"{argv[0]}: can't open file {script!r}: [Errno {exc.errno}] {exc.strerror}\n")
            sys.stderr.flush()
            os._exit(2)
        except SyntaxError as exc:
            sys.excepthook(type(exc), exc, None)
            sys.stderr.flush()
            os._exit(1)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"kruntimes: function process failed to start: {exc!r}\n".encode())
        os._exit(127)
    try:
        outcome: BaseException | None = None
        try:
            exec(code, namespace)
        except BaseException as exc:
            outcome = exc
        if isinstance(outcome, KeyboardInterrupt):  # as the interpreter: killed by SIGINT itself
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        status = _exit_status(outcome)
        outcome = None
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
        if not _flush() and status == 0:
            status = 120
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        os._exit(status)


def _stdio(fd: int, old: Any, *, write: bool) -> Any:
    """A standard stream on `fd` as the interpreter made `old` (encoding, errors, buffering)."""
    binary = open(fd, "wb" if write else "rb", closefd=False)  # noqa: SIM115 - the stream itself
    return io.TextIOWrapper(
        binary,
        encoding=old.encoding,
        errors=old.errors,
        newline="\n",
        line_buffering=old.line_buffering,
        write_through=old.write_through,
    )


def _exit_status(exc: BaseException | None) -> int:
    """What the interpreter exits with after its script ended with `exc` (None: normally)."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        with contextlib.suppress(Exception):
            sys.stderr.write(f"{code}\n")
        return 1
    tb = exc.__traceback__
    if tb is not None:
        exc.__traceback__ = tb.tb_next  # from the script's frame on, not the launcher's
    sys.excepthook(type(exc), exc, exc.__traceback__)
    return 1


def _flush() -> bool:
    """Flush stdout and stderr as the interpreter does at its exit; whether stdout could be."""
    ok = True
    for stream, is_stdout in ((sys.stdout, True), (sys.stderr, False)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            ok = ok and not is_stdout
    return ok


def _wait(pid: int) -> tuple[int, float, float]:
    """The call's exit code, the CPU seconds its process used (with what it reaped) and the
    seconds it waited for a CPU (read from its /proc entry while it is a zombie: the run delay
    of its schedstat)."""
    delay = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with open(f"/proc/{pid}/schedstat", "rb") as stat:
            delay = int(stat.read().split()[1]) / 1e9
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
        except InterruptedError:
            continue
        return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, delay


def _standing() -> tuple[Any, ...]:
    """What a process of the same uid can change of this one that a call's process inherits:
    its limits (prlimit), priority, scheduling policy and CPUs."""
    rlimits = tuple(
        resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")
    )
    return rlimits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getaffinity(0)


def serve(
    *,
    ctl_fd: int,
    argv: list[str],
    env: dict[str, str],
    scratch: tuple[str, ...],
    loaded: frozenset[str] | None = None,
) -> int:
    """The launcher's loop (never returns before end of file on `ctl_fd`); its exit code.
    `scratch`: the directories to empty after each call (SCRATCH in a mount namespace of its
    own, never the host's). `loaded`: run as a Python lane (`python_lane`), the modules the
    interpreter had loaded before the launcher: each call is then a fork of this process."""
    os.set_inheritable(ctl_fd, False)
    _undumpable()
    dispositions = _shield()
    restore = tuple(sig for sig, handler in dispositions.items() if handler != signal.SIG_IGN)
    sock = socket(fileno=ctl_fd)
    if not _clean():  # what the start left (nothing; the namespace is new): the same rule
        return 1
    contents = _contents(scratch)
    standing = _standing()
    while True:
        try:
            message = _receive(sock)
        except (OSError, ValueError):
            return 1
        if message is None:
            return 0
        fds = message
        # nothing of the last call is left in this frame for a fork's
        pid = code = clean = cpu = wall = delay = None
        began = time.monotonic()
        if loaded is None:
            pid = _run(argv, env, fds, restore)
        else:
            pid = _fork(argv, fds, dispositions, frozenset(sys.modules) - loaded)
        try:
            if isinstance(pid, str):
                import json  # only then: it is on a Python lane's start's path

                sock.send(json.dumps({"op": "failed", "error": pid}).encode())
                continue
            forked = "false" if loaded is None else "true"
            sock.send(f'{{"op": "started", "pid": {pid}, "forked": {forked}}}'.encode())
            code, cpu, delay = _wait(pid)
            wall = time.monotonic() - began
            # a call that changed what the next would inherit from this process ends the lane
            clean = _clean() and _scrub(contents) and _standing() == standing
            sock.send(
                f'{{"op": "exited", "code": {code}, "clean": {"true" if clean else "false"}, '
                f'"cpu": {cpu:.6f}, "wall": {wall:.6f}, "delay": {delay:.6f}}}'.encode()
            )
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
            return 0  # the host went away mid-call: the namespace ends with this process
        if not clean:
            return 1
