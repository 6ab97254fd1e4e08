"""`krt worker` / `python -m kruntimes.workers.worker`: the Temporal worker's entry point.

Reads its flags and the platform config once, checks what every registered host provider needs
of them before anything is served (a pod template against the Kubernetes schema, ...), then runs
the worker process (workers/assembly.py) until it is asked to stop or one of its Temporal workers
ends, and exposes the SDK's metrics for Prometheus.

Every registered host provider adds its own flags (`--kubeconfig`, `--kube-context` for
`provider: kubernetes`, activities/hosts/kubernetes_hosts.py); the hosts the worker starts are
owned by its control plane (`--control-plane-id`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from kruntimes.activities.callbacks import AllowedHost, CallbackPolicy, trust
from kruntimes.activities.hosts.base import ProviderConfigError
from kruntimes.activities.hosts.registry import PROVIDERS, check_providers
from kruntimes.cli.main import leave
from kruntimes.config.runtimes import load_config
from kruntimes.contracts.names import POOL_TASK_QUEUE, TASK_QUEUE
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.providers import HostDefaults
from kruntimes.pki import DEFAULT_LIFETIME
from kruntimes.system import logs, malloc
from kruntimes.system.serving import stop_event
from kruntimes.temporal import connect as temporal
from kruntimes.workers.assembly import running_workers, until_stopped
from kruntimes.workers.settings import TrustError, WorkerSettings, WorkerTrust, provider_setup
from kruntimes.workers.tuning import DEFAULT_WORKFLOW_CACHE, MAX_TASK_QUEUE_LENGTH, MAX_WORKFLOW_CACHE

__all__ = ["main", "parse_args", "serve", "settings_from"]

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt worker", description="Run the kruntimes Temporal worker.")
    temporal.add_arguments(parser)
    parser.add_argument(
        "--config", type=Path, help="platform config YAML (default: python and bash runtimes)"
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="where process hosts live")
    parser.add_argument("--gateway-url", default="https://127.0.0.1:8443")
    parser.add_argument("--ca-file", type=Path, help="the gateway CA (PEM) put into Run endpoints")
    parser.add_argument(
        "--gateway-heartbeat",
        action="append",
        default=[],
        help="a gateway's heartbeat address hosts report to",
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    parser.add_argument(
        "--peer-tls",
        type=Path,
        required=True,
        help="the worker's platform certificate directory (tls.crt, tls.key, ca.crt; a control-plane "
        "identity) presented to hosts; reloaded on change",
    )
    parser.add_argument(
        "--assignment-key",
        type=Path,
        required=True,
        help="the Ed25519 private key (PEM, 0600) assignments are signed with",
    )
    parser.add_argument(
        "--platform-ca",
        type=Path,
        help="a directory with the platform CA (ca.crt, ca.key, and bundle.crt: the CAs hosts trust; "
        "loaded again when they change): the worker issues the hosts it starts their certificates "
        "(without it, it starts none)",
    )
    parser.add_argument(
        "--host-certificate-lifetime",
        type=float,
        default=DEFAULT_LIFETIME.total_seconds(),
        help="seconds a host certificate is valid (renewed after two thirds); default 30 days",
    )
    parser.add_argument("--metrics-address", help="host:port for Prometheus metrics, e.g. 127.0.0.1:9464")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--queues",
        default="runs,pools",
        help="the task queues to serve: runs, pools or both (default runs,pools)",
    )
    parser.add_argument(
        "--task-queue",
        default=TASK_QUEUE,
        help=f"the Runs' task queue (default {TASK_QUEUE}); starters must use the same",
    )
    parser.add_argument(
        "--pool-task-queue",
        default=POOL_TASK_QUEUE,
        help=f"the pools' task queue (default {POOL_TASK_QUEUE})",
    )
    parser.add_argument(
        "--isolation",
        choices=["uid", "same-user"],
        default="uid",
        help="how hosts isolate functions when a runtime names nothing: uid (each function its own "
        "unprivileged uid; hosts that cannot switch uids refuse to start) or same-user",
    )
    parser.add_argument(
        "--allowed-source-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory Runs' source.path may point into (repeatable; the runtimes file's "
        "allowedSourceRoots replaces them); none: only inline sources",
    )
    parser.add_argument(
        "--control-plane-id",
        help="the owner annotated on this control plane's hosts (its host pods) "
        "(default: <temporal namespace>/<pool task queue>)",
    )
    for kind in PROVIDERS.values():
        kind.add_arguments(parser)
    parser.add_argument(
        "--workflow-cache",
        type=int,
        default=DEFAULT_WORKFLOW_CACHE,
        metavar="N",
        help=f"workflows of the Runs' task queue kept in memory between their tasks (default "
        f"{DEFAULT_WORKFLOW_CACHE}; 0 keeps none: every task replays its workflow's history)",
    )
    parser.add_argument(
        "--callback-allow",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="an async invocation's callback URL host (and port) let through although it resolves to "
        "a loopback, private, link-local or this machine's address (repeatable; default none)",
    )
    parser.add_argument(
        "--callback-ca",
        type=Path,
        metavar="FILE",
        help="CA certificates (PEM) callbacks' receivers are trusted by, beside the system's",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run workflow code in the Temporal SDK's sandbox (slower; for developing workflows)",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    ca = args.ca_file.read_text() if args.ca_file else None
    settings = WorkerSettings(
        temporal=temporal.settings_from(args),
        config=load_config(args.config),
        platform=PlatformInfo(
            gatewayUrl=args.gateway_url,
            caBundle=ca,
            stateDir=str(args.state_dir.resolve()),
            gatewayHeartbeats=args.gateway_heartbeat,
            heartbeatIntervalSeconds=args.heartbeat_interval,
        ),
        trust=WorkerTrust(
            peer_tls=args.peer_tls,
            assignment_key=args.assignment_key,
            platform_ca=args.platform_ca,
            host_certificate_lifetime=timedelta(seconds=args.host_certificate_lifetime),
        ),
        metrics_address=args.metrics_address,
        sandboxed=args.sandbox,
        workflow_cache=_workflow_cache(args.workflow_cache),
        queues=_queues(args.queues),
        run_task_queue=_task_queue(args.task_queue, flag="--task-queue"),
        pool_task_queue=_task_queue(args.pool_task_queue, flag="--pool-task-queue"),
        host_defaults=HostDefaults(
            isolation=args.isolation,
            allowedSourceRoots=[str(Path(r).expanduser().resolve()) for r in args.allowed_source_root],
        ),
        provider_options={
            name: options
            for name, kind in PROVIDERS.items()
            if (options := kind.options_from(args)) is not None
        },
        control_plane_id=args.control_plane_id,
        callbacks=_callbacks(args.callback_allow, args.callback_ca),
    )
    try:
        check_providers(provider_setup(settings))
    except (ValueError, ProviderConfigError) as e:
        raise SystemExit(f"krt worker: {e}") from e
    if settings.run_task_queue == settings.pool_task_queue:
        # Each queue's worker registers only its own workflows: a shared queue would hand pool
        # tasks to the Runs' worker and the other way round.
        raise SystemExit("krt worker: --task-queue and --pool-task-queue must differ")
    return settings


def _callbacks(allow: list[str], ca_file: Path | None) -> CallbackPolicy:
    try:
        policy = CallbackPolicy(allow=tuple(AllowedHost.parse(a) for a in allow), ca_file=ca_file)
        trust(ca_file)  # a CA file that cannot be loaded is found at start, not at a callback
    except ValueError as e:
        raise SystemExit(f"krt worker: {e}") from e
    return policy


def _queues(text: str) -> frozenset[str]:
    queues = frozenset(q.strip() for q in text.split(",") if q.strip())
    unknown = queues - {"runs", "pools"}
    if not queues or unknown:
        raise SystemExit(f"krt worker: --queues takes runs, pools or both, not {text!r}")
    return queues


def _workflow_cache(count: int) -> int:
    if not 0 <= count <= MAX_WORKFLOW_CACHE:
        raise SystemExit(f"krt worker: --workflow-cache takes 0 to {MAX_WORKFLOW_CACHE:,}, not {count}")
    return count


def _task_queue(text: str, *, flag: str) -> str:
    name = text.strip()
    if not name or len(name) > MAX_TASK_QUEUE_LENGTH:
        raise SystemExit(f"krt worker: {flag} takes a name of 1 to {MAX_TASK_QUEUE_LENGTH} characters")
    return name


async def serve(settings: WorkerSettings) -> None:
    runtime = None
    if settings.metrics_address:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=settings.metrics_address))
        )
    client = await temporal.connect(settings.temporal, runtime=runtime)
    stop = stop_event()
    # A reconcile lists every Run, a visibility page of 1,000 at a time, through the Temporal
    # core on its own threads: glibc keeps what those pages took in the threads' arenas after
    # they are freed, in the worker's RSS. The trimmer gives it back
    # (kruntimes.system.malloc; docs/pool.md, "The worker's memory").
    trimmer = malloc.Trimmer()
    trimmer.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(trimmer.stop)
        try:
            running = await stack.enter_async_context(running_workers(client, settings))
        except ProviderConfigError as e:
            raise SystemExit(f"krt worker: {e}") from e
        log.info(
            "worker running",
            extra={"temporal": settings.temporal.address, "namespace": settings.temporal.namespace},
        )
        ended = await until_stopped(stop, running)
        if ended is not None:
            log.error("a Temporal worker ended; exiting to be started again", extra={"reason": ended})
            raise SystemExit(f"krt worker: {ended}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    try:
        asyncio.run(serve(settings_from(args)))
    except TrustError as e:
        print(f"krt worker: {e}", file=sys.stderr)
        leave(1)
    except SystemExit as e:  # a configuration the worker cannot run with, already explained
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            leave(1)
        leave(e.code or 0)
    leave(0)


if __name__ == "__main__":
    main()
