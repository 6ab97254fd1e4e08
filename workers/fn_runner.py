"""The KRM function runner: `krt fn-runner` (the FunctionEvaluator gRPC service) and `krt fn eval`.

    krt fn-runner [--listen 127.0.0.1:9445] [--functions DIR] [--fn-configs DIR]
                  [--kubeconfig FILE | --in-cluster | --kubernetes-api URL] [--namespace NS]
                  [--pods [--pod-runtime krm] [--pod-namespace NS]]

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
from kruntimes.krm.directory import DirectoryFeed
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.service import EvaluatorServer
from kruntimes.krm.store import Store
from kruntimes.runtime.sandbox.policy import Network
from kruntimes.system import logs
from kruntimes.workers import fn_eval as fn_cli
from kruntimes.workers.fn_sandbox import FirstUse, sandboxed_runner, secret_paths

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt fn-runner", description="Serve the KRM FunctionEvaluator.")
    parser.add_argument("--listen", default="127.0.0.1:9445", help="gRPC address (port 0: pick one)")
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
    return parser.parse_args(argv)


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
    server = EvaluatorServer(evaluator, listen=args.listen)
    try:
        await server.start()
    except BaseException:
        if runner is not None:
            runner.close()  # its zygote and the identities it holds
        raise
    host = args.listen.rsplit(":", 1)[0]
    address = f"{host}:{server.port}"
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
    except (errors.KrmError, OSError) as e:
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
