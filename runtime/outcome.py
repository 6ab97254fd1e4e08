"""How one execution in a function process ended, and how a frame from the process settles it."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES
from kruntimes.runtime import framing
from kruntimes.runtime.capture import Capture


class Status(enum.Enum):
    SUCCEEDED = "Succeeded"
    HANDLER_ERROR = "HandlerError"
    TIMED_OUT = "Timeout"
    PROCESS_EXITED = "ProcessExited"
    INVALID_OUTPUT = "InvalidOutput"
    CANCELLED = "Cancelled"


@dataclass(slots=True)
class Outcome:
    status: Status
    outputs_json: bytes = b""
    error_type: str = ""
    error_message: str = ""
    exit_code: int = 0
    duration_us: int = 0
    stdout: Capture = field(default_factory=Capture)
    stderr: Capture = field(default_factory=Capture)


class LoadFailed(Exception):
    """A function process could not load its handler; `kind` is the error type it reported."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def error_fields(body: bytes) -> tuple[str, str]:
    """(type, message) of an error frame's JSON body; a malformed one is the process's fault."""
    try:
        raw = json.loads(body)
        return str(raw["type"]), str(raw["message"])
    except (ValueError, KeyError, TypeError):
        return "InvalidOutput", "the function process sent a malformed error"


def set_error(outcome: Outcome, status: Status, kind: str, message: str) -> None:
    outcome.status, outcome.error_type, outcome.error_message = status, kind, message


def set_exit(outcome: Outcome, code: int | None) -> None:
    """A per-call process's exit code (-9 when none is known: it was killed), and a non-zero
    one as the error of an outcome that had none (the krm adapter takes it back: there it is data)."""
    outcome.exit_code = code if code is not None else -9
    if outcome.exit_code != 0 and outcome.status is Status.SUCCEEDED:
        set_error(
            outcome, Status.HANDLER_ERROR, "NonZeroExit", f"the script exited with code {outcome.exit_code}"
        )


def apply_frame(outcome: Outcome, kind: int, body: bytes) -> None:
    """Settle `outcome` with the process's answer: a result frame, or an error frame."""
    if kind == framing.RESULT:
        outcome.outputs_json = body
        return
    error_type, message = error_fields(body)
    status = Status.INVALID_OUTPUT if error_type == "InvalidOutput" else Status.HANDLER_ERROR
    set_error(outcome, status, error_type, message)


def set_too_large(outcome: Outcome) -> None:
    """Settle `outcome` for an answer larger than the server accepts."""
    set_error(
        outcome,
        Status.INVALID_OUTPUT,
        "OutputsTooLarge",
        f"result larger than {MAX_OUTPUTS_TOTAL_BYTES} bytes",
    )
