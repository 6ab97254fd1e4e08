"""The JSON bodies of the gateway's answers: the one description of them.

/openapi.json's schemas are generated from these models (gateway/openapi.py). Error answers are
built from `ErrorBody`. The invoke answer (HTTP 200) is `InvokeAnswer`, rebuilt by
gateway/answers.py from the owner's checked fields with the gateway's own encoding of each (on the
hot path, without going through the model); tests check that it validates against it, whatever
the owner sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kruntimes.api.limits import MAX_LOG_BYTES

# the outcomes of an invocation that ran; the others are error answers (504, 502)
InvocationStatus = Literal["Succeeded", "HandlerError", "InvalidOutput"]


class Captured(BaseModel):
    """What the function wrote to stdout or stderr during the invocation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: str = Field(
        description=f"at most {MAX_LOG_BYTES} bytes of it, as UTF-8 (undecodable bytes replaced)"
    )
    truncated: bool = Field(description="it wrote more than `data` holds")
    totalBytes: int = Field(ge=0, description="how many bytes it wrote")


class InvocationError(BaseModel):
    """The handler's error (HandlerError) or what was wrong with its outputs (InvalidOutput)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    message: str


class InvokeAnswer(BaseModel):
    """The answer to an invocation that ran (HTTP 200)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    invocationId: str = Field(description="the caller's, or the one generated for it")
    status: InvocationStatus
    outputs: dict[str, Any] | None = Field(description="the handler's outputs (a JSON object), or null")
    stdout: Captured
    stderr: Captured
    durationMs: float = Field(ge=0, description="how long the handler ran")
    error: InvocationError | None = Field(default=None, description="absent when the handler succeeded")


class ErrorBody(BaseModel):
    """Every error answer's body (4xx, 5xx)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(description="the stable, machine-readable reason (one per answer kind)")
    message: str = Field(description="for people; never contains a token")
    invocationId: str = Field(description="the invocation's id; empty when the request never got one")
