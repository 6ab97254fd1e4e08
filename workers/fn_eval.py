"""`krt fn eval`: run one KRM function on a package, in the conventions of `kpt fn eval` (the
command's entry point; the evaluators, packages and resources are kruntimes.krm's).

    krt fn eval [DIR|-] (--image IMG[:TAG] | --exec "CMD ARGS") [--tag T]
                [--fn-config FILE | -- key=value ...] [-o stdout|unwrap|DIR] [--results-dir DIR]
                [--timeout S] [--functions DIR] [--fn-configs DIR] [--runner ADDRESS | --pods]

DIR (default `.`) is read as a package (`kruntimes.krm.package`) and, unless `-o` says otherwise, written back
in place when the function succeeds; `-` reads a ResourceList (or plain resources) from stdin and
prints to stdout. `--image` evaluates in this process with the multi evaluator (exec, then pod) over
the FunctionConfigs of `--fn-configs`, or on a running `krt fn-runner` with `--runner`; `--exec`
runs the command itself. `--pods` lets the pod evaluator run an image the exec evaluator has no
binary for on the platform of client.json (its Runs are deleted at exit). Exit codes: 0 ok, 1 the
function failed or its evaluation did, 2 usage error, 3 no evaluator has the function, 4
infrastructure (the binary cannot start, the runner is unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kruntimes.cli.parser import NotKeyValue, Parser, UsageError, key_values
from kruntimes.krm import errors, package, process
from kruntimes.krm.directory import DirectoryFeed
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.evaluator import Evaluator
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.limits import DEFAULT_TIMEOUT_SECONDS, MAX_RESOURCE_LIST_BYTES
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.resources import (
    API_VERSION,
    KIND,
    YamlError,
    dump,
    dump_all,
    load,
    load_all,
    parse_resource_list,
)
from kruntimes.krm.store import Store

OK, FAILED, USAGE, NOT_FOUND, UNAVAILABLE = 0, 1, 2, 3, 4
RESULTS_FILE = "results.yaml"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="krt fn eval", description="Evaluate one KRM function on a package or a ResourceList.")
    p.add_argument(
        "source", nargs="?", default=".", metavar="DIR|-", help="the package directory, or - for stdin"
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-i", "--image", help="the function image, IMG[:TAG]")
    which.add_argument(
        "--exec", dest="exec_command", metavar="CMD ARGS", help="run this command as the function"
    )
    p.add_argument("--tag", default="", help="a version or semver constraint (default: the image's tag)")
    p.add_argument("--fn-config", type=Path, metavar="FILE", help="a YAML file holding the functionConfig")
    p.add_argument("-o", "--output", metavar="stdout|unwrap|DIR", help="where the result goes")
    p.add_argument(
        "--results-dir", type=Path, metavar="DIR", help=f"write {RESULTS_FILE} (a FunctionResultList) here"
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="S", help="seconds")
    p.add_argument("--functions", type=Path, metavar="DIR", help="where relative binary paths are found")
    p.add_argument("--fn-configs", type=Path, metavar="DIR", help="a directory of FunctionConfig YAML files")
    p.add_argument(
        "--runner", metavar="ADDRESS", help="evaluate on a running `krt fn-runner` (unix:PATH or host:port)"
    )
    p.add_argument(
        "--runner-tls",
        type=Path,
        metavar="DIR",
        help="the platform certificate a host:port runner is reached with (default: the client "
        "config's platform's, $KRT_STATE_DIR/pki/control-plane)",
    )
    p.add_argument(
        "--network",
        action="store_true",
        help="let a binary reach the network (as root it runs sandboxed, by default with none)",
    )
    p.add_argument(
        "--pods",
        action="store_true",
        help="let the pod evaluator run the function on the platform of client.json (`krt up`)",
    )
    p.add_argument("--namespace", default="default", help="the namespace of the pod evaluator's Runs")
    p.epilog = "Arguments after -- are key=value pairs of a ConfigMap functionConfig."
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str] | None]:
    pairs: dict[str, str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
        try:
            pairs = key_values(rest)
        except NotKeyValue as e:
            raise UsageError(f"{e.item!r} after -- is not key=value") from None
    args = parser().parse_args(argv)
    if pairs is not None and args.fn_config is not None:
        raise UsageError("give --fn-config or key=value pairs after --, not both")
    if args.pods and args.runner is not None:
        raise UsageError("--pods evaluates here; the runner has its own platform")
    if args.exec_command is not None and args.runner is not None:
        raise UsageError("--exec runs the command here; it cannot go to --runner")
    if args.exec_command is not None and not shlex.split(args.exec_command):
        raise UsageError("--exec needs a command")
    return args, pairs


def function_config(args: argparse.Namespace, pairs: dict[str, str] | None) -> dict[str, Any] | None:
    if pairs is not None:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "function-input"},
            "data": pairs,
        }
    if args.fn_config is None:
        return None
    try:
        value = load(args.fn_config.read_bytes())
    except OSError as e:
        raise UsageError(f"cannot read --fn-config {args.fn_config}: {e.strerror}") from e
    except YamlError as e:
        raise UsageError(f"--fn-config {args.fn_config}: {e}") from e
    if not isinstance(value, dict) or not value.get("kind"):
        raise UsageError(f"--fn-config {args.fn_config}: not a KRM object")
    return value


def read_input(
    source: str, stdin: TextIO, skipped: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The items (and a ResourceList's own functionConfig) of DIR or stdin; what DIR held that
    was skipped (links, special files) is added to `skipped` when given."""
    if source != "-":
        try:
            return package.read(Path(source), skipped), None
        except package.PackageError as e:
            raise UsageError(str(e)) from e
    data = stdin.read()
    try:
        documents = [d for d in load_all(data) if d is not None]
        if len(documents) == 1 and isinstance(documents[0], dict) and documents[0].get("kind") == KIND:
            document = parse_resource_list(data.encode())
            return document["items"], document.get("functionConfig")
    except YamlError as e:
        raise UsageError(f"stdin: {e}") from e
    if not all(isinstance(d, dict) and d.get("kind") for d in documents):
        raise UsageError("stdin: expected a ResourceList or KRM resources")
    return documents, None


def write_results(
    directory: Path, *, what: dict[str, str], evaluation: Evaluation | None, error: str | None, exit_code: int
) -> None:
    entry: dict[str, Any] = {**what, "exitCode": exit_code}
    if evaluation is not None:
        if evaluation.log:
            entry["stderr"] = evaluation.log.decode(errors="replace")
        if evaluation.results:
            entry["results"] = [r.document() for r in evaluation.results]
    if error is not None:
        entry["error"] = error
    document = {
        "apiVersion": "kpt.dev/v1",
        "kind": "FunctionResultList",
        "metadata": {"name": "fnresults"},
        "exitCode": exit_code,
        "items": [entry],
    }
    directory.mkdir(parents=True, exist_ok=True)
    package.write_file(directory / RESULTS_FILE, dump(document))


def _code(exc: errors.KrmError) -> int:
    if isinstance(exc, errors.NotFound):
        return NOT_FOUND
    if isinstance(exc, errors.SystemError_):
        return UNAVAILABLE
    return FAILED


def exec_argv(command: str) -> list[str]:
    """`--exec`'s command line, its program found as a shell finds it: a name without a slash on
    PATH, a relative path from here (the function starts elsewhere, in a directory of its own);
    so are the arguments that name existing files."""
    argv = shlex.split(command)
    if not argv:
        raise errors.SystemError_("--exec names no program")
    if "/" not in argv[0]:
        found = shutil.which(argv[0])
        if found is None:
            raise errors.SystemError_(f"cannot start {argv[0]}: not found on PATH")
        argv[0] = found
    argv[0] = os.path.abspath(argv[0])
    # an argument naming a file here (`~/fns/label.js`, `fns/x.py`) names it absolute, as the
    # function starts elsewhere; the sandbox shows it that file's directory (runtime/binaries.py)
    for i, arg in enumerate(argv[1:], start=1):
        path = os.path.expanduser(arg)
        if not arg.startswith("-") and os.path.exists(path):
            argv[i] = os.path.abspath(path)
    return argv


async def _evaluate(
    args: argparse.Namespace, request: Request, runner: Callable[[bool], process.Runner] | None
) -> Evaluation:
    if args.runner is not None:
        from kruntimes.krm.client import RemoteEvaluator, runner_tls
        from kruntimes.sdk import config as clientconfig

        tls = runner_tls(args.runner, tls_dir=args.runner_tls, state_dir=clientconfig.state_dir())
        remote = RemoteEvaluator(args.runner, tls=tls)
        try:
            return await remote.evaluate(request)
        finally:
            await remote.close()
    store = Store(functions_dir=args.functions)
    executor = ExecEvaluator(store, runner=runner(args.network) if runner is not None else process.run)
    if args.exec_command is not None:
        return await executor.run(exec_argv(args.exec_command), request)
    if args.fn_configs is not None:
        DirectoryFeed(store, args.fn_configs).scan()
        for where, problem in store.errors().items():
            print(f"krt: warning: {where}: {problem}", file=sys.stderr)
    client = None
    if args.pods:
        from kruntimes.sdk.client import Client

        client = Client.from_config()
    pods = PodEvaluator(store, client=client, namespace=args.namespace)
    evaluator: Evaluator = MultiEvaluator([executor, pods])
    try:
        return await evaluator.evaluate(request)
    finally:
        await pods.close()  # its Runs end with this command
        if client is not None:
            await client.close()


def _report(
    err: TextIO, *, name: str, evaluation: Evaluation | None, error: errors.KrmError | None, seconds: float
) -> None:
    if error is None:
        err.write(f'[PASS] "{name}" in {seconds:.1f}s\n')
    else:
        err.write(f'[FAIL] "{name}" in {seconds:.1f}s: {error}\n')
    if evaluation is not None:
        for result in evaluation.results:
            where = ""
            if result.resourceRef is not None:
                where = f" {result.resourceRef.kind}/{result.resourceRef.name}"
            if result.field is not None:
                where += f" {result.field.path}"
            err.write(f"  [{result.severity.upper()}] {result.message}{where}\n")
        if error is not None and evaluation.log:
            tail = evaluation.log.decode(errors="replace").strip().splitlines()[-5:]
            for line in tail:
                err.write(f"  stderr: {line}\n")
    err.flush()


def main(
    argv: list[str],
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    runner: Callable[[bool], process.Runner] | None = None,
) -> int:
    """`krt fn eval`; `runner(network)` gives what runs the exec evaluator's processes, with the
    network or without (default: as this process's own user, `kruntimes.krm.process.run`)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    try:
        args, pairs = parse(argv)
        config = function_config(args, pairs)
        skipped: list[str] = []
        items, own_config = read_input(args.source, stdin, skipped)
    except UsageError as e:
        stderr.write(f"krt: {e}\n")
        return USAGE
    except errors.InputTooLarge as e:
        stderr.write(f"krt: {e}\n")
        return FAILED
    for path in skipped:
        stderr.write(f"krt: warning: {path}: skipped (a symbolic link or a special file: not followed)\n")
    document: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "items": items}
    if config or own_config:
        document["functionConfig"] = config or own_config
    name = args.image or args.exec_command
    what = {"image": args.image} if args.image else {"exec": args.exec_command}
    started = time.monotonic()
    evaluation: Evaluation | None = None
    failure: errors.KrmError | None = None
    try:
        data = dump(document).encode()
        if len(data) > MAX_RESOURCE_LIST_BYTES:
            raise errors.InputTooLarge(
                f"the ResourceList is {len(data)} bytes, over {MAX_RESOURCE_LIST_BYTES}"
            )
        image = args.image or "exec"
        request = Request.new(image=image, tag=args.tag, resource_list=data, timeout=args.timeout)
        evaluation = asyncio.run(_evaluate(args, request, runner))
    except errors.KrmError as e:
        failure = e
        evaluation = e.evaluation if isinstance(e, errors.ExecutionError) else None
    exit_code = OK if failure is None else _code(failure)
    _report(stderr, name=name, evaluation=evaluation, error=failure, seconds=time.monotonic() - started)
    if args.results_dir is not None:
        try:
            write_results(
                args.results_dir,
                what=what,
                evaluation=evaluation,
                error=None if failure is None else str(failure),
                # the function's own exit code when it ran and failed, else this command's
                exit_code=(evaluation.exit_code if evaluation is not None else 0) or exit_code,
            )
        except OSError as e:  # the package is left alone: nothing of this run is kept
            where = e.filename or args.results_dir
            stderr.write(f"krt: cannot write the results to {where}: {e.strerror or e}\n")
            return exit_code if failure is not None else FAILED
    if failure is not None or evaluation is None:
        return exit_code
    try:
        _write_output(args, parse_resource_list(evaluation.resource_list)["items"], stdout)
    except (package.PackageError, YamlError) as e:
        stderr.write(f"krt: cannot write the output: {e}\n")
        return FAILED
    return OK


def _write_output(args: argparse.Namespace, items: list[dict[str, Any]], stdout: TextIO) -> None:
    output = args.output or ("stdout" if args.source == "-" else None)
    if output == "stdout":
        stdout.write(dump({"apiVersion": API_VERSION, "kind": KIND, "items": items}))
    elif output == "unwrap":
        for item in items:
            package.strip(item)
        stdout.write(dump_all(items))
    elif output is None:
        package.write(Path(args.source), items, prune=True)
    else:
        package.write(Path(output), items, prune=False)
    stdout.flush()
