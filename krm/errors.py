"""The errors of KRM function evaluation. Each has a stable `reason` (gRPC trailing metadata
`krt-reason`, results files, logs) and one gRPC code, mapped in `kruntimes.krm.service` alone.

KrmError
 ├── NotFound               no evaluator has this image/tag (the multi   NOT_FOUND
 │                          evaluator falls back on this one only)
 ├── InvalidRequest         image, tag, timeout or input out of bounds   INVALID_ARGUMENT
 │    └── InputTooLarge     the input ResourceList is over the bound
 ├── DeadlineExceeded       the function ran past its deadline; killed,  DEADLINE_EXCEEDED
 │                          partial output discarded
 ├── Cancelled              the caller went away; killed, discarded      CANCELLED
 ├── ExecutionError         the function ran and failed (keeps what it   FAILED_PRECONDITION
 │    │                     produced in `evaluation`)
 │    ├── FunctionFailed    it exited non-zero; its results are kept
 │    └── InvalidOutput     its output is not a ResourceList (a wrapper
 │         │                error: the parse error is its __cause__)
 │         ├── OutputTooLarge  stdout over the bound (killed at once)
 │         └── TooManyResults  more results than the bound
 ├── ResourceExhausted      too many evaluations waiting already         RESOURCE_EXHAUSTED
 └── SystemError            the binary cannot start, an evaluator is      UNAVAILABLE
                            unreachable: infrastructure, not the function
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kruntimes.krm.evaluation import Evaluation


# Each error class by its reason, filled in as the classes are defined (KrmError.__init_subclass__).
REASONS: dict[str, type[KrmError]] = {}


class KrmError(Exception):
    reason = "KrmError"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "reason" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must spell its own stable reason")
        if REASONS.setdefault(cls.reason, cls) is not cls:
            raise TypeError(f"{cls.__name__}: the reason {cls.reason!r} is taken")

    def __init__(self, message: str, *, evaluator: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.evaluator = evaluator

    def __str__(self) -> str:
        where = f"{self.evaluator} evaluator: " if self.evaluator else ""
        return f"{self.reason}: {where}{self.message}"

    def within(self, evaluator: str) -> KrmError:
        """This error, saying which evaluator raised it (the innermost name is kept)."""
        if self.evaluator is None:
            self.evaluator = evaluator
        return self


REASONS[KrmError.reason] = KrmError


class NotFound(KrmError):
    reason = "NotFound"


class InvalidRequest(KrmError):
    reason = "InvalidRequest"


class InputTooLarge(InvalidRequest):
    reason = "InputTooLarge"


class DeadlineExceeded(KrmError):
    reason = "DeadlineExceeded"


class Cancelled(KrmError):
    reason = "Cancelled"


class ExecutionError(KrmError):
    reason = "ExecutionError"

    def __init__(
        self, message: str, *, evaluation: Evaluation | None = None, evaluator: str | None = None
    ) -> None:
        super().__init__(message, evaluator=evaluator)
        self.evaluation = evaluation


class FunctionFailed(ExecutionError):
    reason = "FunctionFailed"


class InvalidOutput(ExecutionError):
    reason = "InvalidOutput"


class OutputTooLarge(InvalidOutput):
    reason = "OutputTooLarge"


class TooManyResults(InvalidOutput):
    reason = "TooManyResults"


class ResourceExhausted(KrmError):
    reason = "ResourceExhausted"


class SystemError_(KrmError):
    reason = "SystemError"
