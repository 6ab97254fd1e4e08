"""The krm adapter: a KRM function's entrypoint, run once per invocation, as the function runner's
wrapper server would run it inside the function's pod.

The handler is the entrypoint's command line (`kruntimes.api.names.krm_entrypoint`, resolved by
`runtime.config.spawn_spec`: absolute, or a file of the function's source). Each
invocation starts it as a one-shot process (the zygote, the function's sandbox, its limits, its
process group killed at the end or at the timeout: `runtime.once.run_once`), writes the
ResourceList of the payload to its stdin and answers its stdout, exit code and stderr by the
contract of `kruntimes.wire.krm`. The exit code is data: a non-zero exit is a Succeeded
invocation whose outputs say so, and the caller (the pod evaluator) decides what it means.
"""

from __future__ import annotations

from collections.abc import Callable

from kruntimes.wire import krm as contract
from runtime.capture import Capture
from runtime.once import run_once
from runtime.outcome import Outcome, Status, set_error
from runtime.spawner import Spawner, SpawnSpec

ADAPTER = "krm"


def invoke(
    spawner: Spawner,
    spec: SpawnSpec,
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
    outcome = run_once(
        spawner, spec, stdin, timeout_s, stdout_limit=contract.MAX_STDOUT_BYTES, on_start=on_start
    )
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
