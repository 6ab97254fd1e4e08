"""The KRM function runner: `krt fn-runner` (the FunctionEvaluator gRPC service) and `krt fn eval`.

    krt fn-runner [--listen unix:PATH | --listen HOST:PORT --tls DIR] [--functions DIR]
                  [--fn-configs DIR] [--kubeconfig FILE | --in-cluster | --kubernetes-api URL]
                  [--namespace NS] [--pods [--pod-runtime krm] [--pod-namespace NS]]
                  [--max-per-caller N] [--max-waiting-per-caller N]

It listens on a Unix socket only its user can open (default $KRT_STATE_DIR/fn-runner.sock), or on
a TCP port of mutual TLS with `--tls DIR` (its platform certificate, a host identity such as
`krm/fn-runner`): every caller presents a platform identity. A TCP port without TLS is refused.
Each caller runs at most `--max-per-caller` evaluations at once with `--max-waiting-per-caller`
more queued (krm/service.py).

FunctionConfigs come from the `--fn-configs` directory (re-read when it changes) and/or a Kubernetes
watch; evaluation is the multi evaluator (exec, then pod; with --pods the pod evaluator runs
podExecutor images on the platform of client.json and warms a Run per FunctionConfig at start). With
--ready-file, the serving address is written there as JSON {"pid", "address"} once it serves. Wiring
only: the logic is in krm/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

from kruntimes.cli.main import leave
from kruntimes.krm import errors, process
from kruntimes.krm.client import RUNNER_ROLE
from kruntimes.krm.directory import DirectoryFeed
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.service import UNIX, CallerBounds, EvaluatorServer, ListenRefused, check_listen
from kruntimes.krm.store import Store
from kruntimes.pki import PeerTLS, PeerTLSError
from kruntimes.runtime.sandbox.policy import Network
from kruntimes.sdk import config as clientconfig
from kruntimes.system import logs
from kruntimes.workers import fn_eval as fn_cli
from kruntimes.workers.fn_sandbox import FirstUse, sandboxed_runner, secret_paths

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt fn-runner", description="Serve the KRM FunctionEvaluator.")
    parser.add_argument(
        "--listen",
        help="unix:PATH (default: fn-runner.sock in the state directory), or HOST:PORT with --tls",
    )
    parser.add_argument(
        "--tls", type=Path, metavar="DIR", help="the runner's platform certificate (a host identity)"
    )
    parser.add_argument("--functions", type=Path, help="where relative binary paths are found")
    parser.add_argument("--fn-configs", type=Path, metavar="DIR", help="a directory of FunctionConfig files")
    parser.add_argument("--poll", type=float, default=1.0, metavar="S", help="re-read --fn-configs every S s")
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument("--kubeconfig", help="watch FunctionConfigs with this kubeconfig")
    cluster.add_argument("--in-cluster", action="store_true", help="watch with the pod's service account")
    cluster.add_argument("--kubernetes-api", metavar="URL", help="watch this API server as it is (no auth)")
    parser.add_argument("--namespace", help="watch one namespace (default: all)")
    parser.add_argument("--max-parallel", type=int, default=8, help="functions running at once")
    parser.add_argument(
        "--max-per-caller",
        type=int,
        metavar="N",
        help="one caller's evaluations at once (default: half of --max-parallel)",
    )
    parser.add_argument(
        "--max-waiting-per-caller", type=int, default=4, metavar="N", help="one caller's evaluations queued"
    )
    parser.add_argument(
        "--fn-network",
        choices=[n.value for n in Network],
        default=Network.NONE.value,
        help="the network of binaryExecutor functions (default none, as kpt fn eval's)",
    )
    parser.add_argument(
        "--pods",
        action="store_true",
        help="serve podExecutor images on Runs of the platform of client.json (KRT_STATE_DIR)",
    )
    parser.add_argument("--pod-runtime", default="krm", help="the runtime (adapter krm) of those Runs")
    parser.add_argument("--pod-namespace", default="default", help="the namespace of those Runs")
    parser.add_argument("--ready-file", type=Path, help="write the serving address here as JSON")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if args.listen is None:
        args.listen = f"{UNIX}{clientconfig.state_dir() / 'fn-runner.sock'}"
    if args.tls is not None and args.listen.startswith(UNIX):
        parser.error("--tls is for a TCP --listen; a Unix socket is guarded by its mode")
    try:
        check_listen(args.listen, tls=args.tls is not None)
    except ListenRefused as e:
        parser.error(str(e))
    if args.max_per_caller is None:
        args.max_per_caller = max(1, args.max_parallel // 2)
    if args.max_per_caller < 1 or args.max_waiting_per_caller < 0:
        parser.error("--max-per-caller is at least 1, --max-waiting-per-caller at least 0")
    return args


async def serve(args: argparse.Namespace) -> None:
    store = Store(functions_dir=args.functions)
    feeds: list[asyncio.Task[None]] = []
    api_client = None
    if args.fn_configs is not None:
        feed = DirectoryFeed(store, args.fn_configs, interval=args.poll)
        feed.scan()
        feeds.append(asyncio.create_task(feed.run()))
    if args.kubeconfig or args.in_cluster or args.kubernetes_api:
        from kruntimes.krm import kubernetes  # the client loads only when a watch is asked for

        api_client = await kubernetes.connect(
            host=args.kubernetes_api, kubeconfig=args.kubeconfig, in_cluster=args.in_cluster
        )
        feeds.append(
            asyncio.create_task(kubernetes.KubernetesFeed(store, api_client, namespace=args.namespace).run())
        )
    platform = None
    if args.pods:
        from kruntimes.sdk.client import Client

        platform = Client.from_config()
    pods = PodEvaluator(store, client=platform, runtime=args.pod_runtime, namespace=args.pod_namespace)
    warming = asyncio.create_task(_warm(pods))
    runner, isolation = sandboxed_runner(
        max_parallel=args.max_parallel,
        network=Network(args.fn_network),
        hide=secret_paths(kubeconfig=args.kubeconfig),
    )
    if runner is None:
        log.warning("binaryExecutor functions run unsandboxed (%s)", isolation)
    else:
        log.info("binaryExecutor functions: %s", isolation)
    evaluator = MultiEvaluator(
        [ExecEvaluator(store, max_parallel=args.max_parallel, runner=runner or process.run), pods]
    )
    try:
        tls = PeerTLS(args.tls, role=RUNNER_ROLE) if args.tls is not None else None
        server = EvaluatorServer(
            evaluator,
            listen=args.listen,
            tls=tls,
            bounds=CallerBounds(running=args.max_per_caller, waiting=args.max_waiting_per_caller),
        )
        await server.start()
    except BaseException:
        if runner is not None:
            runner.close()  # its zygote and the identities it holds
        raise
    address = server.address
    log.info("fn-runner serving on %s", address)
    if args.ready_file:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "address": address}))
        tmp.replace(args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()
        if runner is not None:
            runner.close()
        warming.cancel()
        await pods.close()
        if platform is not None:
            await platform.close()
        for task in feeds:
            task.cancel()
        for task in feeds:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if api_client is not None:
            await api_client.close()


async def _warm(pods: PodEvaluator) -> None:
    """A Run for each FunctionConfig with a podExecutor, while the runner already serves."""
    for image, problem in (await pods.warm()).items():
        log.warning("warming %s failed: %s", image, problem)


def main(argv: list[str]) -> int:
    """`krt fn-runner`."""
    args = parse_args(argv)
    logs.setup(args.log_level)
    try:
        asyncio.run(serve(args))
    except (errors.KrmError, OSError, ListenRefused, PeerTLSError) as e:
        print(f"krt: fn-runner cannot start: {e}", file=sys.stderr)
        return fn_cli.UNAVAILABLE
    return 0


def main_fn(argv: list[str]) -> int:
    """`krt fn <verb>`: `eval` only."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: krt fn eval [DIR|-] (--image IMG[:TAG] | --exec CMD) ...", file=sys.stderr)
        return 0 if argv else fn_cli.USAGE
    if argv[0] != "eval":
        print(f"krt: unknown fn command {argv[0]!r}; the one command is `krt fn eval`", file=sys.stderr)
        return fn_cli.USAGE
    made: list[FirstUse] = []

    def runner(network: bool) -> FirstUse:
        chosen = Network.HOST if network else Network.NONE
        made.append(FirstUse(network=chosen, hide=secret_paths(), err=sys.stderr))
        return made[-1]

    try:
        return fn_cli.main(argv[1:], runner=runner)
    finally:
        for each in made:
            each.close()


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
