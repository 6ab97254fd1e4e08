"""The host's function isolation: what it can do, what it was asked to do, and one Lease per
function (a registration, or one task execution).

A Lease is a function's identity on this host: its uid and gid (uid isolation), its cgroup
(where one can be made), what the packet rules let its uid reach beyond `network: outbound`
(runtime/sandbox/egress.py: everything for `network: host`, or the runtime's allow list), and
the SandboxSpec the zygote applies to every process started for it (runtime/sandbox/child.py).
A host asked for uid isolation that cannot switch uids refuses to start (IsolationUnavailable);
so does one asked for `network: none` that cannot make network namespaces, and one asked for
`network: outbound` with uid isolation that cannot write the packet rules (no nft, no
CAP_NET_ADMIN). Everything else that is unavailable (namespaces, cgroups, Landlock, packet rules
for a host whose functions share its uid) falls back as runtime/sandbox/policy.py describes, and
`in_force` says what holds.

Leases are made ahead of demand (`prepare`): a thread keeps a few of them ready — a uid
claimed, a cgroup created with its limits and, where the zygote plants seeds, a seed planted in
that cgroup — so a registration takes one instead of claiming, creating and joining on its own
path. A prepared lease is handed out once, like any other: its uid and cgroup are its
function's alone until `release`, which ends its processes (the unused seed included), removes
its cgroup and frees its uid; nothing of it is ever handed out again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kruntimes.config.egress import UNENFORCED, UNENFORCED_SAME_USER
from kruntimes.runtime.sandbox import cgroups, egress, landlock, seccomp, shared_tmp
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.sandbox.identity import Claim, NoFreeUid, UidPool
from kruntimes.runtime.sandbox.policy import (
    InForce,
    Isolation,
    IsolationUnavailable,
    Network,
    SandboxSettings,
    can_filter_packets,
    can_switch_uid,
)

log = logging.getLogger(__name__)

# Where a machine or a pod keeps secrets for its own processes, hidden from every function
# (when they exist as a function's view is made): a Kubernetes service account's token and CA
# (a host pod whose template mounts one), Docker's and Swarm's secrets (a host in a container).
MACHINE_SECRETS = ("/var/run/secrets", "/run/secrets")
# Users' homes, hidden by rule rather than by their mode (a /root of mode 0755 lists .bashrc);
# a kept path beneath one (a Python installed in a home) still shows through, alone.
HOMES = ("/root", "/home")
# Directories whose content belongs to the system rather than to whoever put a state directory
# in them: hiding them would hide what functions need (certificates under /var/lib, /opt tools).
SYSTEM_DIRECTORIES = frozenset(
    {"/", "/var", "/var/lib", "/var/tmp", "/srv", "/opt", "/tmp", "/run", "/mnt", "/media", "/usr", "/etc"}
)

WORKSPACE_MODE = 0o700
PREPARE_RETRY_S = 1.0  # after a lease could not be made ahead of demand
PREPARE_STOP_S = 10.0  # how long `close` waits for the preparing thread


def python_paths() -> tuple[str, ...]:
    """What a forked Python function process must reach to import: the interpreter's prefixes,
    every directory on sys.path, and the directories holding kruntimes' own packages — but not
    the directory the host was started from, which `python -m` puts first on sys.path (a user's
    project or home directory, none of the functions' business)."""
    found: set[str] = set()
    entries = list(sys.path)
    if entries and entries[0] and os.path.realpath(entries[0]) == os.path.realpath(os.getcwd()):
        entries = entries[1:]
    for path in [sys.base_prefix, sys.prefix, *entries]:
        if path and os.path.isabs(path) and os.path.isdir(path):
            found.add(os.path.realpath(path))
    module = sys.modules.get("kruntimes")
    if module is not None and module.__file__:
        found.add(os.path.dirname(os.path.dirname(os.path.realpath(module.__file__))))
    return tuple(sorted(found))


@dataclass
class Lease:
    """One function's identity on the host, until `FunctionIsolation.release`."""

    slot: str
    claim: Claim | None
    group: cgroups.FunctionGroup | None
    base: SandboxSpec

    @property
    def uid(self) -> int | None:
        return self.claim.uid if self.claim is not None else None

    def sandbox(self, workdir: Path) -> SandboxSpec:
        """The spec of a process of this function whose workspace is `workdir`."""
        return SandboxSpec(
            uid=self.base.uid,
            gid=self.base.gid,
            pid_namespace=self.base.pid_namespace,
            mount_namespace=self.base.mount_namespace,
            network_none=self.base.network_none,
            deny_tcp_bind=self.base.deny_tcp_bind,
            keep=(*self.base.keep, str(workdir)),
            hide=self.base.hide,
            writable=(*self.base.writable, str(workdir)),
            cgroup_procs=self.base.cgroup_procs,
            tmp_bytes=self.base.tmp_bytes,
            foreign_uid=self.base.foreign_uid,
        )

    def own(self, workdir: Path) -> None:
        """Give the function its workspace: owned by its uid, mode 0700, nobody else's."""
        if self.claim is None:
            os.chmod(workdir, WORKSPACE_MODE)
            return
        uid, gid = self.claim.uid, self.claim.gid
        os.lchown(workdir, uid, gid)
        os.chmod(workdir, WORKSPACE_MODE)
        for root, dirs, files in os.walk(workdir):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), uid, gid)


class FunctionIsolation:
    """One per host. `start` once the zygote reported which namespaces it can make."""

    def __init__(
        self,
        settings: SandboxSettings,
        *,
        host_uid: str,
        hide: tuple[str, ...],
        keep: tuple[str, ...] | None = None,
        switch_uids: Callable[[], bool] = can_switch_uid,
        filter_packets: Callable[[], bool] = can_filter_packets,
        nft: str | None = None,  # the nft program; None: found where a system keeps it
    ) -> None:
        self.settings = settings
        self._switch_uids = switch_uids
        self._filter_packets = filter_packets
        self._nft = nft
        self.host_uid = host_uid
        self.shared = tuple(sorted({os.path.realpath(p) for p in settings.shared}))
        self.keep = tuple(sorted({*(keep if keep is not None else python_paths()), *self.shared}))
        # homes and the state directory's parent are hidden by rule, unless one is itself kept
        by_rule = [h for h in (*_private_parents(hide), *HOMES) if os.path.realpath(h) not in self.keep]
        # what no function may see even when named (state directories, the machine's secrets)
        self.forbidden = tuple(
            sorted({os.path.realpath(h) for h in (*settings.hide, *hide, *MACHINE_SECRETS)})
        )
        self.hide = tuple(sorted({*self.forbidden, *(os.path.realpath(h) for h in by_rule)}))
        self.pool: UidPool | None = None
        self.rules: egress.PacketRules | None = None  # the machine's packet rules, where writable
        self.cgroups: cgroups.Cgroups | None = None
        self.in_force: InForce | None = None
        self._namespaces = False
        self._network = False
        # leases made ahead of demand (`prepare`)
        self._ready: deque[Lease] = deque()
        self._want = 0
        self._plant: Callable[[SandboxSpec], None] | None = None
        self._prepared = threading.Condition()
        self._preparer: threading.Thread | None = None
        self._closed = False

    def check(self) -> None:
        """Refuse what cannot be honoured, before anything is started."""
        if self.settings.isolation is Isolation.UID and not self._switch_uids():
            raise IsolationUnavailable(
                "this host cannot give functions their own uid (it is not root and lacks "
                "CAP_SETUID/CAP_SETGID): run it as root, or pass --isolation same-user to run "
                "functions as the host's own user"
            )

    def start(self, *, namespaces: bool, network_namespaces: bool, work_root: Path) -> InForce:
        self.check()
        if self.settings.isolation is Isolation.UID and not namespaces:
            blocked = _untraversable(work_root)
            if blocked is not None:
                raise IsolationUnavailable(
                    f"functions with their own uid must reach their workspaces under {work_root}, "
                    f"but {blocked} is closed to other users and this host cannot make mount "
                    "namespaces to show them the way: put the state directory where every "
                    "ancestor is traversable (mode o+x)"
                )
        if self.settings.network is Network.NONE and not network_namespaces:
            raise IsolationUnavailable(
                "network: none needs network namespaces, which this host cannot make "
                "(it needs CAP_SYS_ADMIN); use network: host"
            )
        self._namespaces = namespaces
        self._network = network_namespaces and self.settings.network is Network.NONE
        if self.settings.isolation is Isolation.UID and not namespaces:
            _share_scratch()  # functions of other uids share /tmp: none may delete another's files
            _close_ancestors(work_root)  # nor rename the host's state aside: they share its mounts
        network = self._start_egress()
        if self.settings.isolation is Isolation.UID:
            scrub = self.rules.scrub if self.rules is not None else None
            self.pool = UidPool(self.settings.uids, lock_dir=self.settings.lock_dir, scrub=scrub)
        if os.geteuid() == 0:
            self.cgroups = cgroups.detect(self.host_uid)
        self.in_force = InForce(
            isolation=self.settings.isolation,
            network=self.settings.network,
            pid_namespace=namespaces,
            mount_namespace=namespaces,
            cgroup=self.cgroups.describe() if self.cgroups is not None else "none",
            seccomp=seccomp.program() is not None,
            egress=network,
            landlock=landlock.describe(landlock.abi(), deny_tcp_bind=self._deny_tcp_bind),
        )
        if self.settings.network is not Network.NONE and network != self._enforced():
            log.warning("functions' network: %s", network)
        if not self.in_force.seccomp:
            log.warning("functions run without a syscall filter: %s", seccomp.unavailable())
        log.info("function isolation", extra={"isolation": self.in_force.describe()})
        return self.in_force

    @property
    def _deny_tcp_bind(self) -> bool:
        return self.settings.network is Network.OUTBOUND

    def _enforced(self) -> str:
        """The network of a host whose packet rules are in force, in words."""
        if self.settings.network is Network.HOST:
            return "network host (opt-out: functions reach every listener of the machine)"
        allowed = len(self.settings.egress_allow)
        extra = f", {allowed} allowed destination(s)" if allowed else ""
        return (
            "network outbound (packet rules: the machine's own addresses, loopback included, and "
            f"link-local, private and multicast ranges refused{extra})"
        )

    def _start_egress(self) -> str:
        """Write this host's part of the machine's packet rules where they apply (uid isolation,
        a host that may write them); the network in force, in words ("": `network none`).
        IsolationUnavailable for `network: outbound` when the rules cannot be written."""
        network = self.settings.network
        if self.settings.isolation is not Isolation.UID:
            if network is not Network.OUTBOUND:
                return "" if network is Network.NONE else self._enforced()
            if os.geteuid() != 0:
                return UNENFORCED
            return UNENFORCED_SAME_USER
        if not self._filter_packets():
            if network is Network.OUTBOUND:
                raise IsolationUnavailable(
                    "network outbound needs packet rules, and this host lacks CAP_NET_ADMIN: run it "
                    "as root (in a pod: add NET_ADMIN to its capabilities), or give the runtime "
                    "`network: host` explicitly (its functions then reach every listener of the machine)"
                )
            return "" if network is Network.NONE else self._enforced()
        try:
            self.rules = egress.PacketRules(lock_dir=self.settings.lock_dir, nft=self._nft)
            if network is not Network.NONE:  # a none host only ever scrubs (its uids may be reused)
                first = self.settings.uids.first
                self.rules.install(
                    first, first + self.settings.uids.count - 1, resolvers=egress.nameservers()
                )
        except egress.PacketRulesUnavailable as exc:
            self.rules = None
            if network is Network.OUTBOUND:
                raise IsolationUnavailable(
                    f"network outbound needs packet rules, which this host cannot write ({exc}): "
                    f"{egress.MANUAL}"
                ) from None
            if egress.nft_path() is not None:  # without nft no rules exist to scrub or open
                log.warning("no packet rules (%s): what a host that died left a uid stays", exc)
        return "" if network is Network.NONE else self._enforced()

    def _admit(self, uid: int) -> bool:
        """Give `uid` what its network asks beyond the rules; whether there was anything to give."""
        if self.rules is None:
            return False
        if self.settings.network is Network.HOST:
            self.rules.admit(uid, open_=True)
            return True
        if self.settings.network is Network.OUTBOUND and self.settings.egress_allow:
            self.rules.admit(uid, allow=self.settings.egress_allow)
            return True
        return False

    def _revoke(self, uid: int) -> bool:
        """Take back what `_admit` gave `uid`; whether that worked (a uid that still holds
        something is left busy: the next claim scrubs it)."""
        if self.rules is None:
            return True
        try:
            if self.settings.network is Network.HOST:
                self.rules.revoke(uid, open_=True)
            elif self.settings.network is Network.OUTBOUND and self.settings.egress_allow:
                self.rules.revoke(uid, allow=self.settings.egress_allow)
        except egress.PacketRulesUnavailable as exc:
            log.warning("could not take back what uid %d may reach: %s", uid, exc)
            return False
        return True

    @property
    def plants_seeds(self) -> bool:
        """Whether prepared leases come with a seed planted in their cgroup (`prepare`)."""
        return self._namespaces and self.cgroups is not None

    def prepare(self, *, count: int, plant: Callable[[SandboxSpec], None]) -> None:
        """Keep `count` leases ready ahead of demand; `plant` asks the zygote for a seed in a
        prepared lease's cgroup (where `plants_seeds`). Nothing to prepare without uids and
        cgroups."""
        if count <= 0 or (self.pool is None and self.cgroups is None) or self._preparer is not None:
            return
        self._want, self._plant = count, plant if self.plants_seeds else None
        self._preparer = threading.Thread(target=self._keep_prepared, name="isolation-prepare", daemon=True)
        self._preparer.start()

    def replenish(self) -> None:
        """A prepared lease was taken: make the next one (in the preparing thread). Called once
        the taker's process was started, so the preparation stays off its path."""
        with self._prepared:
            self._prepared.notify_all()

    def prepared(self) -> int:
        with self._prepared:
            return len(self._ready)

    def _keep_prepared(self) -> None:
        while True:
            with self._prepared:
                while not self._closed and len(self._ready) >= self._want:
                    self._prepared.wait()
                if self._closed:
                    return
            try:
                lease = self._new_lease("pre-" + secrets.token_hex(12))
                if self._plant is not None and lease.group is not None:
                    self._plant(self._seed_of(lease))
            except (NoFreeUid, OSError) as exc:
                log.warning("could not prepare a function identity ahead of demand: %s", exc)
                with self._prepared:
                    self._prepared.wait(PREPARE_RETRY_S)
                continue
            with self._prepared:
                keep = not self._closed
                if keep:
                    self._ready.append(lease)
            if not keep:
                self.release(lease)

    def _seed_of(self, lease: Lease) -> SandboxSpec:
        """The base of a seed planted for `lease` alone: the common one, in its cgroup."""
        common = self.seed_base()
        assert common is not None and lease.group is not None
        return dataclasses.replace(common, cgroup_procs=lease.group.procs_files)

    def lease(self, slot: str) -> Lease:
        """A function identity of its own: a prepared one, or else one made now (`slot` names
        its cgroup). Either way a uid claimed on this machine, a cgroup with the limits."""
        with self._prepared:
            if self._ready:
                return self._ready.popleft()
        return self._new_lease(slot)

    def _new_lease(self, slot: str) -> Lease:
        claim = self.pool.claim() if self.pool is not None else None
        group = None
        admitted = False
        try:
            if claim is not None:
                admitted = self._admit(claim.uid)
            if self.cgroups is not None:
                group = self.cgroups.group(slot)
                group.create(
                    memory_bytes=self.settings.memory_bytes, max_processes=self.settings.max_processes
                )
            base = SandboxSpec(
                uid=claim.uid if claim is not None else None,
                gid=claim.gid if claim is not None else None,
                pid_namespace=self._namespaces,
                mount_namespace=self._namespaces,
                network_none=self._network,
                deny_tcp_bind=self._deny_tcp_bind,
                keep=self.keep,
                hide=self.hide,
                writable=self.shared,
                cgroup_procs=group.procs_files if group is not None else (),
                tmp_bytes=self.settings.tmp_bytes,
                foreign_uid=claim is not None,
            )
        except BaseException:
            if group is not None:
                group.remove()
            if claim is not None and self.pool is not None:
                clean = not admitted or self._revoke(claim.uid)
                self.pool.release(claim, contained=False, clean=clean)
            raise
        return Lease(slot=slot, claim=claim, group=group, base=base)

    def seed_base(self) -> SandboxSpec | None:
        """What every function of this host has in common: the spec the zygote plants seeds
        with (runtime/sandbox/child.py), or None where there are no namespaces to plant in."""
        if not self._namespaces:
            return None
        return SandboxSpec(
            pid_namespace=True,
            mount_namespace=True,
            network_none=self._network,
            keep=self.keep,
            hide=self.hide,
            writable=self.shared,
            tmp_bytes=self.settings.tmp_bytes,
            foreign_uid=self.pool is not None,
        )

    def release(self, lease: Lease) -> None:
        """After the function's processes were killed: end whatever is left, free the uid."""
        contained = lease.base.pid_namespace or lease.group is not None
        try:
            if lease.group is not None:
                lease.group.remove()
        finally:
            if lease.claim is not None and self.pool is not None:
                clean = self._revoke(lease.claim.uid)  # before the uid may go to another function
                self.pool.release(lease.claim, contained=contained, clean=clean)

    def memory_exhausted(self, lease: Lease) -> bool:
        """Whether the kernel killed a process of the function for memory."""
        return lease.group is not None and lease.group.oom_kills() > 0

    def close(self) -> None:
        with self._prepared:
            self._closed = True
            self._prepared.notify_all()
            ready, self._ready = list(self._ready), deque()
        if self._preparer is not None:
            self._preparer.join(PREPARE_STOP_S)
        for lease in ready:
            self.release(lease)
        if self.cgroups is not None:
            self.cgroups.remove()


def _share_scratch() -> None:
    changed, problems = shared_tmp.make_sticky()
    if changed:
        log.info("shared scratch directories made sticky", extra={"directories": changed})
    for problem in problems:
        log.warning("functions share %s, not sticky: one may delete what another left there", problem)


def _close_ancestors(work_root: Path) -> None:
    changed, problems = shared_tmp.close_ancestors(work_root)
    if changed:
        log.info("state directory's ancestors closed to other users' writes", extra={"directories": changed})
    for problem in problems:
        log.warning("functions may rename the host's state aside through %s", problem)


def _private_parents(hidden: tuple[str, ...]) -> list[str]:
    """The directories holding the hidden ones (a state directory's parent: the project or the
    account it was made in, with that owner's other files), but not a system directory."""
    parents = {os.path.dirname(os.path.realpath(h)) for h in hidden}
    inside = tuple(os.path.realpath(h) for h in hidden)
    return sorted(p for p in parents if p not in SYSTEM_DIRECTORIES and not _within_any(p, inside))


def _within_any(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _untraversable(path: Path) -> Path | None:
    """The first ancestor of `path` (or itself) that a process of another uid cannot enter."""
    for ancestor in [*reversed(path.parents), path]:
        try:
            mode = ancestor.stat().st_mode
        except OSError:
            return ancestor
        if not mode & 0o001:
            return ancestor
    return None


def describe(in_force: InForce | None) -> str:
    return in_force.describe() if in_force is not None else "not started"
