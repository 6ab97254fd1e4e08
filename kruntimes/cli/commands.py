"""The `krt` commands that talk to the platform, each a thin layer over the SDK (kruntimes.sdk.client).

Every command returns its exit code; errors are raised and mapped to one line by kruntimes.cli.main.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from kruntimes.api.function import Function, FunctionStatus
from kruntimes.api.manifest import manifest_from_dict
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import API_VERSION, KIND, ManifestError, Run, yaml_problem
from kruntimes.cli.components import name_what_is_missing
from kruntimes.cli.output import (
    RUN_COLUMNS,
    Progress,
    accepted_line,
    describe,
    describe_function,
    function_list_document,
    functions_table,
    host_document,
    hosts_table,
    invocation_list_document,
    invocations_table,
    reconcile_line,
    render,
    rollout_line,
    run_list_document,
    run_row,
    runs_table,
    schedules_table,
)
from kruntimes.cli.parser import NotKeyValue, UsageError, key_values
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import ConfigError, InvocationFailed, RunFailed, RunNotFound
from kruntimes.sdk.results import AsyncInvocation, FunctionObject, Invocation, InvokeResult, RunObject

GROUP = "run.kruntimes.io"
FUNCTION_GROUP = "function.kruntimes.io"


class Io:
    """Where a command writes (swapped in tests)."""

    def __init__(
        self, out: TextIO | None = None, err: TextIO | None = None, stdin: TextIO | None = None
    ) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.stdin = stdin or sys.stdin

    def print(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def load_config() -> ClientConfig:
    try:
        return clientconfig.load()
    except (OSError, ValueError) as e:
        where = clientconfig.state_dir() / clientconfig.CLIENT_FILE
        raise ConfigError(
            f"cannot read the client config {where}: {type(e).__name__}; run `krt up` again"
        ) from e


def _ns(args: argparse.Namespace) -> str:
    return str(args.namespace or "default")


# --- manifests ------------------------------------------------------------------------------------


def read_manifests(filename: str, *, namespace: str | None, stdin: TextIO) -> list[Run]:
    """The Runs of a YAML file (one or more documents), as `read_documents` reads them; a
    Function among them is a usage error (`krt apply -f` takes it)."""
    runs = []
    for document in read_documents(filename, namespace=namespace, stdin=stdin):
        if isinstance(document, Function):
            raise UsageError(
                f"{filename}: function {document.metadata.name!r} is a Function, not a Run; "
                "`krt apply -f` creates or updates it"
            )
        runs.append(document)
    return runs


def read_documents(filename: str, *, namespace: str | None, stdin: TextIO) -> list[Run | Function]:
    """The Runs and Functions of a YAML file (one or more documents, each by its kind); a relative
    source.path is taken from the file's directory, and ``namespace`` (-n) fills in or must match
    the manifest's."""
    if filename == "-":
        text, base, where = stdin.read(), Path.cwd(), "<stdin>"
    else:
        path = Path(filename)
        try:
            text = path.read_text()
        except OSError as e:
            raise UsageError(f"cannot read {filename}: {e.strerror or e}") from e
        base, where = path.resolve().parent, filename
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError([yaml_problem(e, where=where)]) from e
    if not documents:
        raise UsageError(f"{filename} holds no manifest")
    runs: list[Run | Function] = []
    for document in documents:
        if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
            metadata = dict(document["metadata"])
            given = metadata.get("namespace")
            if namespace is not None and given is not None and given != namespace:
                raise UsageError(
                    f"the manifest's namespace {given!r} does not match -n {namespace!r}; drop one of them"
                )
            if namespace is not None:
                metadata["namespace"] = namespace
            document = {**document, "metadata": metadata}
        if isinstance(document, dict) and isinstance(document.get("spec"), dict):
            source = document["spec"].get("source")
            if isinstance(source, dict) and isinstance(source.get("path"), str) and source["path"]:
                resolved = (base / source["path"]).resolve()
                document = {
                    **document,
                    "spec": {**document["spec"], "source": {**source, "path": str(resolved)}},
                }
        runs.append(manifest_from_dict(document))
    return runs


def parse_env(pairs: list[str]) -> dict[str, str]:
    try:
        return key_values(pairs)
    except NotKeyValue as e:
        raise UsageError(f"--env {e.item!r}: expected KEY=VALUE") from None


def manifest_from_flags(args: argparse.Namespace, *, stdin: TextIO) -> Run:
    missing = [
        flag
        for flag, value in (("NAME", args.name), ("--runtime", args.runtime), ("--source", args.source))
        + (("--handler", args.handler),)
        if value is None
    ]
    if missing:
        raise UsageError(
            f"the following arguments are required: {', '.join(missing)};"
            " or create the Run from a manifest (-f FILE); see `krt run create --help`"
        )
    source = Path(args.source)
    if not source.is_dir():
        raise UsageError(f"--source {args.source}: not a directory")
    kind = args.mode or "function"
    if kind == "task" and args.idle_timeout is not None:
        raise UsageError("--idle-timeout applies to --mode function only")
    if kind == "function" and args.input is not None:
        raise UsageError("--input applies to --mode task only (a function takes its input with each invoke)")
    mode: dict[str, Any] = {"task": {}}
    if args.input is not None:
        mode = {"task": {"input": json.loads(read_data(args.input, stdin=stdin, flag="--input") or b"null")}}
    taking = {"concurrency": args.concurrency, "queue": args.queue, "queueTimeoutSeconds": args.queue_timeout}
    if kind == "task" and any(v is not None for v in taking.values()):
        raise UsageError("--concurrency, --queue and --queue-timeout apply to --mode function only")
    if kind == "function":
        function: dict[str, Any] = {k: v for k, v in taking.items() if v is not None}
        if args.idle_timeout is not None:
            function["idleTimeoutSeconds"] = args.idle_timeout
        mode = {"function": function}
    spec: dict[str, Any] = {
        "runtime": args.runtime,
        "mode": mode,
        "source": {"path": str(source.resolve())},
        "handler": args.handler,
        "env": parse_env(args.env),
    }
    if args.timeout is not None:
        spec["timeoutSeconds"] = args.timeout
    if args.tenant:
        spec["tenant"] = args.tenant
    return Run.from_dict(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": args.name, "namespace": _ns(args)},
            "spec": spec,
        }
    )


def read_data(value: str | None, *, stdin: TextIO, flag: str = "--data") -> bytes | None:
    """--data (or --input): JSON text, @file, or @- (stdin); checked to be JSON before it is sent."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        name = value[1:]
        try:
            text = stdin.read() if name == "-" else Path(name).read_text()
        except OSError as e:
            raise UsageError(f"{flag} {value}: cannot read {name}: {e.strerror or e}") from e
    try:
        json.loads(text)
    except ValueError as e:
        raise UsageError(f"{flag} is not JSON: {e}") from e
    return text.encode()


# --- output ---------------------------------------------------------------------------------------


def print_runs(io: Io, runs: list[RunObject], output: str, *, single: bool) -> None:
    if output in ("table", "wide"):
        io.print(runs_table(runs, wide=output == "wide"))
    elif single and len(runs) == 1:
        io.print(render(runs[0].manifest(), output))
    else:
        io.print(render(run_list_document(runs), output))


async def wait_for(
    client: Client, run: Run, io: Io, *, timeout: float, until: RunPhase | None = None, output: str | None
) -> RunObject:
    name, namespace = run.metadata.name, run.metadata.namespace
    progress = Progress(io.err, label=f"run/{name}")
    # a Run long Pending on the embedded platform: say which component it waits for in vain
    naming = asyncio.ensure_future(name_what_is_missing(progress, client.config.stateDir))
    try:
        return await client.wait(name, namespace, until=until, timeout=timeout, on_status=progress)
    except RunFailed as e:
        if output in ("json", "yaml"):
            io.print(render(e.run.manifest(), output))
        raise
    finally:
        naming.cancel()
        progress.done()


# --- commands -------------------------------------------------------------------------------------


async def apply(args: argparse.Namespace, client: Client, io: Io) -> int:
    """`krt apply -f`: each Run created unless an identical one runs, each Function created or
    changed (`krt function apply -f`: Functions only)."""
    documents = read_documents(args.filename, namespace=args.namespace, stdin=io.stdin)
    only_functions = args.command == "function"
    if only_functions:
        runs = [d for d in documents if isinstance(d, Run)]
        if runs:
            raise UsageError(
                f"{args.filename}: run {runs[0].metadata.name!r} is a Run, not a Function; "
                "`krt apply -f` creates it"
            )
    results: list[RunObject | FunctionObject] = []
    for document in documents:
        if isinstance(document, Function):
            applied = await client.functions.apply(document)
            if args.output is None:
                io.print(f"{FUNCTION_GROUP}/{document.metadata.name} {applied.action}")
            results.append(applied.function)
        else:
            made = await client.apply(document)
            if args.output is None:
                io.print(f"{GROUP}/{document.metadata.name} {'created' if made.created else 'unchanged'}")
            results.append(made.run)
    if args.wait:
        results = [
            await wait_for_function(client, r, io, timeout=args.wait_timeout)
            if isinstance(r, FunctionObject)
            else await wait_for(client, r, io, timeout=args.wait_timeout, output=args.output)
            for r in results
        ]
    if args.output is not None:
        _print_objects(io, results, args.output, single=len(documents) == 1)
    return 0


def _print_objects(io: Io, objects: list[RunObject | FunctionObject], output: str, *, single: bool) -> None:
    runs = [o for o in objects if isinstance(o, RunObject)]
    if len(runs) == len(objects):
        print_runs(io, runs, output, single=single)
    elif single and len(objects) == 1:
        io.print(render(objects[0].manifest(), output))
    elif not runs:
        functions = [o for o in objects if isinstance(o, FunctionObject)]
        io.print(render(function_list_document(functions), output))
    else:
        io.print(
            render(
                {"apiVersion": API_VERSION, "kind": "List", "items": [o.manifest() for o in objects]}, output
            )
        )


async def wait_for_function(
    client: Client, function: FunctionObject, io: Io, *, timeout: float
) -> FunctionObject:
    """Wait until the Function is Ready, each change of where it is on stderr, one line each."""
    name, namespace = function.metadata.name, function.metadata.namespace
    said: list[str] = []

    def progress(status: FunctionStatus) -> None:
        line = rollout_line(name, status)
        if not said or said[-1] != line:
            said.append(line)
            io.note(line)

    return await client.functions.wait_ready(name, namespace, timeout=timeout, on_status=progress)


async def _from_manifests(args: argparse.Namespace, client: Client, io: Io) -> int:
    """`krt run create -f`: each Run is new."""
    runs = read_manifests(args.filename, namespace=args.namespace, stdin=io.stdin)
    results = []
    for run in runs:
        created = await client.create(run)
        if args.output is None:
            io.print(f"{GROUP}/{run.metadata.name} created")
        results.append(created)
    if args.wait:
        results = [
            await wait_for(client, r, io, timeout=args.wait_timeout, output=args.output) for r in results
        ]
    if args.output is not None:
        print_runs(io, results, args.output, single=len(runs) == 1)
    return 0


def _check_create_flags(args: argparse.Namespace) -> None:
    """-f takes the whole Run from its manifest: a flag that would also say it is refused."""
    if args.filename is None:
        return
    flags = (
        ("NAME", args.name),
        ("--runtime", args.runtime),
        ("--source", args.source),
        ("--handler", args.handler),
        ("--mode", args.mode),
        ("--input", args.input),
        ("--idle-timeout", args.idle_timeout),
        ("--timeout", args.timeout),
        ("--concurrency", args.concurrency),
        ("--queue", args.queue),
        ("--queue-timeout", args.queue_timeout),
        ("--env", args.env or None),
        ("--tenant", args.tenant),
    )
    given = [flag for flag, value in flags if value is not None]
    if given:
        raise UsageError(f"-f takes the Run from its manifest; drop {', '.join(given)} (or -f)")


async def run_create(args: argparse.Namespace, client: Client, io: Io) -> int:
    _check_create_flags(args)
    if args.filename is not None:
        return await _from_manifests(args, client, io)
    run = await client.create(manifest_from_flags(args, stdin=io.stdin))
    if args.output is None:
        io.print(f"{GROUP}/{run.metadata.name} created")
    if args.wait:
        run = await wait_for(client, run, io, timeout=args.wait_timeout, output=args.output)
        if args.output is None:
            io.print(runs_table([run]))
    if args.output is not None:
        print_runs(io, [run], args.output, single=True)
    return 0


async def run_get(args: argparse.Namespace, client: Client, io: Io) -> int:
    _check_watch(args)
    run = await client.get(args.name, _ns(args))
    if not args.watch:
        print_runs(io, [run], args.output, single=True)
        return 0

    async def read() -> list[RunObject]:
        try:
            return [await client.get(args.name, _ns(args))]
        except RunNotFound:
            io.note(f"run {args.name} is gone")
            raise _WatchOver from None

    return await watch(io, [run], read, output=args.output, timeout=args.timeout)


async def run_describe(args: argparse.Namespace, client: Client, io: Io) -> int:
    run = await client.get(args.name, _ns(args))
    io.print(describe(run, await client.events(args.name, _ns(args))))
    return 0


# --- watching -------------------------------------------------------------------------------------

WATCH_INTERVAL_S = 1.0  # how often a watch reads the Runs again


class _WatchOver(Exception):
    """What a watch reads is gone: it ends."""


def _check_watch(args: argparse.Namespace) -> None:
    if args.timeout is not None and not args.watch:
        raise UsageError("--timeout applies to --watch only")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be a positive number of seconds")


def _state(run: RunObject, output: str) -> object:
    """What a watch compares: the row without its age (a table), else the whole status."""
    if output in ("table", "wide"):
        row = run_row(run, wide=output == "wide")
        del row[RUN_COLUMNS.index("AGE")]
        return row
    return run.status


async def watch(
    io: Io,
    first: list[RunObject],
    read: Callable[[], Awaitable[list[RunObject]]],
    *,
    output: str,
    timeout: float | None,
) -> int:
    """kubectl's --watch: the Runs as they are, then each Run again whenever it changes (a row,
    or a document per Run: yaml separated by ---), until interrupted or ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    wide = output == "wide"
    headed = False  # a table's header comes with its first row, however late

    def show(runs: list[RunObject]) -> None:
        nonlocal headed
        if not runs:
            return
        if output in ("table", "wide"):
            io.print(runs_table(runs, header=not headed, wide=wide))
            headed = True
        else:
            for run in runs:
                io.print(("---\n" if output == "yaml" else "") + render(run.manifest(), output))

    seen = {(r.metadata.namespace, r.metadata.name): _state(r, output) for r in first}
    show(first)
    while deadline is None or time.monotonic() < deadline:
        left = WATCH_INTERVAL_S if deadline is None else deadline - time.monotonic()
        await asyncio.sleep(max(0.0, min(WATCH_INTERVAL_S, left)))
        if deadline is not None and time.monotonic() >= deadline:
            break
        try:
            runs = await read()
        except _WatchOver:
            return 0
        changed = []
        for run in runs:
            key, state = (run.metadata.namespace, run.metadata.name), _state(run, output)
            if seen.get(key) != state:
                seen[key] = state
                changed.append(run)
        show(changed)
    return 0


FIRST_PAGE = 20  # Runs of the first page of a table: on screen at once, the rest as it comes


async def run_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    """A table is printed a page of Runs at a time, newest first, as the pages come (the first
    at once, however many Runs there are); a document (-o json|yaml) once every page is read."""
    _check_watch(args)
    namespace = None if args.all_namespaces else _ns(args)
    if args.watch:
        runs = await client.list(namespace=namespace, phase=args.phase)
        if not runs:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            io.note(f"No runs found in {where}; watching.")

        async def read() -> list[RunObject]:
            return await client.list(namespace=namespace, phase=args.phase)

        return await watch(io, runs, read, output=args.output, timeout=args.timeout)
    if args.output in ("table", "wide"):
        printed = 0
        pages = client.pages(
            namespace=namespace, phase=args.phase, page_size=args.chunk_size, first_page_size=FIRST_PAGE
        )
        async for page in pages:
            io.print(runs_table(page, header=printed == 0, wide=args.output == "wide"))
            printed += len(page)
        if not printed:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            io.note(f"No runs found in {where}.")
        return 0
    runs = await client.list(namespace=namespace, phase=args.phase)
    print_runs(io, runs, args.output, single=False)
    return 0


async def run_wait(args: argparse.Namespace, client: Client, io: Io) -> int:
    run = await client.get(args.name, _ns(args))
    until = RunPhase(args.phase) if args.phase else None
    run = await wait_for(client, run, io, timeout=args.timeout, until=until, output=args.output)
    if args.output is None:
        io.print(f"{GROUP}/{run.metadata.name} {run.status.phase.value}")
    else:
        print_runs(io, [run], args.output, single=True)
    return 0


async def run_cancel(args: argparse.Namespace, client: Client, io: Io) -> int:
    await client.cancel(args.name, _ns(args))
    io.print(f"{GROUP}/{args.name} cancel requested")
    return 0


async def run_delete(args: argparse.Namespace, client: Client, io: Io) -> int:
    await client.delete(args.name, _ns(args), timeout=args.timeout, wait=args.wait)
    io.print(f"{GROUP}/{args.name} deleted")
    return 0


async def invoke(args: argparse.Namespace, client: Client, io: Io) -> int:
    data = read_data(args.data, stdin=io.stdin)
    _callback_needs_async(args)
    if args.async_:
        return await _submit(args, client, io, data, args.target, function=args.function)
    if args.function:
        answer = client.functions.invoke(
            args.target, data, namespace=_ns(args), invocation_id=args.invocation_id, timeout=args.timeout
        )
        return await _print_answer(args, io, answer)
    return await _print_answer(
        args,
        io,
        client.invoke(
            args.target, data, namespace=_ns(args), invocation_id=args.invocation_id, timeout=args.timeout
        ),
    )


async def _print_answer(args: argparse.Namespace, io: Io, answer: Awaitable[InvokeResult]) -> int:
    """An invocation's outputs as JSON (-o: the whole answer); a failed one's answer with -o too."""
    try:
        result = await answer
    except InvocationFailed as e:
        if args.output is not None:
            io.print(render(e.result.model_dump(mode="json"), args.output))
        raise
    if args.output is None:
        io.print(json.dumps(result.outputs, ensure_ascii=False))
    else:
        io.print(render(result.model_dump(mode="json"), args.output))
    return 0


# --- async invocations ----------------------------------------------------------------------------


async def _submit(
    args: argparse.Namespace, client: Client, io: Io, data: bytes | None, target: str, *, function: bool
) -> int:
    """`krt invoke --async`: the invocation's id and location once it is recorded."""
    accepted = await client.invoke_async(
        target,
        data,
        namespace=_ns(args),
        function=function,
        invocation_id=args.invocation_id,
        timeout=args.timeout,
        callback_url=args.callback,
    )
    _print_accepted(io, accepted, args.output)
    return 0


def _callback_needs_async(args: argparse.Namespace) -> None:
    if args.callback is not None and not args.async_:
        raise UsageError("--callback is for an async invocation: add --async (a sync invoke answers itself)")


def _print_accepted(io: Io, accepted: AsyncInvocation, output: str | None) -> None:
    if output is None:
        io.print(accepted_line(accepted))
    else:
        io.print(render(accepted.model_dump(mode="json"), output))


def _invocation_of(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's arguments naming one invocation: a target and an id, or a location URL alone."""
    is_url = args.target.startswith(("https://", "http://"))
    if args.id is None and not (is_url and "/invocations/" in args.target):
        raise UsageError("ID is required (or give the invocation's location URL as NAME)")
    return {"invocation_id": args.id, "namespace": _ns(args), "function": args.function}


def _print_invocations(io: Io, invocations: list[Invocation], output: str, *, single: bool) -> None:
    if output in ("table", "wide"):
        io.print(invocations_table(invocations, wide=output == "wide"))
    elif single and len(invocations) == 1:
        io.print(render(invocations[0].document(), output))
    else:
        io.print(render(invocation_list_document(invocations), output))


async def invocation_get(args: argparse.Namespace, client: Client, io: Io) -> int:
    invocation = await client.invocations.get(args.target, **_invocation_of(args))
    _print_invocations(io, [invocation], args.output, single=True)
    return 0


async def invocation_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    found = [
        i
        async for i in client.invocations.list(
            args.target,
            state=args.state,
            namespace=_ns(args),
            function=args.function,
            limit=args.limit,
            page_size=min(args.limit, 100),
        )
    ]
    if args.output in ("table", "wide") and not found:
        which = f"{args.state} invocations" if args.state else "invocations"
        io.note(f"No {which} found for {args.target}.")
        return 0
    _print_invocations(io, found, args.output, single=False)
    return 0


async def invocation_wait(args: argparse.Namespace, client: Client, io: Io) -> int:
    """Until the invocation ends: 0 if it Succeeded, 1 if it Failed or its outcome is Unknown."""
    invocation = await client.invocations.wait(args.target, timeout=args.timeout, **_invocation_of(args))
    if args.output is None:
        error = invocation.error
        why = (
            f": {error.reason}" + (f": {error.message}" if error.message else "") if error is not None else ""
        )
        io.print(f"invocation/{invocation.invocationId} {invocation.state.value}{why}")
        answer = invocation.answer()
        if answer is not None and invocation.ok:  # its outputs, as `krt invoke` prints them
            io.print(json.dumps(answer.outputs, ensure_ascii=False))
    else:
        _print_invocations(io, [invocation], args.output, single=True)
    return 0 if invocation.ok else 1


async def invocation_resubmit(args: argparse.Namespace, client: Client, io: Io) -> int:
    accepted = await client.invocations.resubmit(args.target, new_id=args.new_id, **_invocation_of(args))
    _print_accepted(io, accepted, args.output)
    return 0


async def hosts_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    views = await client.hosts()
    if args.output == "table":
        if not views:
            io.note("No hosts found.")
        else:
            io.print(hosts_table(views))
    else:
        io.print(render({"kind": "HostList", "items": [host_document(v) for v in views]}, args.output))
    return 0


def secret_command(args: argparse.Namespace, io: Io) -> int:
    """`krt secret create|list|delete`: the embedded store in the state directory (no Temporal)."""
    from kruntimes.config import secret_store as secrets

    state = Path(load_config().stateDir)
    namespace = args.namespace or "default"
    try:
        if args.verb == "create":
            values: dict[str, bytes] = {}
            for item in args.from_literal:
                key, sep, value = item.partition("=")
                if not sep:
                    raise UsageError(f"--from-literal takes KEY=VALUE, not {key[:40]!r}")
                values[key] = value.encode()
            for item in args.from_file:
                key, sep, path = item.partition("=")
                if not sep:
                    raise UsageError(f"--from-file takes KEY=PATH, not {key[:40]!r}")
                values[key] = Path(path).expanduser().read_bytes()
            secrets.create(state, namespace=namespace, name=args.name, values=values)
            io.note(f"secret {args.name} created in namespace {namespace} ({len(values)} key(s))")
        elif args.verb == "list":
            found = secrets.names(state, namespace=namespace)
            if not found:
                io.note("No secrets found.")
            for name, keys in found:
                io.print(f"{name}\t{','.join(keys)}")
        elif not secrets.delete(state, namespace=namespace, name=args.name):
            io.note(f"no secret {args.name} in namespace {namespace}")
            return 3
    except (secrets.SecretError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    return 0


def _requested_by() -> str:
    """Who asks (the local user name), recorded with a host action in its history."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


async def hosts_act(args: argparse.Namespace, client: Client, io: Io) -> int:
    act = client.drain_host if args.verb == "drain" else client.delete_host
    result = await act(args.name, runtime=args.runtime, message=args.message, requested_by=_requested_by())
    if args.output is not None:
        io.print(render(result.model_dump(mode="json"), args.output))
    else:
        done = f"{'' if result.accepted else 'not '}{args.verb}ed"
        io.print(f"host {result.hostId} ({result.runtime}): {done}, {result.state}: {result.message}")
    return 0 if result.accepted else 1


async def queue_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    view = await client.queue(args.runtime)
    if args.output is not None:
        io.print(render(view.model_dump(mode="json"), args.output))
        return 0
    who = f" by {view.by}" if view.by else ""
    state = f"paused{who}" if view.paused else "admitting"
    why = f": {view.message}" if view.message else ""
    io.print(f"runtime {view.runtime}: {state}, {len(view.queued)} queued{why}")
    for queued in view.queued:
        io.print(f"{queued.workflowId}\t{queued.tenant or '-'}\t{queued.requestedAt.isoformat()}")
    return 0


async def queue_act(args: argparse.Namespace, client: Client, io: Io) -> int:
    act = {"pause": client.pause_queue, "resume": client.resume_queue, "drain": client.drain_queue}[args.verb]
    result = await act(args.runtime, message=args.message, requested_by=_requested_by())
    if args.output is not None:
        io.print(render(result.model_dump(mode="json"), args.output))
    else:
        done = {"pause": "paused", "resume": "resumed", "drain": "drained"}[args.verb]
        state = "paused" if result.paused else "admitting"
        io.print(f"runtime {result.runtime}: {done} ({state}, {result.queued} queued)")
    return 0


async def hosts_reconcile(args: argparse.Namespace, client: Client, io: Io) -> int:
    reports = await client.reconcile(args.runtime)
    if args.output is not None:
        io.print(
            render(
                {"kind": "ReconcileReportList", "items": [r.model_dump(mode="json") for r in reports]},
                args.output,
            )
        )
    else:
        for report in reports:
            io.print(reconcile_line(report))
    return 1 if any(r.errors for r in reports) else 0


def config_view(args: argparse.Namespace, io: Io) -> int:
    """The effective client configuration; its secrets only with --raw (as `kubectl config view`)."""
    config = load_config()
    io.print(render(config.model_dump(mode="json") if args.raw else config.redacted(), args.output))
    return 0


# --- schedules ------------------------------------------------------------------------------------


async def schedule_create(args: argparse.Namespace, client: Client, io: Io) -> int:
    from kruntimes.sdk.schedules import check_cron, parse_duration

    namespace = _ns(args)
    cron = check_cron(args.cron) if args.cron is not None else None
    every = parse_duration(args.every) if args.every is not None else None
    runs = read_manifests(args.filename, namespace=namespace, stdin=io.stdin)
    if len(runs) != 1:
        raise UsageError(f"{args.filename}: want one task Run manifest, found {len(runs)}")
    view = await client.schedules.create(
        args.name,
        runs[0],
        namespace=namespace,
        cron=cron,
        every=every,
        overlap=args.overlap,
        paused=args.paused,
        note=args.message,
    )
    if args.output is None:
        io.print(f"schedule/{view.name} created" + (" (paused)" if view.paused else ""))
    else:
        io.print(render(view.document(), args.output))
    return 0


async def schedule_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    namespace = None if args.all_namespaces else _ns(args)
    views = await client.schedules.list(namespace)
    if args.output == "table":
        if views:
            io.print(schedules_table(views))
        else:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            io.note(f"No schedules found in {where}.")
    else:
        io.print(render({"kind": "ScheduleList", "items": [v.document() for v in views]}, args.output))
    return 0


async def schedule_get(args: argparse.Namespace, client: Client, io: Io) -> int:
    view = await client.schedules.get(args.name, _ns(args))
    io.print(schedules_table([view]) if args.output == "table" else render(view.document(), args.output))
    return 0


async def schedule_act(args: argparse.Namespace, client: Client, io: Io) -> int:
    name, namespace = args.name, _ns(args)
    schedules = client.schedules
    if args.verb == "pause":
        await schedules.pause(name, namespace, note=args.message)
    elif args.verb == "unpause":
        await schedules.unpause(name, namespace, note=args.message)
    elif args.verb == "trigger":
        await schedules.trigger(name, namespace)
    else:
        await schedules.delete(name, namespace)
    done = {"pause": "paused", "unpause": "unpaused", "trigger": "triggered", "delete": "deleted"}
    io.print(f"schedule/{name} {done[args.verb]}")
    return 0


# --- Functions ------------------------------------------------------------------------------------


def print_functions(io: Io, functions: list[FunctionObject], output: str, *, single: bool) -> None:
    if output in ("table", "wide"):
        io.print(functions_table(functions, wide=output == "wide"))
    elif single and len(functions) == 1:
        io.print(render(functions[0].manifest(), output))
    else:
        io.print(render(function_list_document(functions), output))


async def function_get(args: argparse.Namespace, client: Client, io: Io) -> int:
    print_functions(io, [await client.functions.get(args.name, _ns(args))], args.output, single=True)
    return 0


async def function_list(args: argparse.Namespace, client: Client, io: Io) -> int:
    namespace = None if args.all_namespaces else _ns(args)
    functions = await client.functions.list(namespace)
    if args.output in ("table", "wide") and not functions:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        io.note(f"No functions found in {where}.")
        return 0
    print_functions(io, functions, args.output, single=False)
    return 0


async def function_describe(args: argparse.Namespace, client: Client, io: Io) -> int:
    io.print(describe_function(await client.functions.describe(args.name, _ns(args))))
    return 0


async def function_delete(args: argparse.Namespace, client: Client, io: Io) -> int:
    await client.functions.delete(args.name, _ns(args), timeout=args.timeout, wait=args.wait)
    io.print(f"{FUNCTION_GROUP}/{args.name} deleted")
    return 0


async def function_invoke(args: argparse.Namespace, client: Client, io: Io) -> int:
    data = read_data(args.data, stdin=io.stdin)
    _callback_needs_async(args)
    if args.async_:
        return await _submit(args, client, io, data, args.name, function=True)
    answer = client.functions.invoke(
        args.name, data, namespace=_ns(args), invocation_id=args.invocation_id, timeout=args.timeout
    )
    return await _print_answer(args, io, answer)


async def function_rollback(args: argparse.Namespace, client: Client, io: Io) -> int:
    function = await client.functions.rollback(args.name, _ns(args))
    if args.output is None:
        io.print(f"{FUNCTION_GROUP}/{args.name} rolled back: revision {function.status.revision}")
    if args.wait:
        function = await wait_for_function(client, function, io, timeout=args.wait_timeout)
    if args.output is not None:
        io.print(render(function.manifest(), args.output))
    return 0


async def function_scale(args: argparse.Namespace, client: Client, io: Io) -> int:
    scaled = await client.functions.scale(args.name, args.replicas, _ns(args), reason=args.message)
    io.print(f"{FUNCTION_GROUP}/{args.name} scaled: {scaled.previous} -> {scaled.wanted} replicas")
    return 0


async def rollout_status(args: argparse.Namespace, client: Client, io: Io) -> int:
    """`krt rollout status function/NAME`: each change of the rollout on a line, until done."""
    name = args.name
    if not args.watch:
        io.print(rollout_line(name, await client.functions.rollout_status(name, _ns(args), wait=False)))
        return 0
    said: list[str] = []

    def progress(status: FunctionStatus) -> None:
        line = rollout_line(name, status)
        if not said or said[-1] != line:
            said.append(line)
            io.print(line)

    await client.functions.rollout_status(name, _ns(args), timeout=args.timeout, on_status=progress)
    return 0


Command = Callable[[argparse.Namespace, Client, Io], Awaitable[int]]
COMMANDS: dict[tuple[str, str | None], Command] = {
    ("apply", None): apply,
    ("run", "create"): run_create,
    ("run", "get"): run_get,
    ("run", "describe"): run_describe,
    ("run", "list"): run_list,
    ("run", "wait"): run_wait,
    ("run", "cancel"): run_cancel,
    ("run", "delete"): run_delete,
    ("invoke", None): invoke,
    ("invocation", "get"): invocation_get,
    ("invocation", "list"): invocation_list,
    ("invocation", "wait"): invocation_wait,
    ("invocation", "resubmit"): invocation_resubmit,
    ("function", "apply"): apply,
    ("function", "get"): function_get,
    ("function", "list"): function_list,
    ("function", "describe"): function_describe,
    ("function", "delete"): function_delete,
    ("function", "invoke"): function_invoke,
    ("function", "rollback"): function_rollback,
    ("function", "scale"): function_scale,
    ("rollout", "status"): rollout_status,
    ("hosts", "list"): hosts_list,
    ("hosts", "drain"): hosts_act,
    ("hosts", "delete"): hosts_act,
    ("hosts", "reconcile"): hosts_reconcile,
    ("queue", "list"): queue_list,
    ("queue", "pause"): queue_act,
    ("queue", "resume"): queue_act,
    ("queue", "drain"): queue_act,
    ("schedule", "create"): schedule_create,
    ("schedule", "list"): schedule_list,
    ("schedule", "get"): schedule_get,
    ("schedule", "pause"): schedule_act,
    ("schedule", "unpause"): schedule_act,
    ("schedule", "trigger"): schedule_act,
    ("schedule", "delete"): schedule_act,
}


async def dispatch(args: argparse.Namespace, io: Io | None = None) -> int:
    io = io or Io()
    if args.command == "config":
        return config_view(args, io)
    if args.command == "secret":
        return secret_command(args, io)
    if args.command == "ui":
        from kruntimes.cli.ui import open_ui

        return open_ui(load_config(), io, browse=args.open)
    command = COMMANDS[(args.command, getattr(args, "verb", None))]
    async with Client.from_config(load_config(), creator_kind="cli") as client:
        return await command(args, client, io)
