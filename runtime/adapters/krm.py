"""The krm adapter on the host: a KRM function's entrypoint, run once per invocation, as the
function runner's wrapper server would run it inside the function's pod.

The handler is the entrypoint's command line (`kruntimes.api.adapters.krm_entrypoint`), its program
absolute or a file of the function's source. Each invocation starts it as a one-shot process — in
a lane of the function's sandbox (runtime/lanes.py), or where there is none straight from the
zygote (`kruntimes.runtime.once.run_once`); either way under its limits, and everything it started
killed at its end or at the timeout —, writes the ResourceList of the payload to its stdin and
answers its stdout, exit code and stderr by the contract of `kruntimes.wire.krm`. The exit code is
data: a non-zero exit is a Succeeded invocation whose outputs say so, and the caller (the pod
evaluator) decides what it means.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kruntimes.api.adapters import KRM, krm_entrypoint
from kruntimes.runtime.adapters.host import HostAdapter, RunOnce
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.errors import InvalidRequest
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.outcome import Outcome, Status, set_error
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.spawner import SpawnSpec
from kruntimes.wire import krm as contract

if TYPE_CHECKING:
    from kruntimes.runtime.config import RunRef


class Krm(HostAdapter):
    described = KRM
    concurrent = True  # the pod evaluator sends a Run several evaluations at once
    prestart = True
    stop_past_limit = True

    def spawn_spec(
        self,
        run: RunRef,
        handler: str,
        workdir: Path,
        *,
        once: bool,
        env: dict[str, str],
        limits: ProcessLimits,
        sandbox: SandboxSpec | None,
    ) -> SpawnSpec:
        argv = krm_argv(handler, workdir)
        return SpawnSpec(kind="exec", cwd=str(workdir), env=env, limits=limits, argv=argv, sandbox=sandbox)

    def call(
        self,
        run: RunOnce,
        payload: bytes,
        timeout_s: float,
        *,
        on_start: Callable[[int], None] | None = None,
    ) -> Outcome:
        return invoke(run, payload, timeout_s, on_start=on_start)


def krm_argv(handler: str, workdir: Path) -> tuple[str, ...]:
    """A krm entrypoint's argv, its program resolved: absolute, or a file of the workspace."""
    try:
        words = krm_entrypoint(handler)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    program = Path(words[0]) if words[0].startswith("/") else workdir / words[0]
    if not program.is_file():
        raise InvalidRequest(f"krm entrypoint {words[0]!r:.200} is not a file")
    return (str(program), *words[1:])


def invoke(
    run: RunOnce,
    payload: bytes,
    timeout_s: float,
    *,
    on_start: Callable[[int], None] | None = None,
) -> Outcome:
    """One evaluation: the payload's ResourceList on stdin, the answer in the outputs
    (`on_start` gets the process's pid, for an unregistration that must kill it)."""
    try:
        stdin = contract.decode_request(payload)
    except contract.ContractError as exc:
        outcome = Outcome(Status.HANDLER_ERROR)
        set_error(outcome, Status.HANDLER_ERROR, "InvalidPayload", str(exc))
        return outcome
    outcome = run(stdin, timeout_s, stdout_limit=contract.MAX_STDOUT_BYTES, on_start=on_start)
    if outcome.status is Status.TIMED_OUT:
        outcome.stdout = Capture()  # partial output is discarded
        return outcome
    if outcome.error_type == "NonZeroExit":  # an answer here, not an error of the invocation
        set_error(outcome, Status.SUCCEEDED, "", "")
    code = outcome.exit_code
    outcome.outputs_json = contract.encode_outputs(
        exit_code=128 - code if code < 0 else code,
        stdout=outcome.stdout.data,
        stdout_bytes=outcome.stdout.total,
    )
    outcome.stdout = Capture()  # it is in the outputs; the answer does not carry it twice
    return outcome


ADAPTER = Krm()
