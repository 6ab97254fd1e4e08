"""The `krt` argument grammar (argparse), kubectl-style: `krt <noun> <verb> NAME [-n NS] [-o FORMAT]`.

A usage error raises UsageError with one line (argparse's own would print the whole usage).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import NoReturn

from kruntimes.api.phases import RunPhase

OUTPUTS = ("table", "json", "yaml")
TABLES = ("table", "wide", "json", "yaml")  # what lists a Run a row: -o wide adds columns
# Commands handed their arguments as they are: entry points of workers/.
PASSTHROUGH = {
    "up": "start the embedded platform (Temporal, worker, gateway, hosts)",
    "down": "stop the embedded platform",
    "status": "show what the embedded platform runs",
    "host": "run a runtime host (the Runtime Server)",
    "install-host": "install the runtime host into a directory (a host pod's init container)",
    "worker": "run the Temporal worker",
    "demo": "run the end-to-end demo",
    "fn": "evaluate a KRM function on a package: krt fn eval DIR --image IMG",
    "fn-runner": "serve the KRM FunctionEvaluator (gRPC)",
    "mcp": "serve the control plane as MCP tools for an agent (stdio, or HTTPS with --listen)",
    "gateway": "run the HTTPS invoke gateway",
    "codec-server": "serve the Temporal codec server protocol with the payload keys",
    "pki": "the platform's certificates on a cluster: krt pki init-cluster (the chart's hook Job)",
}


class UsageError(Exception):
    """The command line is wrong; the message says how, in one line."""


class NotKeyValue(ValueError):
    """An argument that is not KEY=VALUE: it has no '=', or nothing before it."""

    def __init__(self, item: str) -> None:
        super().__init__(item)
        self.item = item


def key_values(items: Iterable[str]) -> dict[str, str]:
    """KEY=VALUE arguments as a mapping, each split at its first '=' (so a value may be empty or
    hold '=' itself); a later KEY replaces an earlier one. NotKeyValue for the first that is not
    KEY=VALUE; each command says in its own words which argument it was."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise NotKeyValue(item)
        pairs[key] = value
    return pairs


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be within 1..1000")
    return value


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def _namespace(parser: argparse.ArgumentParser, *, what: str = "Run") -> None:
    # None: not given (apply then keeps the manifest's namespace); commands default to "default".
    parser.add_argument("-n", "--namespace", help=f"the {what}'s namespace (default: default)")


def _output(
    parser: argparse.ArgumentParser, *, default: str | None = "table", choices: tuple[str, ...] = OUTPUTS
) -> None:
    parser.add_argument("-o", "--output", choices=choices, default=default, help="output format")


def _wait(
    parser: argparse.ArgumentParser, *, what: str = "the Run is Ready (function) or Succeeded (task)"
) -> None:
    parser.add_argument("--wait", action="store_true", help=f"wait until {what}")
    parser.add_argument(
        "--wait-timeout", type=float, default=120.0, metavar="S", help="give up waiting after S seconds"
    )


def _watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w", "--watch", action="store_true", help="after printing, print each change until interrupted"
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="with --watch: stop watching after S seconds (exit 0)"
    )


def build() -> Parser:
    parser = Parser(
        prog="krt",
        description="kruntimes: run functions on a pool of runtime hosts.",
        epilog="Exit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found, 4 platform not reachable.",
    )
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    apply = commands.add_parser(
        "apply",
        help="create Runs and create or update Functions from manifests (unchanged ones are left alone)",
    )
    apply.add_argument("-f", "--filename", required=True, help="a YAML manifest file, or - for stdin")
    _namespace(apply)
    _output(apply, default=None)
    _wait(apply)

    run = commands.add_parser(
        "run", help="create, get, list, describe, watch, wait for, cancel and delete Runs"
    )
    verbs = run.add_subparsers(dest="verb", metavar="<verb>", required=True)
    create = verbs.add_parser(
        "create", help="create a Run from a source directory, or from manifests (-f, as kubectl create -f)"
    )
    create.add_argument("name", nargs="?", help="the Run's name (not with -f)")
    create.add_argument(
        "-f", "--filename", help="a YAML manifest file, or - for stdin (`krt apply -f` leaves unchanged ones)"
    )
    create.add_argument("--runtime", help="the runtime, e.g. python or bash")
    create.add_argument("--source", metavar="DIR", help="the directory holding the code")
    create.add_argument("--handler", help="module:function (python) or a script (bash)")
    create.add_argument("--mode", choices=("function", "task"))
    create.add_argument(
        "--input",
        metavar="JSON|@FILE",
        help="--mode task: what the handler is called with (JSON, @file, or @- for stdin)",
    )
    create.add_argument(
        "--idle-timeout", type=int, metavar="S", help="function mode: end after S idle seconds"
    )
    create.add_argument("--timeout", type=int, metavar="S", help="end the Run S seconds after it started")
    create.add_argument(
        "--concurrency", type=int, metavar="N", help="function mode: invocations running at once (default 1)"
    )
    create.add_argument(
        "--queue", type=int, metavar="N", help="function mode: invocations waiting their turn (default none)"
    )
    create.add_argument(
        "--queue-timeout", type=float, metavar="S", help="function mode: how long one waits at most"
    )
    create.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable")
    create.add_argument("--tenant", help="the tenant whose capacity the Run uses")
    _namespace(create)
    _output(create, default=None)
    _wait(create)

    get = verbs.add_parser("get", help="show one Run")
    get.add_argument("name")
    _namespace(get)
    _output(get, choices=TABLES)
    _watch(get)

    describe = verbs.add_parser(
        "describe", help="show one Run in words: its status, conditions and events (no secret values)"
    )
    describe.add_argument("name")
    _namespace(describe)

    listing = verbs.add_parser("list", help="list the Runs of a namespace")
    _namespace(listing)
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    listing.add_argument("--phase", choices=[p.value for p in RunPhase], help="only Runs in this phase")
    listing.add_argument(
        "--chunk-size",
        type=_page_size,
        default=100,
        help="Runs read and printed at a time (a table comes page by page, newest first)",
    )
    _output(listing, choices=TABLES)
    _watch(listing)

    wait = verbs.add_parser("wait", help="wait until a Run reaches a phase")
    wait.add_argument("name")
    wait.add_argument(
        "--for", dest="phase", choices=[p.value for p in RunPhase], help="default: Ready/Succeeded"
    )
    wait.add_argument("--timeout", type=float, default=120.0, metavar="S")
    _namespace(wait)
    _output(wait, default=None)

    cancel = verbs.add_parser(
        "cancel", help="stop a Run (it stays listed until deleted or its ttlSecondsAfterFinished is out)"
    )
    cancel.add_argument("name")
    _namespace(cancel)

    delete = verbs.add_parser("delete", help="cancel a Run if needed, clean it up and remove it")
    delete.add_argument("name")
    _delete_flags(delete, listed="krt run list")
    _namespace(delete)

    _functions(commands)

    invoke = commands.add_parser(
        "invoke", help="invoke a Ready function Run (or with --function a Function) once through the gateway"
    )
    invoke.add_argument("target", metavar="NAME", help="the Run's name, or its invoke URL")
    _invoke_flags(invoke)
    invoke.add_argument("--function", action="store_true", help="NAME is a Function's, not a Run's")
    _namespace(invoke)
    _output(invoke, default=None, choices=("json", "yaml"))

    _invocations(commands)

    hosts = commands.add_parser("hosts", help="list, drain and delete the runtime hosts; collect orphans")
    host_verbs = hosts.add_subparsers(dest="verb", metavar="<verb>", required=True)
    _output(host_verbs.add_parser("list", help="list the runtime hosts"))
    for verb, text in (
        ("drain", "take no new Run on a host and move its Runs off it; it is deleted once empty"),
        ("delete", "stop a host now; its Runs register elsewhere once it is gone"),
    ):
        action = host_verbs.add_parser(verb, help=text)
        action.add_argument("name", help="the host, as `krt hosts list` names it")
        action.add_argument("--runtime", help="the host's runtime (when the name is in several)")
        action.add_argument("-m", "--message", default="", help="why (kept in the host's history)")
        _output(action, default=None, choices=("json", "yaml"))
    reconcile = host_verbs.add_parser("reconcile", help="collect orphans now and show what was repaired")
    reconcile.add_argument("--runtime", help="only this runtime (default: every runtime)")
    _output(reconcile, default=None, choices=("json", "yaml"))

    queue = commands.add_parser("queue", help="read a runtime's queue; pause, resume or drain its admission")
    queue_verbs = queue.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for verb, text in (
        ("list", "the runtime's queued Runs, FIFO, and whether its admission is paused"),
        ("pause", "new Runs queue and none is placed until resumed"),
        ("resume", "admit again: the queued Runs are placed, scaled out for, or rejected"),
        ("drain", "end the queued Runs (reason QueueDrained, with the message)"),
    ):
        action = queue_verbs.add_parser(verb, help=text)
        action.add_argument("runtime", metavar="RUNTIME")
        if verb != "list":
            action.add_argument("-m", "--message", default="", help="why (kept in the pool's history)")
        _output(action, default=None, choices=("json", "yaml"))

    schedule = commands.add_parser("schedule", help="start a task Run on a cron expression or an interval")
    schedule_verbs = schedule.add_subparsers(dest="verb", metavar="<verb>", required=True)
    create_schedule = schedule_verbs.add_parser(
        "create", help="create a schedule; each start is a task Run named NAME-<yyyymmddhhmmss>"
    )
    create_schedule.add_argument("name")
    when = create_schedule.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--cron",
        metavar="EXPR",
        help="a cron expression (UTC): 5 fields, e.g. '0 3 * * *'; 6 with a year; 7 with a second first,"
        " e.g. '*/30 * * * * * *'; or @hourly, @daily, ...",
    )
    when.add_argument("--every", metavar="DURATION", help="a fixed interval, e.g. 30s, 5m, 1h30m, 2d")
    create_schedule.add_argument("-f", "--filename", required=True, help="the task Run's manifest, or -")
    create_schedule.add_argument(
        "--overlap",
        choices=("skip", "buffer-one", "allow-all"),
        default="skip",
        help="a start while the last Run still runs: skip it (default), keep one for later, or start it",
    )
    create_schedule.add_argument("--paused", action="store_true", help="create it paused")
    create_schedule.add_argument("-m", "--message", default="", help="a note shown with the schedule")
    _namespace(create_schedule)
    _output(create_schedule, default=None)
    list_schedules = schedule_verbs.add_parser("list", help="list the schedules")
    _namespace(list_schedules)
    list_schedules.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    _output(list_schedules)
    for verb, text in (
        ("get", "show one schedule"),
        ("pause", "start no Run until unpaused"),
        ("unpause", "start Runs again"),
        ("trigger", "start one Run now (the overlap policy applies)"),
        ("delete", "delete the schedule (its Runs are left as they are)"),
    ):
        action = schedule_verbs.add_parser(verb, help=text)
        action.add_argument("name")
        _namespace(action)
        if verb == "get":
            _output(action)
        if verb in ("pause", "unpause"):
            action.add_argument("-m", "--message", default="", help="why (the schedule's note)")

    secret = commands.add_parser(
        "secret", help="secrets a Run's envFrom names (the embedded platform's store)"
    )
    secret_verbs = secret.add_subparsers(dest="verb", metavar="<verb>", required=True)
    create_secret = secret_verbs.add_parser("create", help="create or replace a secret")
    create_secret.add_argument("name")
    create_secret.add_argument(
        "--from-literal", action="append", default=[], metavar="KEY=VALUE", help="a key and its value"
    )
    create_secret.add_argument(
        "--from-file",
        action="append",
        default=[],
        metavar="KEY=PATH",
        help="a key and a file holding its value",
    )
    _namespace(create_secret)
    list_secrets = secret_verbs.add_parser("list", help="list the secrets (names and keys, never values)")
    _namespace(list_secrets)
    delete_secret = secret_verbs.add_parser("delete", help="delete a secret")
    delete_secret.add_argument("name")
    _namespace(delete_secret)

    config = commands.add_parser("config", help="the client configuration")
    config_verbs = config.add_subparsers(dest="verb", metavar="<verb>", required=True)
    view = config_verbs.add_parser(
        "view", help="print the effective configuration (the token and API key as REDACTED)"
    )
    _output(view, default="yaml", choices=("json", "yaml"))
    view.add_argument("--raw", action="store_true", help="print the token and the API key too")

    ui = commands.add_parser(
        "ui", help="a one-time login link to the embedded platform's Temporal UI (decoded payloads)"
    )
    ui.add_argument("--open", action="store_true", help="open the link in a browser too")

    for name, text in PASSTHROUGH.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


def _invoke_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", "-d", metavar="JSON|@FILE", help="the JSON payload, @file, or @- for stdin")
    parser.add_argument(
        "--invocation-id",
        "--id",
        metavar="ID",
        help="the id echoed back (default: a new uuid); with --async it runs once per id",
    )
    parser.add_argument("--timeout", type=float, metavar="S", help="the invocation timeout in seconds")
    parser.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="answer once the invocation is recorded (202), before it runs: print its id and location "
        "(`krt invocation get|wait` it)",
    )
    parser.add_argument(
        "--callback",
        metavar="URL",
        help="with --async: POST the invocation's status to this https URL when it ends, in place of "
        "the target's callback (its origin must be one the gateway allows the namespace)",
    )


INVOCATION_STATES = ("Queued", "Running", "Succeeded", "Failed", "Unknown")


def _invocation_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="NAME", help="the Run's name (a Function's with --function), or its invoke URL"
    )
    parser.add_argument("--function", action="store_true", help="NAME is a Function's, not a Run's")
    _namespace(parser, what="Run's or Function")


def _invocations(commands: argparse._SubParsersAction[Parser]) -> None:
    """`krt invocation get|list|wait|resubmit`: a Run's or a Function's async invocations."""
    invocation = commands.add_parser(
        "invocation", help="get, list, wait for and resubmit async invocations (krt invoke --async)"
    )
    verbs = invocation.add_subparsers(dest="verb", metavar="<verb>", required=True)
    get = verbs.add_parser("get", help="show one invocation: its state, attempts, result or error")
    _invocation_target(get)
    get.add_argument("id", metavar="ID", nargs="?", help="the invocation id (not with a location URL)")
    _output(get, choices=TABLES)

    listing = verbs.add_parser("list", help="list a target's invocations still remembered, newest first")
    _invocation_target(listing)
    listing.add_argument(
        "--state", choices=INVOCATION_STATES, help="only these (Failed, Unknown: the dead letters)"
    )
    listing.add_argument(
        "--limit", type=_page_size, default=100, metavar="N", help="list at most N (1..1000; default 100)"
    )
    _output(listing, choices=TABLES)

    wait = verbs.add_parser(
        "wait", help="wait until an invocation ends; exit 0 if it Succeeded, 1 if it Failed or is Unknown"
    )
    _invocation_target(wait)
    wait.add_argument("id", metavar="ID", nargs="?", help="the invocation id (not with a location URL)")
    wait.add_argument("--timeout", type=float, default=120.0, metavar="S", help="give up after S seconds")
    _output(wait, default=None, choices=TABLES)

    resubmit = verbs.add_parser(
        "resubmit", help="submit an invocation's body again under a new id (a failed one, say)"
    )
    _invocation_target(resubmit)
    resubmit.add_argument("id", metavar="ID", nargs="?", help="the invocation id (not with a location URL)")
    resubmit.add_argument("--new-id", metavar="ID", help="the new invocation's id (default: a new uuid)")
    _output(resubmit, default=None, choices=("json", "yaml"))


def _delete_flags(parser: argparse.ArgumentParser, *, listed: str) -> None:
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="give up after S seconds")
    parser.add_argument(
        "--wait",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help=f"return once `{listed}` no longer shows it (default: true)",
    )


ROLLOUT_KINDS = ("function/", "functions/", "function.kruntimes.io/")


def _function_target(text: str) -> str:
    """`krt rollout status`'s TYPE/NAME, kubectl's way: the Function's name."""
    kind = next((k for k in ROLLOUT_KINDS if text.startswith(k)), None)
    if kind is None or not text.removeprefix(kind):
        raise argparse.ArgumentTypeError(f"expected function/NAME, not {text[:80]!r}")
    return text.removeprefix(kind)


def _functions(commands: argparse._SubParsersAction[Parser]) -> None:
    """`krt function ...` and `krt rollout status function/NAME`."""
    function = commands.add_parser(
        "function",
        help="apply, get, list, describe, invoke, scale, roll back, delete Functions (replicas, one URL)",
    )
    verbs = function.add_subparsers(dest="verb", metavar="<verb>", required=True)
    apply = verbs.add_parser("apply", help="create or update Functions from manifests (as `krt apply -f`)")
    apply.add_argument("-f", "--filename", required=True, help="a YAML manifest file, or - for stdin")
    _namespace(apply, what="Function")
    _output(apply, default=None)
    _wait(apply, what="the Function is Ready (every wanted replica of its revision)")

    get = verbs.add_parser("get", help="show one Function")
    get.add_argument("name")
    _namespace(get, what="Function")
    _output(get, choices=TABLES)

    listing = verbs.add_parser("list", help="list the Functions of a namespace")
    _namespace(listing, what="Function")
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    _output(listing, choices=TABLES)

    describe = verbs.add_parser(
        "describe", help="show one Function in words: replicas, revision, endpoint, conditions, each replica"
    )
    describe.add_argument("name")
    _namespace(describe, what="Function")

    delete = verbs.add_parser("delete", help="delete a Function: its replicas are drained and deleted")
    delete.add_argument("name")
    _delete_flags(delete, listed="krt function list")
    _namespace(delete, what="Function")

    invoke = verbs.add_parser(
        "invoke", help="invoke a Function once through the gateway (one of its replicas)"
    )
    invoke.add_argument("name")
    _invoke_flags(invoke)
    _namespace(invoke, what="Function")
    _output(invoke, default=None, choices=("json", "yaml"))

    rollback = verbs.add_parser(
        "rollback", help="return to the previous revision's template, as a new revision"
    )
    rollback.add_argument("name")
    _namespace(rollback, what="Function")
    _output(rollback, default=None)
    _wait(rollback, what="the new revision is rolled out")

    scale = verbs.add_parser("scale", help="set the replicas wanted, within the Function's scale.min..max")
    scale.add_argument("name")
    scale.add_argument("--replicas", type=int, required=True, metavar="N", help="replicas wanted")
    scale.add_argument("-m", "--message", default="", help="why (kept in the Function's history)")
    _namespace(scale, what="Function")

    rollout = commands.add_parser(
        "rollout", help="follow a Function's rollout: krt rollout status function/NAME"
    )
    rollout_verbs = rollout.add_subparsers(dest="verb", metavar="<verb>", required=True)
    status = rollout_verbs.add_parser(
        "status", help="wait until the Function's current revision is rolled out (every wanted replica Ready)"
    )
    status.add_argument("name", type=_function_target, metavar="function/NAME")
    _namespace(status, what="Function")
    status.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds")
    status.add_argument(
        "-w",
        "--watch",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="wait for the rollout to finish (default: true; false: print where it is and exit)",
    )


def parse(argv: list[str]) -> argparse.Namespace:
    return build().parse_args(argv)
