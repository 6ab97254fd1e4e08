"""The runtime host process: `krt host` or `python -m kruntimes.workers.host`.

Starts the Runtime Server and, with --ready-file, writes {"pid", "address", "hostUid"} there
once it serves (the process host provider waits for that file). --peer-tls and
--assignment-public-key are required: every port of a host is mutual TLS with its platform
certificate, and it registers only assignments the control plane signed.
"""

from __future__ import annotations

import argparse
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from kruntimes.config.egress import MAX_ALLOW, parse_allow_list
from kruntimes.config.runtimes import ResourceLimits
from kruntimes.pki import PeerTLS, PeerTLSError, Role
from kruntimes.pki.assignments import AssignmentError, Verifier
from kruntimes.runtime.admission import (
    DEFAULT_MAX_WAITING,
    INVOCATIONS_PER_CPU,
    MAX_MAX_INVOCATIONS,
    MAX_MAX_WAITING,
    MAX_MAX_WAITING_BYTES,
    MEMORY_PER_INVOCATION,
    WAITER_BYTES,
    WAITING_MEMORY_SHARE,
)
from kruntimes.runtime.discovery import DEFAULT_INTERVAL_S, check_interval, split_target
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.registry import DEFAULT_KRM_CONCURRENCY, MAX_KRM_CONCURRENCY
from kruntimes.runtime.sandbox.identity import DEFAULT_LOCK_DIR, UidRange
from kruntimes.runtime.sandbox.policy import Isolation, IsolationUnavailable, Network, SandboxSettings
from kruntimes.runtime.server import HostConfigError, HostOptions, RuntimeHost
from kruntimes.system import logs
from kruntimes.system.serving import STOP_SIGNALS, write_ready_file


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt host", description="Run a kruntimes runtime host.")
    parser.add_argument("--host-id", required=True, help="stable host name, e.g. python-0")
    parser.add_argument("--runtime", required=True, help="the runtime this host serves, e.g. python")
    parser.add_argument("--listen", default="127.0.0.1:0", help="gRPC listen address (port 0: pick one)")
    parser.add_argument(
        "--invoke-listen",
        default=None,
        help="the raw invoke port's address (default: the --listen host, port 0; empty: none)",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="where workspaces live")
    parser.add_argument(
        "--secrets-dir",
        type=Path,
        default=None,
        help="the secrets Runs' envFrom names, {dir}/{namespace}/{secret}/{KEY} (default: STATE/secrets)",
    )
    parser.add_argument(
        "--role-bindings",
        type=Path,
        default=None,
        help="the role bindings whose use-secrets bindings say whose Runs get which secret, read "
        "again when it changes (default: STATE/rolebindings.yaml; missing: no Run gets a secret)",
    )
    parser.add_argument("--ready-file", type=Path, help="write the serving address here as JSON")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=64,
        help="threads for blocking work (registering, tasks, unregistering); invokes run on the event loop",
    )
    parser.add_argument(
        "--gateway",
        action="append",
        default=[],
        help="a gateway's heartbeat address, or dns+all://NAME:PORT for every address NAME resolves to "
        "(repeatable)",
    )
    parser.add_argument(
        "--gateway-resolve-interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between resolving the dns+all:// gateway names again",
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument(
        "--peer-tls",
        type=Path,
        required=True,
        help="the host's certificate directory: tls.crt, tls.key, ca.crt (a kubernetes.io/tls Secret "
        "mounted as is), issued for spiffe://kruntimes.io/host/<runtime>/<host-id>; reloaded on change",
    )
    parser.add_argument(
        "--assignment-public-key",
        type=Path,
        required=True,
        help="the control plane's assignment public key(s) (PEM)",
    )
    isolation = parser.add_argument_group("function isolation")
    isolation.add_argument(
        "--isolation",
        choices=[i.value for i in Isolation],
        default=Isolation.UID.value,
        help="uid: every function its own unprivileged uid (needs root or CAP_SETUID/CAP_SETGID); "
        "same-user: functions run as this host's user (they can read what it can)",
    )
    isolation.add_argument(
        "--network",
        choices=[n.value for n in Network],
        default=Network.OUTBOUND.value,
        help="outbound: functions reach the outside world but not this machine's addresses (loopback "
        "included), link-local or private ranges (packet rules: needs root and nft); host: no such "
        "rules (an opt-out); none: each function gets a network namespace with only loopback",
    )
    isolation.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        metavar="CIDR:PORT",
        help="with --network outbound: a destination functions may reach although the rules refuse "
        f"it, e.g. 10.1.2.3/32:5432, [fd00::/8]:443, 192.0.2.0/24:* (repeatable, at most {MAX_ALLOW})",
    )
    add = isolation.add_argument
    add("--uid-range", default=None, metavar="FIRST-LAST", help="uids for functions")
    add(
        "--uid-lock-dir",
        default=DEFAULT_LOCK_DIR,
        metavar="DIR",
        help="where the hosts sharing --uid-range lock the uids they hand out (writable; "
        f"default {DEFAULT_LOCK_DIR}, shared by every host of the machine)",
    )
    defaults = ResourceLimits()
    add("--open-files", type=int, default=defaults.openFiles, help="per function process")
    add("--processes", type=int, default=defaults.processes, help="processes and threads of one function")
    memory = (defaults.memoryBytes or 0) // 2**20
    add("--memory-limit-mib", type=int, default=memory, help="across a function's processes; 0: none")
    add("--address-space-mib", type=int, default=defaults.addressSpaceBytes // 2**20, help="per process")
    add("--cpu-seconds", type=int, default=defaults.cpuSeconds, help="CPU time per process")
    add("--file-size-mib", type=int, default=defaults.fileSizeBytes // 2**20, help="largest file written")
    add("--tmp-size-mib", type=int, default=defaults.tmpBytes // 2**20, help="private /tmp and /dev/shm")
    add("--hide", action="append", default=[], metavar="DIR", help="a directory functions never see")
    add("--share", action="append", default=[], metavar="DIR", help="a directory every function sees")
    add(
        "--allowed-source-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory a Run's source.path may point into (repeatable); none: only inline sources",
    )
    parser.add_argument(
        "--health-listen",
        default=None,
        help="a plaintext port serving only the gRPC health service, for probes without a "
        "certificate (a kubelet's readiness probe); default: none",
    )
    parser.add_argument(
        "--host-uid",
        type=_uuid,
        default=None,
        help="this incarnation's uid, a UUID (a pod passes its own); default: a new one",
    )
    parser.add_argument(
        "--krm-concurrency",
        type=_krm_concurrency,
        default=DEFAULT_KRM_CONCURRENCY,
        help="invocations a Run of a krm runtime takes at once, each its own process "
        f"(1..{MAX_KRM_CONCURRENCY}; default {DEFAULT_KRM_CONCURRENCY})",
    )
    parser.add_argument(
        "--max-invocations",
        type=_max_invocations,
        default=None,
        help="invocations running at once across the host's Runs; past it an invocation is refused "
        f"(429 HostBusy). Default: {INVOCATIONS_PER_CPU} per CPU, at most one per "
        f"{MEMORY_PER_INVOCATION // 2**20} MiB of the host's memory",
    )
    parser.add_argument(
        "--max-waiting",
        type=_bounded(0, MAX_MAX_WAITING),
        default=DEFAULT_MAX_WAITING,
        help="invocations waiting their turn across the host's Runs' queues; past it one that would "
        f"wait is refused (429 HostBusy). Default {DEFAULT_MAX_WAITING}",
    )
    parser.add_argument(
        "--max-waiting-bytes",
        type=_bounded(0, MAX_MAX_WAITING_BYTES),
        default=None,
        help="bytes the waiting invocations may hold, each its payload and "
        f"{WAITER_BYTES} more; past it one that would wait is refused (429 HostBusy). Default: "
        f"1/{WAITING_MEMORY_SHARE} of the host's memory",
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def _krm_concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r:.80}") from e
    if not 1 <= value <= MAX_KRM_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"must be in [1, {MAX_KRM_CONCURRENCY}], got {value}")
    return value


def _max_invocations(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r:.80}") from e
    if not 1 <= value <= MAX_MAX_INVOCATIONS:
        raise argparse.ArgumentTypeError(f"must be in [1, {MAX_MAX_INVOCATIONS}], got {value}")
    return value


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r:.80}") from e
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    return parse


def _uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a UUID: {text!r:.80}") from e


def limits(args: argparse.Namespace) -> ResourceLimits:
    """The function limits of the flags, validated as the runtimes file validates them."""
    try:
        return ResourceLimits(
            openFiles=args.open_files,
            processes=args.processes,
            memoryBytes=args.memory_limit_mib * 2**20 or None,
            addressSpaceBytes=args.address_space_mib * 2**20,
            cpuSeconds=args.cpu_seconds,
            fileSizeBytes=args.file_size_mib * 2**20,
            tmpBytes=args.tmp_size_mib * 2**20,
        )
    except ValueError as exc:
        raise SystemExit(f"krt host: a function limit is out of bounds: {exc}") from None


def process_limits(given: ResourceLimits) -> ProcessLimits:
    return ProcessLimits(
        open_files=given.openFiles,
        processes=given.processes,
        address_space_bytes=given.addressSpaceBytes,
        cpu_seconds=given.cpuSeconds,
        file_size_bytes=given.fileSizeBytes,
    )


def sandbox_settings(args: argparse.Namespace, given: ResourceLimits) -> SandboxSettings:
    try:
        uids = UidRange.parse(args.uid_range) if args.uid_range else UidRange()
    except ValueError as exc:
        raise SystemExit(f"krt host: --uid-range: {exc}") from exc
    try:
        return SandboxSettings(
            isolation=Isolation(args.isolation),
            network=Network(args.network),
            egress_allow=parse_allow_list(args.egress_allow),
            uids=uids,
            lock_dir=args.uid_lock_dir,
            memory_bytes=given.memoryBytes,
            max_processes=given.processes,
            tmp_bytes=given.tmpBytes,
            hide=tuple(str(Path(h).resolve()) for h in args.hide),
            shared=tuple(str(Path(h).resolve()) for h in args.share),
        )
    except ValueError as exc:
        raise SystemExit(f"krt host: --egress-allow: {exc}") from None


def gateway_targets(args: argparse.Namespace) -> tuple[str, ...]:
    """The --gateway targets, each an address or a valid dns+all://NAME:PORT."""
    try:
        check_interval(args.gateway_resolve_interval)
        for target in args.gateway:
            split_target(target)
    except ValueError as exc:
        raise SystemExit(f"krt host: --gateway: {exc}") from None
    return tuple(args.gateway)


def options_from(args: argparse.Namespace, *, invoke_tls: bool = True) -> HostOptions:
    """`invoke_tls=False` is the invoke bench's plaintext baseline (bench/invoke.py); no flag."""
    given = limits(args)
    try:
        tls = PeerTLS(args.peer_tls, role=Role.HOST)
        assignments = Verifier.load(args.assignment_public_key)
    except (PeerTLSError, AssignmentError) as e:
        raise SystemExit(f"krt host: {e}") from None
    return HostOptions(
        host_id=args.host_id,
        runtime=args.runtime,
        listen=args.listen,
        invoke_listen=args.invoke_listen,
        state_dir=args.state_dir,
        limits=process_limits(given),
        max_workers=args.max_workers,
        gateways=gateway_targets(args),
        heartbeat_interval_s=args.heartbeat_interval,
        gateway_resolve_interval_s=args.gateway_resolve_interval,
        sandbox=sandbox_settings(args, given),
        allowed_source_roots=tuple(str(Path(r).resolve()) for r in args.allowed_source_root),
        secrets_dir=args.secrets_dir,
        role_bindings=args.role_bindings,
        tls=tls,
        assignments=assignments,
        invoke_tls=invoke_tls,
        host_uid=args.host_uid,
        health_listen=args.health_listen,
        krm_concurrency=args.krm_concurrency,
        max_invocations=args.max_invocations,
        max_waiting=args.max_waiting,
        max_waiting_bytes=args.max_waiting_bytes,
    )


def serve(options: HostOptions, *, ready_file: Path | None) -> None:
    """Run the host until SIGTERM/SIGINT; with `ready_file`, say where it serves once it does."""
    try:
        host = RuntimeHost(options)
        address = host.start()
    except (HostConfigError, IsolationUnavailable) as exc:
        raise SystemExit(f"krt host: {exc}") from None
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    if ready_file:
        isolation = host.in_force.describe() if host.in_force is not None else ""
        write_ready_file(ready_file, address=address, hostUid=host.host_uid, isolation=isolation)
    stop.wait()
    host.stop()


def main(argv: list[str] | None = None, *, invoke_tls: bool = True) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    serve(options_from(args, invoke_tls=invoke_tls), ready_file=args.ready_file)


if __name__ == "__main__":
    main()
