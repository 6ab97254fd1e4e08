"""The krm adapter: a KRM function's entrypoint, run once per invocation, as the function runner's
wrapper server would run it inside the function's pod.

The handler is the entrypoint's command line (`kruntimes.api.names.krm_entrypoint`, resolved by
`kruntimes.runtime.config.spawn_spec`: absolute, or a file of the function's source). Each
invocation starts it as a one-shot process — in a lane of the function's sandbox
(runtime/lanes.py), or where there is none straight from the zygote (`kruntimes.runtime.once.run_once`);
either way under its limits, and everything it started killed at its end or at the timeout —,
writes the ResourceList of the payload to its stdin and answers its stdout, exit code and
stderr by the contract of `kruntimes.wire.krm`. The exit code is data: a non-zero exit is a Succeeded
invocation whose outputs say so, and the caller (the pod evaluator) decides what it means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kruntimes.runtime.capture import Capture
from kruntimes.runtime.outcome import Outcome, Status, set_error
from kruntimes.wire import krm as contract

ADAPTER = "krm"


class RunOnce(Protocol):
    """How a process is started for one call and waited for (`kruntimes.runtime.lanes.Lanes.run`, or
    `kruntimes.runtime.once.run_once` with its spawner and spec)."""

    def __call__(
        self,
        data: bytes,
        timeout_s: float,
        *,
        stdout_limit: int,
        on_start: Callable[[int], None] | None = None,
    ) -> Outcome: ...


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
