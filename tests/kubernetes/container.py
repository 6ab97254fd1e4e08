"""The test kubelet's container runtime: one container's process, started as a node starts it.

    python -I -S tests/kubernetes/container.py SPEC.json
    python -I -S tests/kubernetes/container.py --pod-sandbox [--users]

(standard library only, so it starts fast without site packages). SPEC is a JSON object:

    argv, env, cwd      the process (argv[0] looked up in env's PATH), inside the container
    scratch             an empty directory of the pod on the node: the container's root is built there
    reachable           directories every user must reach in the container, as in an image (the
                        node's interpreter may live under a home directory others cannot enter):
                        their ancestors get the others' x bit in the container's root
    mounts              [{source, target, readOnly}]: the pod's volume directories on the node,
                        bound at their mountPath (innermost last)
    hostname            the pod's name (its own UTS namespace)
    pidFile             where the process's pid (as the node sees it) is written
    securityContext     the container's, merged over the pod's (runAsUser, runAsGroup, ...);
                        null: the pod asked for nothing, and runs with the kubelet's privileges
    sandbox             the pod's sandbox (`--pod-sandbox`): {pid, users}; the container joins its
                        network namespace, and its user namespace for a pod of `hostUsers: false`

`--pod-sandbox` is a pod's sandbox, as a node's pause container: with `--users` it makes a user
namespace (says `user`, then waits for a line on stdin while the kubelet writes its uid and gid
maps: a range of the node's ids, root included, no other pod has), then a network namespace (the
user namespace's) with its loopback up (says `net`: the kubelet gives it an address), and holds
them until it is killed. A container joining a user namespace runs as the pod's root, an
unprivileged node uid whose capabilities hold only over the pod's namespaces, as PID 1 of PID and
mount namespaces that namespace owns; its volumes are idmapped mounts (what the node's root owns
there, the pod's root owns), as a kubelet mounts them for such a pod.

The process runs in namespaces of its own (PID, mount, IPC, UTS, and the pod's network namespace
given a sandbox; without one the node's, where every pod shares 127.0.0.1, see cluster.py) as PID 1, with a root of its own: the node's file system
through an overlay (what a container writes outside its volumes lands in the overlay and ends with
it), a private /proc, /dev/shm and the volumes at their mount paths. With a security context, as a
node does: a read-only root (`readOnlyRootFilesystem`: every mount read-only but the writable
volumes, /proc, /dev and /dev/shm), /sys read-only, the runtime's default capabilities less
`capabilities.drop` (ALL: every one) plus `capabilities.add` (the bounding set: a root process
gets exactly these), `no_new_privs` when `allowPrivilegeEscalation` is false, then the uid and gid
(`runAsUser`, `runAsGroup`, `supplementalGroups`; a non-root uid keeps no capability). Not
applied: seccomp profiles, AppArmor, SELinux, fsGroup.

This process stays outside as the container's parent: it passes on SIGTERM, SIGINT, SIGHUP and
SIGQUIT, and ends as the container's process ended (the same exit code, or killed by the same
signal). When it is killed, the kernel kills the container's process (PDEATHSIG), and with PID 1
every process of the container.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import signal
import socket
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x4000000, 0x8000000, 0x20000000
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_IDMAP = 0x1, 0x100000
AT_RECURSIVE, AT_FDCWD, AT_EMPTY_PATH = 0x8000, -100, 0x1000
OPEN_TREE_CLONE, MOVE_MOUNT_F_EMPTY_PATH = 0x1, 0x4
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# the unified syscall table: the same numbers on every architecture
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_CAPGET, SYS_CAPSET = {"x86_64": (125, 126), "aarch64": (90, 91)}.get(platform.machine(), (125, 126))

CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]
# What containerd and CRI-O give a container that names no capabilities.
RUNTIME_DEFAULT = frozenset(
    [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ]
)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _syscall(number: int, *args: object) -> int:
    _libc.syscall.restype = ctypes.c_long
    return int(_libc.syscall(ctypes.c_long(number), *args))


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    result = _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _check(result, f"mount {source} on {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def idmapped_bind(source: str, target: str, userns: int) -> None:
    """Bind `source` at `target` seen through the user namespace `userns`: the node's uid u
    there is the namespace's uid u (what the node's root owns, the pod's root owns)."""
    flags = ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE)
    tree = _check(_syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), os.fsencode(source), flags), "open_tree")
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
        empty = ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE)
        result = _syscall(
            SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"", empty, ctypes.byref(attr), ctypes.c_size_t(32)
        )
        _check(result, f"idmap {source}")
        result = _syscall(
            SYS_MOVE_MOUNT,
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(AT_FDCWD),
            os.fsencode(target),
            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        )
        _check(result, f"move_mount {source} to {target}")
    finally:
        os.close(tree)


def mount_setattr(path: str, *, add: int = 0, clear: int = 0, recursive: bool = False) -> None:
    attr = _MountAttr(add, clear, 0, 0)
    flags = ctypes.c_uint(AT_RECURSIVE if recursive else 0)
    result = _syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(AT_FDCWD),
        os.fsencode(path),
        flags,
        ctypes.byref(attr),
        ctypes.c_size_t(32),
    )
    _check(result, f"mount_setattr {path}")


def prctl(option: int, arg2: int = 0) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), 0, 0, 0), f"prctl {option}")


def pivot_root(new_root: str) -> None:
    """Make `new_root` this mount namespace's root and detach the old one."""
    os.chdir(new_root)
    _check(_syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount the old root")
    os.chdir("/")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def keep_capabilities(names: set[str]) -> None:
    """Only `names` in the bounding set (what a root process execs with), none inheritable or
    ambient."""
    unknown = names - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities: {sorted(unknown)}")
    for number, name in enumerate(CAPABILITIES):
        if name not in names:
            try:
                prctl(PR_CAPBSET_DROP, number)
            except OSError as e:
                if e.errno != errno.EINVAL:  # a capability this kernel does not have
                    raise
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_syscall(SYS_CAPGET, ctypes.byref(header), data), "capget")
    for word in data:
        word.inheritable = 0
    _check(_syscall(SYS_CAPSET, ctypes.byref(header), data), "capset")


def capabilities_of(security: dict) -> set[str]:
    """The container's capabilities: the runtime's defaults, less drop (ALL: all), plus add."""
    asked = security.get("capabilities") or {}
    drop = set(asked.get("drop") or [])
    kept = set() if "ALL" in drop else set(RUNTIME_DEFAULT) - drop
    return kept | set(asked.get("add") or [])


def _ensure(path: str, like: str) -> None:
    """A mount point at `path` for what is at `like`: a directory, or an empty file."""
    if os.path.isdir(like) or not os.path.exists(like):
        os.makedirs(path, exist_ok=True)
    elif not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()


def _top_mounts(scratch: str) -> list[str]:
    """The node's mount points but the root and those inside others (those come along with a
    recursive bind of theirs), the pod's scratch excluded."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point != "/" and not (point + "/").startswith(scratch.rstrip("/") + "/"):
                points.append(point)
    return [p for p in points if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in points)]


def _on_node(root: str, volumes: list[dict], path: str) -> str:
    """Where `path` of the container is on the node: in the innermost volume holding it, its
    source (a mount point is made there, not through the mount: through an idmapped one the
    node's root, whom the pod's user namespace does not map, may create nothing), else in the
    root."""
    holders = [v for v in volumes if (path + "/").startswith(v["target"].rstrip("/") + "/")]
    if not holders:
        return root + path
    inner = max(holders, key=lambda v: len(v["target"].rstrip("/")))
    return inner["source"] + path[len(inner["target"].rstrip("/")) :]


def _show_the_image(root: str, reachable: list[str], volumes: list[dict]) -> None:
    """The program's own paths (the interpreter, the checkout) stay visible, read-only, where a
    volume would hide them (a checkout under /tmp, where pods mount an emptyDir), as an image's
    files would be: a real node never hides the image's program behind a volume."""
    shown: list[str] = []
    targets = [v["target"] for v in volumes]
    for path in sorted(reachable, key=len):
        hidden = any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets)
        if not hidden or any(path.startswith(p.rstrip("/") + "/") for p in shown):
            continue
        os.makedirs(_on_node(root, volumes, path), exist_ok=True)
        mount(path, root + path, None, MS_BIND | MS_REC)
        mount_setattr(root + path, add=MOUNT_ATTR_RDONLY, recursive=True)
        shown.append(path)


def build_root(spec: dict, userns: int | None = None) -> str:
    """The container's root under the pod's scratch directory; returns its path (not yet entered).
    `userns`: the pod's user namespace, through which its volumes are seen."""
    security = spec.get("securityContext")
    scratch = spec["scratch"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=0755")
    for name in ("upper", "work", "root"):
        os.mkdir(os.path.join(scratch, name))
    root = os.path.join(scratch, "root")
    layers = f"lowerdir=/,upperdir={scratch}/upper,workdir={scratch}/work"
    mount("overlay", root, "overlay", 0, layers)
    for path in spec.get("reachable") or []:  # copied up into the overlay: the node's stay as they are
        while path not in ("/", ""):
            path = os.path.dirname(path)
            mode = os.stat(root + path).st_mode
            if not mode & 0o001:
                os.chmod(root + path, (mode & 0o7777) | 0o001)
    for point in _top_mounts(scratch):
        if point == "/proc":
            continue
        target = root + point
        _ensure(target, point)
        mount(point, target, None, MS_BIND | MS_REC)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/dev/shm", exist_ok=True)
    mount("shm", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    volumes = sorted(spec["mounts"], key=lambda m: len(m["target"].rstrip("/")))
    for i, volume in enumerate(volumes):
        target = root + volume["target"]
        _ensure(_on_node(root, volumes[:i], volume["target"]), volume["source"])
        if userns is None:
            mount(volume["source"], target, None, MS_BIND | MS_REC)
        else:
            idmapped_bind(volume["source"], target, userns)
    _show_the_image(root, spec.get("reachable") or [], volumes)
    if security is not None:
        mount_setattr(root + "/sys", add=MOUNT_ATTR_RDONLY, recursive=True)
        if security.get("readOnlyRootFilesystem"):
            mount_setattr(root, add=MOUNT_ATTR_RDONLY, recursive=True)
            for writable in ("/proc", "/dev"):
                mount_setattr(root + writable, clear=MOUNT_ATTR_RDONLY, recursive=writable == "/dev")
            for volume in volumes:
                if not volume.get("readOnly"):
                    mount_setattr(root + volume["target"], clear=MOUNT_ATTR_RDONLY)
    for volume in volumes:
        if volume.get("readOnly"):
            mount_setattr(root + volume["target"], add=MOUNT_ATTR_RDONLY, recursive=True)
    return root


def become(security: dict | None, *, own_users: bool = False) -> None:
    """The container's capabilities, no_new_privs and user, in that order (the last two need the
    first's CAP_SETPCAP, CAP_SETUID, CAP_SETGID). `own_users`: in the pod's user namespace, where
    the node's root is nobody: the pod's root at least."""
    if security is None:
        if own_users:
            os.setgroups([])
            os.setgid(0)
            os.setuid(0)
        return
    keep_capabilities(capabilities_of(security))
    if security.get("allowPrivilegeEscalation") is False:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    uid, gid = security.get("runAsUser"), security.get("runAsGroup")
    if uid is not None or gid is not None or own_users:
        os.setgroups([int(g) for g in security.get("supplementalGroups") or []])
        os.setgid(int(gid or 0))
        os.setuid(int(uid if uid is not None else os.getuid()))


def child(spec: dict, pod: tuple[int | None, int] | None) -> None:
    """`pod`: the sandbox's user namespace (None: the node's users) and network namespace (fds),
    to join."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the parent killed: so is the container
    users = pod[0] if pod is not None else None
    if pod is not None:
        setns(pod[1], CLONE_NEWNET)
    root = build_root(spec, users)
    pivot_root(root)
    if spec.get("hostname"):
        _check(
            _libc.sethostname(spec["hostname"].encode(), ctypes.c_size_t(len(spec["hostname"]))),
            "sethostname",
        )
    try:
        os.chdir(spec.get("cwd") or "/")
    except OSError:
        os.chdir("/")
    if users is not None:  # last: joined, this process is no node root any more
        setns(users, CLONE_NEWUSER)
        # PID and mount namespaces the pod's user namespace owns, as a runtime makes them for
        # such a pod (the pod's root may enter and nest them): this process stays, the
        # container's process is PID 1 of them, with a /proc of its own
        unshare(CLONE_NEWPID | CLONE_NEWNS)
        process = os.fork()
        if process != 0:
            stand_in(process)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    become(spec.get("securityContext"), own_users=users is not None)
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def pod_sandbox(users: bool) -> None:
    """The pod's network namespace (owned by a user namespace of its own, `users`), held until
    killed."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the kubelet gone: so is the pod's network
    if users:
        unshare(CLONE_NEWUSER)
        print("user", flush=True)
        sys.stdin.readline()  # the maps are written
    unshare(CLONE_NEWNET)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
    # the node's services on 127.0.0.1 are reached through DNAT out of the namespace (podnet.py)
    with open("/proc/sys/net/ipv4/conf/all/route_localnet", "w") as f:
        f.write("1")
    print("net", flush=True)
    while True:
        signal.pause()


def main() -> None:
    if sys.argv[1] == "--pod-sandbox":
        pod_sandbox(users="--users" in sys.argv[2:])
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    pod = None
    sandbox = spec.get("sandbox") or {}
    if sandbox:
        namespaces = f"/proc/{int(sandbox['pid'])}/ns"
        user = os.open(f"{namespaces}/user", os.O_RDONLY) if sandbox.get("users") else None
        pod = (user, os.open(f"{namespaces}/net", os.O_RDONLY))
    # the pid file's directory, held open: the child shares this mount namespace, and its
    # pivot_root moves this process's root too, so a path could name nothing by the time of the write
    pid_dir = (
        os.open(os.path.dirname(spec["pidFile"]), os.O_RDONLY | os.O_DIRECTORY)
        if spec.get("pidFile")
        else None
    )
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
    pid = os.fork()  # PID 1 of the new PID namespace
    if pid == 0:
        try:
            if pid_dir is not None:
                os.close(pid_dir)
            child(spec, pod)
        except BaseException as e:  # the container's log says why it did not start
            print(f"container: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(128)
    for fd in pod or ():
        if fd is not None:
            os.close(fd)
    if pid_dir is not None:
        name = os.path.basename(spec["pidFile"])
        fd = os.open(name + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=pid_dir)
        os.write(fd, str(pid).encode())
        os.close(fd)
        os.rename(name + ".tmp", name, src_dir_fd=pid_dir, dst_dir_fd=pid_dir)
        os.close(pid_dir)
    stand_in(pid)


def stand_in(pid: int) -> None:
    """Pass the container's signals on to `pid`, then end as it ended."""
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)  # a namespace's PID 1 ignores its own signal: ends as a shell says it
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
