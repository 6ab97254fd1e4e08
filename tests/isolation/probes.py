"""What a hostile function tries, as code it runs (tests/isolation/conftest.py ATTACKER execs a
payload's code and returns what it leaves in `result`). The isolation suite runs these against a
host on this machine (hostile_test.py) and against a host in a chart's pod under each supported
setting (tests/kubernetes/pod_isolation_test.py), so both check one set of attempts.

Each builder returns the code; `result` is JSON: an outcome per target, a refusal named by its
exception (`PermissionError`) or its errno (`EROFS`)."""

from __future__ import annotations

# Who it runs as, what it holds, and whether it can become root again.
IDENTITY = """
import os
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    os.setuid(0)
    regained = True
except OSError:
    regained = False
result = {
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "caps": [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(), "regained": regained,
    "uid_map": open("/proc/self/uid_map").read().split(),
    "env": {k: os.environ.get(k) for k in ("HOME", "TMPDIR")}, "cwd": os.getcwd(), "pid": os.getpid(),
}
"""

# The processes it sees, each with the start of its command line ("" where it may not read it).
PROCESSES = """
import os
def cmdline(pid):
    try:
        with open("/proc/" + pid + "/cmdline", "rb") as f:
            return f.read(200).replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        return ""
result = {p: cmdline(p) for p in os.listdir("/proc") if p.isdigit()}
"""


def read(paths: list[str]) -> str:
    """Read each path: its first 4 KiB, or the exception's name."""
    return f"PATHS = {paths!r}\n" + (
        """
found = {}
for path in PATHS:
    try:
        with open(path, "rb") as f:
            found[path] = f.read(4096).decode(errors="replace")
    except OSError as exc:
        found[path] = type(exc).__name__
result = found
"""
    )


def listdir(path: str) -> str:
    """List a directory: its names, or the exception's name."""
    return f"import os\ntry:\n    result = os.listdir({path!r})\nexcept OSError as e:\n    result = type(e).__name__"


def write(paths: list[str]) -> str:
    """Create (or truncate) each path and write to it: "written", or the errno's name."""
    return f"PATHS = {paths!r}\n" + (
        """
import errno
found = {}
for path in PATHS:
    try:
        with open(path, "w") as f:
            f.write("left by a function")
        found[path] = "written"
    except OSError as exc:
        found[path] = errno.errorcode.get(exc.errno, str(exc.errno))
result = found
"""
    )


def remove(paths: list[str]) -> str:
    """Delete each path, and replace it by renaming a file of its own over it: for each, the two
    outcomes ("done", or the exception's name)."""
    return f"PATHS = {paths!r}\n" + (
        """
import os
def attempt(act):
    try:
        act()
    except OSError as e:
        return type(e).__name__
    return "done"
def replace(path):
    open(path + ".own", "w").close()
    os.rename(path + ".own", path)
result = {p: [attempt(lambda: os.unlink(p)), attempt(lambda: replace(p))] for p in PATHS}
"""
    )


def signal(pids: list[int]) -> str:
    """SIGKILL each pid, then PTRACE_ATTACH to it: for each, the two outcomes ("sent"/"attached",
    or the errno's name)."""
    return f"PIDS = {pids!r}\n" + (
        """
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
outcome = {}
for pid in PIDS:
    try:
        os.kill(pid, signal.SIGKILL)
        killed = "sent"
    except OSError as exc:
        killed = errno.errorcode.get(exc.errno, str(exc.errno))
    traced = "attached" if libc.ptrace(16, pid, 0, 0) == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    outcome[str(pid)] = [killed, traced]
result = outcome
"""
    )


def connect(addresses: list[tuple[str, int]]) -> str:
    """Open a TCP connection to each (host, port): "connected", or the exception's name; keyed
    "host:port"."""
    return f"ADDRESSES = {addresses!r}\n" + (
        """
import socket
outcome = {}
for host, port in ADDRESSES:
    try:
        socket.create_connection((host, port), timeout=2).close()
        outcome[f"{host}:{port}"] = "connected"
    except OSError as exc:
        outcome[f"{host}:{port}"] = type(exc).__name__
result = outcome
"""
    )


def shm(key: int, *, create: bool) -> str:
    """Make (IPC_CREAT, mode 0666) or look up a System V shared memory segment: its id, or -1;
    and the keys /proc/sysvipc/shm lists."""
    flags = "0o1000 | 0o666" if create else "0"
    return f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
shmid = libc.shmget({key}, 4096 if {create!r} else 0, {flags})
table = open("/proc/sysvipc/shm").read().splitlines()[1:]
result = [shmid, [int(line.split()[0]) for line in table if line.strip()]]
"""


def abstract_listen(name: str) -> str:
    """Listen on an abstract Unix socket (kept open past the invocation, in the function's warm
    process); then connect to it as its owner: "connected", or the exception's name."""
    return f"""
import socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\\0" + {name!r})
listener.listen()
sys.krt_kept = listener
""" + abstract_connect(name)


def abstract_connect(name: str) -> str:
    """Connect to an abstract Unix socket: "connected", or the exception's name."""
    return f"""
import socket
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\\0" + {name!r})
    result = "connected"
except OSError as exc:
    result = type(exc).__name__
"""


def move(paths: list[str]) -> str:
    """Rename each path aside (to path + ".moved"), and back at once if that worked: "moved", or
    the exception's name."""
    return f"PATHS = {paths!r}\n" + (
        """
import os
outcome = {}
for path in PATHS:
    try:
        os.rename(path, path + ".moved")
    except OSError as exc:
        outcome[path] = type(exc).__name__
    else:
        os.rename(path + ".moved", path)
        outcome[path] = "moved"
result = outcome
"""
    )
