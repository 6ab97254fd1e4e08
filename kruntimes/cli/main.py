"""`krt`: the kruntimes command line, in the conventions of kubectl, kn and fission.

    krt apply -f run.yaml                 krt run create NAME --runtime R --source DIR --handler H
    krt run create -f run.yaml            krt run get|list [-o wide] [--watch]
    krt run describe|wait|cancel|delete   krt invoke NAME --data JSON|@file [--async [--id ID]]
    krt invocation get|wait|resubmit NAME ID | list NAME [--state Failed]   (async invocations)
    krt hosts list|drain|delete|reconcile krt config view -o json
    krt queue list|pause|resume|drain RUNTIME [-m MESSAGE]
    krt ui [--open]                       (a one-time login link to the embedded Temporal UI)
    krt schedule create NAME --cron EXPR|--every DURATION -f task-run.yaml
    krt schedule list|get|pause|unpause|trigger|delete NAME
    krt function apply -f FILE | get|list|describe|delete|invoke|rollback|scale NAME   (or krt apply -f)
    krt rollout status function/NAME
    krt up|down|status                    krt host|worker|demo   (process entry points of workers/)

This module is the SDK's side: the process entry points live above it, in workers/, and the `krt`
console script (kruntimes.workers.krt) dispatches them before handing every other command line to `run`.

Exit codes: 0 ok, 1 the operation failed (a Run failed, an invocation was refused or failed),
2 usage error, 3 not found, 4 the platform is not reachable or not configured. Errors are one
line on stderr starting "krt: " and saying what to do; never a traceback (KRT_DEBUG=1 adds one).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import select
import signal
import sys
import traceback
from typing import NoReturn

from kruntimes.cli.parser import PASSTHROUGH, UsageError

OK, FAILED, USAGE, NOT_FOUND, UNREACHABLE = 0, 1, 2, 3, 4
INTERRUPTED = 130
# Stdout's reader went away (`krt run list | head -2`): the process ends as kubectl's does, by
# SIGPIPE and silently; a shell shows 141, and `run` returns that.
CLOSED_PIPE = 128 + signal.SIGPIPE


def _where(namespace: str, name: str) -> str:
    return name if namespace == "default" else f"{name} -n {namespace}"


def explain(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message (without "krt: ") for an error."""
    from kruntimes.api.function import FunctionManifestError
    from kruntimes.api.run import ManifestError
    from kruntimes.sdk import errors as c

    match exc:
        case UsageError():
            return USAGE, str(exc)
        case FunctionManifestError():
            return USAGE, "invalid Function manifest: " + "; ".join(exc.problems)
        case ManifestError():
            return USAGE, "invalid Run manifest: " + "; ".join(exc.problems)
        case c.RunNotFound():
            listing = "" if exc.namespace == "default" else f" -n {exc.namespace}"
            return NOT_FOUND, f"{exc}; `krt run list{listing}` lists the Runs"
        case c.FunctionNotFound() if exc.name:
            listing = "" if exc.namespace == "default" else f" -n {exc.namespace}"
            return NOT_FOUND, f"{exc}; `krt function list{listing}` lists the Functions"
        case c.FunctionConflict():
            return FAILED, f"{exc}; `krt function describe {_where(exc.namespace, exc.name)}` shows it"
        case c.HostNotFound():
            return NOT_FOUND, f"{exc}; `krt hosts list` lists the hosts"
        case c.ScheduleNotFound():
            listing = "" if exc.namespace == "default" else f" -n {exc.namespace}"
            return NOT_FOUND, f"{exc}; `krt schedule list{listing}` lists the schedules"
        case c.InvalidSchedule():
            return USAGE, str(exc)
        case c.ScheduleAlreadyExists():
            return FAILED, f"{exc}; delete it first (`krt schedule delete {_where(exc.namespace, exc.name)}`)"
        case c.ConfigError():
            return UNREACHABLE, str(exc)
        case c.RunAlreadyExists():
            return (
                FAILED,
                f"{exc}; delete it first (`krt run delete {_where(exc.namespace, exc.name)}`) "
                "or pick another name",
            )
        case c.SpecConflict():
            return (
                FAILED,
                f"{exc}; delete it first (`krt run delete {_where(exc.namespace, exc.name)}`) to change it",
            )
        case c.RunFailed():
            run = exc.run
            return (
                FAILED,
                f"{exc}; `krt run get {_where(run.metadata.namespace, run.metadata.name)} -o yaml` shows why",
            )
        case c.InvocationNotFound():
            return NOT_FOUND, _invoke_message(exc)
        case c.WaitTimeout() if str(exc).startswith("invocation "):
            return FAILED, f"{exc}; wait longer, or `krt invocation get NAME ID` shows where it is"
        case c.WaitTimeout() if str(exc).startswith("function "):
            return FAILED, f"{exc}; wait longer or see `krt function describe NAME`"
        case c.WaitTimeout():
            return FAILED, f"{exc}; wait longer or see `krt run get NAME -o yaml`"
        case c.InvokeError():
            return FAILED, _invoke_message(exc)
        case c.KruntimesError():
            return FAILED, str(exc)
        case KeyboardInterrupt():
            return INTERRUPTED, "interrupted"
    return FAILED, f"unexpected error: {type(exc).__name__}: {exc}; set KRT_DEBUG=1 for details"


def _invoke_message(exc: BaseException) -> str:
    from kruntimes.sdk import errors as c
    from kruntimes.wire.reasons import GatewayReason

    assert isinstance(exc, c.InvokeError)
    where = f"invocation {exc.invocation_id}: " if exc.invocation_id else ""
    text = f"{where}{exc}"
    match exc:
        case c.AsyncBacklogFull() | c.AsyncUnavailable():
            return (
                f"{text}; nothing was recorded: submit it again with the same --id in {exc.retry_after:g} s"
            )
        case c.Busy() | c.NotReady():
            return f"{text}; retry in {exc.retry_after:g} s"
        case c.InvocationConflict():
            return f"{text}; with krt: another --id"
        case c.InvocationNotFound():
            return f"{text}; `krt invocation list NAME` lists those kept"
        case c.Unauthorized() if exc.reason == GatewayReason.CALLBACK_NOT_ALLOWED:
            return (
                f"{text}; the platform's operator lists the origins allowed (krt gateway --callback-origins)"
            )
        case c.Unauthorized():
            return f"{text}; check the token (KRT_TOKEN, or client.json written by `krt up`)"
        case c.OutcomeUnknown():
            return f"{text}; the function may have run: check before retrying"
        case c.FunctionNotFound() if exc.reason == GatewayReason.FUNCTION_NOT_FOUND:  # a Function's URL
            return f"{text}; `krt function list` shows the Functions"
        case c.FunctionNotFound():
            return f"{text}; `krt run list` shows the Runs"
        case c.InvocationFailed():
            tail = exc.result.stderr.data.strip().splitlines()[-1:] if exc.result.stderr.data else []
            return f"{where}the function failed: {exc}" + (f" (stderr: {tail[0]})" if tail else "")
    return text


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or "error"


def run(argv: list[str]) -> int:
    """Run one command line and return its exit code."""
    if argv and argv[0] in PASSTHROUGH:
        print(
            f"krt: `krt {argv[0]}` is run by the `krt` command "
            f"(or `python -m kruntimes.workers.krt {argv[0]}`), not by kruntimes.cli.main",
            file=sys.stderr,
        )
        return FAILED
    from kruntimes.cli import parser as cli_parser

    if not argv:
        cli_parser.build().print_help(sys.stderr)
        return USAGE
    try:
        args = cli_parser.parse(argv)
        from kruntimes.cli import commands as cli_commands

        return asyncio.run(cli_commands.dispatch(args))
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else OK
    except BrokenPipeError as e:
        if not _stdout_closed():
            code, message = explain(e)
            print(f"krt: {_one_line(message)}", file=sys.stderr)
            return code
        _drop_stdout()
        return CLOSED_PIPE
    except BaseException as e:
        code, message = explain(e)
        if os.environ.get("KRT_DEBUG") and code not in (USAGE, INTERRUPTED):
            traceback.print_exc()
        print(f"krt: {_one_line(message)}", file=sys.stderr)
        return code


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (its write end then polls POLLERR)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _drop_stdout() -> None:
    """Send what stdout still buffers to /dev/null, so no later flush fails on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def leave(code: int) -> NoReturn:
    """End a finished command with `code`.

    The Temporal client's Rust threads can abort interpreter teardown (SIGABRT, "PyGILState_Release
    ... finalizing"; temporalio/sdk-python#300), turning a command that did its work into exit -6:
    once one was loaded, a finished command runs its exit handlers (temporary directories),
    flushes its output and leaves without a teardown.
    """
    if code == CLOSED_PIPE:
        atexit._run_exitfuncs()
        sys.stderr.flush()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
        os._exit(code)  # should the signal reach another thread first
    if "temporalio.bridge" in sys.modules:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    leave(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
