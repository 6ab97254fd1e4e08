"""InvocationWorkflow's contract (async invocations, issue #44; docs/async-invocations.md): its
input, the status it keeps in its memo and answers to its query, and the names its parties agree
on — the gateway that starts it, the worker that runs it, the gateway that serves its attempts.

One workflow per invocation: its id is `invocation_workflow_id(namespace, target uid, invocation
id)`, so a second submission of the same id finds the first (the gateway starts it with the
conflict policy USE_EXISTING) and never runs the function again. The request's digest (the body's
SHA-256, with its per-request callback URL when it has one) rides in the memo
INVOCATION_DIGEST_MEMO: the same id with another body or callback URL is 409. The workflow stays open for the
target's retention after it ends, answering QUERY_INVOCATION and keeping INVOCATION_STATUS_MEMO, so
the id is remembered that long; then it completes.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, Field, SerializerFunctionWrapHandler, model_serializer

from kruntimes.api._base import ApiModel, StatusMessage, StrictBool, StrictFloat, StrictInt
from kruntimes.api.ids import RunUid
from kruntimes.api.names import validate_dns1123_label, validate_invocation_id
from kruntimes.api.spec import (
    DEFAULT_ASYNC_ATTEMPTS,
    DEFAULT_ASYNC_RETENTION_SECONDS,
    DEFAULT_ASYNC_SHARE_PERCENT,
    MAX_ASYNC_ATTEMPTS,
    MAX_ASYNC_RETENTION_SECONDS,
    MIN_ASYNC_RETENTION_SECONDS,
    AsyncRetry,
    CallbackUrl,
)
from kruntimes.api.spec import MAX_CALLBACK_URL_CHARS as MAX_CALLBACK_URL_CHARS

INVOCATION_WORKFLOW = "InvocationWorkflow"
QUERY_INVOCATION = "invocation"  # → InvocationStatus
# The memo the workflow writes its status to (an InvocationStatus) at each state change, so the
# gateway answers GET from DescribeWorkflowExecution without a worker.
INVOCATION_STATUS_MEMO = "krtStatus"
# The memo the gateway sets at the start: the request's digest (the body's SHA-256 hex, with the
# per-request callback URL when there is one), encrypted as every payload.
INVOCATION_DIGEST_MEMO = "krtDigest"
# The activity the worker runs for one attempt (activities/invocations.py); it calls the
# gateway's GatewayDispatch.AttemptInvocation (proto/kruntimes/rpc/v1/gateway_dispatch.proto).
ACTIVITY_ATTEMPT = "attempt_invocation"
ACTIVITY_TARGET = "invocation_target"  # → InvocationPolicy, from the Run's or Function's spec
ACTIVITY_CALLBACK = "deliver_callback"  # → CallbackOutcome

MAX_ATTEMPTS = MAX_ASYNC_ATTEMPTS  # the bound of asyncInvocations.retry.maxAttempts
DEFAULT_MAX_ATTEMPTS = DEFAULT_ASYNC_ATTEMPTS
MAX_ATTEMPTS_KEPT = 20  # attempts the status lists (the first and the last ones)
MAX_CALLBACK_FAILURES_KEPT = 5
DEFAULT_RETENTION_SECONDS = DEFAULT_ASYNC_RETENTION_SECONDS
MAX_RETENTION_SECONDS = MAX_ASYNC_RETENTION_SECONDS
MAX_RESULT_BYTES = 1024 * 1024 + 64 * 1024  # a sync answer's body: outputs, stdout and stderr bounded
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InvocationState(StrEnum):
    Queued = "Queued"  # accepted; waiting for its (next) attempt
    Running = "Running"  # an attempt is dispatched
    Succeeded = "Succeeded"  # the function ran and answered (status Succeeded)
    Failed = "Failed"  # the handler failed, or the invocation could not be run (its reason says)
    Unknown = "Unknown"  # an attempt may have run and its outcome is lost; not retried


TERMINAL_STATES = frozenset({InvocationState.Succeeded, InvocationState.Failed, InvocationState.Unknown})


class TargetKind(StrEnum):
    Run = "Run"
    Function = "Function"


def _invocation_id(value: str) -> str:
    return validate_invocation_id(value)


def _secret_name(value: str) -> str:
    return validate_dns1123_label(value, field="callback.secretName")


def _sha256(value: str) -> str:
    if not _SHA256_HEX.fullmatch(value):
        raise ValueError("bodySha256: 64 lowercase hex digits")
    return value


InvocationId = Annotated[str, AfterValidator(_invocation_id)]
Sha256Hex = Annotated[str, AfterValidator(_sha256)]
SecretName = Annotated[str, AfterValidator(_secret_name)]


def invocation_workflow_id(namespace: str, target_uid: str, invocation_id: str) -> str:
    """The workflow id of one invocation (namespace, target uid and invocation id already validated)."""
    return f"invocation/{namespace}/{target_uid}/{invocation_id}"


class Target(ApiModel):
    kind: TargetKind
    namespace: str
    name: str = ""  # the Run's or Function's name ("" when the gateway knows only the uid)
    uid: RunUid  # a Run's or a Function's uid (the same canonical form)
    runtime: str = ""  # a Run's runtime (its URL names it); "" for a Function


class InvocationInput(ApiModel):
    target: Target
    invocationId: InvocationId
    bodySha256: Sha256Hex
    body: str = Field(max_length=1024 * 1024)  # the JSON request body as the caller sent it
    timeoutSeconds: StrictFloat | None = Field(default=None, gt=0, le=900)  # X-Kruntime-Timeout
    acceptedAt: AwareDatetime
    caller: str = Field(default="", max_length=256)  # who submitted it (a user name, never a token)
    callbackUrl: CallbackUrl | None = None  # per request (https only)
    # The status so far (its result left in the memo) when the workflow continued as new: None at first.
    carried: InvocationStatus | None = None
    carriedRan: StrictInt = Field(default=0, ge=0)  # of the carried attempts, those dispatched
    carriedTurns: StrictInt = Field(default=0, ge=0)  # and those refused AsyncShareFull
    # Unused (a callback phase no longer continues as new); kept so an input that names it decodes.
    carriedPolicy: InvocationPolicy | None = None


# spec.mode.function.asyncInvocations.retry of the target (kruntimes.api.spec.AsyncRetry).
Retry = AsyncRetry


class InvocationPolicy(ApiModel):
    """What the target's spec says of its async invocations (ACTIVITY_TARGET's answer)."""

    exists: StrictBool  # False: the target is gone (a Run ended or deleted, a Function deleted)
    ready: StrictBool = False  # a Run: Ready now; a Function: it exists (it keeps invocations)
    retry: Retry = Retry()
    retentionSeconds: StrictInt = Field(
        default=DEFAULT_RETENTION_SECONDS, ge=MIN_ASYNC_RETENTION_SECONDS, le=MAX_RETENTION_SECONDS
    )
    callbackUrl: CallbackUrl | None = None
    callbackSecretName: SecretName | None = None  # the Secret whose key signs callbacks (HMAC-SHA256)
    creator: str = ""  # the target's metadata.creator: whose right to use that Secret is checked
    share: StrictInt = Field(default=DEFAULT_ASYNC_SHARE_PERCENT, ge=1, le=100)  # asyncInvocations.share
    reason: str = ""  # why not exists / not ready, in the platform's words
    # False: no execution of the target was found (by its uid, through visibility, which lags a
    # target just created): the workflow waits a grace period before it takes that as gone.
    found: StrictBool = True


class AttemptRequest(ApiModel):
    """ACTIVITY_ATTEMPT's argument: one dispatch through a gateway, as a sync invoke."""

    target: Target
    invocationId: InvocationId
    body: str = Field(max_length=1024 * 1024)
    timeoutSeconds: StrictFloat | None = Field(default=None, gt=0, le=900)
    attempt: StrictInt = Field(ge=1)  # a Function's attempts that did not run are not bounded by maxAttempts
    share: StrictInt = Field(default=DEFAULT_ASYNC_SHARE_PERCENT, ge=1, le=100)  # the target's async share
    # True: the activity must record ATTEMPT_SENT in its heartbeat before it sends, so a timeout
    # without it proves the attempt never ran (a worker too old for the field refuses the request).
    marksDispatch: StrictBool = False

    @model_serializer(mode="wrap")
    def _unmarked_as_before(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Without the mark the request is the one a worker older than the field reads."""
        data = handler(self)
        if not self.marksDispatch and isinstance(data, dict):
            data.pop("marksDispatch", None)
        return data


# The attempt's heartbeat detail, recorded by the server before the request may be sent.
ATTEMPT_SENT = "sent"


class AttemptOutcome(ApiModel):
    """What one attempt came to: the gateway's HTTP status, reason and body, and whether the
    function may have run (`dispatched`; False proves it did not: 429, 503 before dispatch, a
    gateway that could not be reached)."""

    httpStatus: StrictInt
    reason: str = ""
    body: str = Field(default="", max_length=MAX_RESULT_BYTES)  # the sync answer's JSON
    dispatched: StrictBool


class Attempt(ApiModel):
    n: StrictInt
    startedAt: AwareDatetime
    endedAt: AwareDatetime | None = None
    httpStatus: StrictInt = 0
    reason: str = ""
    dispatched: StrictBool = False


class InvocationError(ApiModel):
    reason: str
    message: StatusMessage = ""


class CallbackState(ApiModel):
    url: str = Field(max_length=MAX_CALLBACK_URL_CHARS)
    delivered: StrictBool = False
    attempts: StrictInt = 0
    failures: list[InvocationError] = Field(default_factory=list, max_length=MAX_CALLBACK_FAILURES_KEPT)


class CallbackOutcome(ApiModel):
    delivered: StrictBool
    httpStatus: StrictInt = 0
    message: StatusMessage = ""


class InvocationStatus(ApiModel):
    """GET …/invocations/{id}: the query's answer and the memo's content."""

    invocationId: InvocationId
    target: Target
    state: InvocationState
    acceptedAt: AwareDatetime
    startedAt: AwareDatetime | None = None  # the first attempt's dispatch
    endedAt: AwareDatetime | None = None
    expiresAt: AwareDatetime | None = None  # when the id is forgotten (endedAt + retention)
    attempts: list[Attempt] = Field(default_factory=list, max_length=MAX_ATTEMPTS_KEPT)
    attemptCount: StrictInt = 0  # every attempt made (attempts lists at most MAX_ATTEMPTS_KEPT)
    # The sync answer's body of the last attempt that ran (status, outputs, stdout, stderr, truncated).
    result: str | None = Field(default=None, max_length=MAX_RESULT_BYTES)
    error: InvocationError | None = None  # why Failed or Unknown (a platform reason)
    retried: Literal["", "notRun", "unknownOutcome", "failure"] = ""  # why the last retry was made
    callback: CallbackState | None = None


class CallbackRequest(ApiModel):
    """ACTIVITY_CALLBACK's argument: one delivery of the status to the callback URL."""

    url: str = Field(max_length=MAX_CALLBACK_URL_CHARS)
    namespace: str
    secretName: SecretName | None = None  # None: the delivery is unsigned
    creator: str = ""
    status: InvocationStatus
    attempt: StrictInt = Field(ge=1)


InvocationInput.model_rebuild()
