"""The Run manifest's metadata and spec: everything a Run is created with, immutable afterwards."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, JsonValue, field_validator, model_validator

from kruntimes.api._base import ApiModel, StrictBool, StrictFloat, StrictInt
from kruntimes.api._text import has_control_chars, utf8_len
from kruntimes.api.adapters import ADAPTERS, validate_handler
from kruntimes.api.ids import Namespace, RuntimeName, RunUid
from kruntimes.api.limits import (
    DEFAULT_QUEUE_TIMEOUT_SECONDS,
    DEFAULT_RECOVERY_LIMIT,
    MAX_ASYNC_BACKLOG,
    MAX_BACKOFF_MULTIPLIER,
    MAX_BACKOFF_SECONDS,
    MAX_ENV_FROM,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    MAX_FUNCTION_CONCURRENCY,
    MAX_FUNCTION_QUEUE,
    MAX_HANDLER_BYTES,
    MAX_INLINE_FILES,
    MAX_INLINE_SOURCE_BYTES,
    MAX_INVOKE_TIMEOUT_SECONDS,
    MAX_RECOVERY_LIMIT,
    MAX_RETRY_LIMIT,
    MAX_TASK_INPUT_BYTES,
    MAX_TIMEOUT_SECONDS,
    MAX_TTL_SECONDS_AFTER_FINISHED,
)
from kruntimes.api.names import (
    validate_dns1123_label,
    validate_env_name,
    validate_relative_file_name,
    validate_run_uid,
    validate_subject,
)


def _label(field: str) -> AfterValidator:
    return AfterValidator(lambda value: validate_dns1123_label(value, field=field))


def _canonical_uuid(value: str) -> str:
    return validate_run_uid(value, field="metadata.uid")


CreatorKind = Literal["sdk", "cli", "mcp", "schedule"]  # kruntimes.api.names.CREATOR_KINDS


class Creator(ApiModel):
    """Who started a Run: the SDK, the CLI or an MCP server for an identity (the client config's
    `identity`), or a schedule for the identity that created it. Not a secret: it is what a host
    checks the role bindings' `use-secrets` against, and what its audit records name."""

    kind: CreatorKind
    subject: Annotated[str, AfterValidator(validate_subject)]

    def __str__(self) -> str:
        return f"{self.kind}:{self.subject}"


class Metadata(ApiModel):
    name: Annotated[str, _label("metadata.name")]
    namespace: Annotated[Namespace, _label("metadata.namespace")] = Namespace("default")
    # Fixed at creation; the only identity the dataplane uses.
    uid: Annotated[RunUid, AfterValidator(_canonical_uuid)] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Set by the SDK, the CLI and schedules from who starts the Run (a manifest's own is replaced);
    # None for a Run started otherwise (plain Temporal): such a Run is given no secret.
    creator: Creator | None = None


# spec.mode.function.asyncInvocations (docs/async-invocations.md, issue #44): its bounds.
MAX_ASYNC_ATTEMPTS = 100
DEFAULT_ASYNC_ATTEMPTS = 5
DEFAULT_ASYNC_SHARE_PERCENT = 50
DEFAULT_ASYNC_BACKLOG = 10_000
MIN_ASYNC_RETENTION_SECONDS = 60
MAX_ASYNC_RETENTION_SECONDS = 7 * 24 * 3600
DEFAULT_ASYNC_RETENTION_SECONDS = 24 * 3600
MAX_CALLBACK_URL_CHARS = 2048


def validate_callback_url(value: str, *, field: str = "callback.url") -> str:
    """An https URL with a host, no user or password (a credential would ride in history and
    logs), no fragment, no whitespace or control characters, at most MAX_CALLBACK_URL_CHARS."""
    if not 1 <= len(value) <= MAX_CALLBACK_URL_CHARS:
        raise ValueError(f"{field}: 1..{MAX_CALLBACK_URL_CHARS} characters, got {len(value)}")
    if not value.isascii() or any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"{field}: printable ASCII without spaces (percent-encode the rest)")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"{field}: not a URL: {e}") from None
    if parts.scheme != "https":
        raise ValueError(f"{field}: https only, not {parts.scheme or 'no scheme'!r:.20}")
    if not parts.hostname:
        raise ValueError(f"{field}: names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{field}: must not carry a user or password (sign with callback.secretName)")
    if parts.fragment or value.endswith("#"):
        raise ValueError(f"{field}: must not carry a fragment")
    if port == 0:
        raise ValueError(f"{field}: port 0")
    return value


CallbackUrl = Annotated[str, AfterValidator(validate_callback_url)]


class AsyncRetry(ApiModel):
    """When an async invocation is attempted again (docs/async-invocations.md, "States and
    retries"): one that provably did not run always is, within ``maxAttempts`` (a Run's; a
    Function keeps them while it exists); one whose outcome is lost only with
    ``onUnknownOutcome`` (the handler is idempotent); a handler error only with ``onFailure``."""

    onUnknownOutcome: StrictBool = False
    onFailure: StrictBool = False
    maxAttempts: StrictInt = Field(default=DEFAULT_ASYNC_ATTEMPTS, ge=1, le=MAX_ASYNC_ATTEMPTS)


class AsyncCallback(ApiModel):
    """Where an ended invocation's status is POSTed (https only), signed with HMAC-SHA256 keyed
    by the Secret ``secretName`` of the target's namespace when one is named."""

    url: CallbackUrl
    secretName: Annotated[str, _label("callback.secretName")] | None = None


class AsyncInvocations(ApiModel):
    """How the target takes async invocations: their retries, the ``share`` (percent) of its
    concurrency they may hold at once, how many may wait (``backlog``; 429 past it), how long an
    ended one's id and result are kept (``retentionSeconds``), and an optional callback."""

    retry: AsyncRetry = Field(default_factory=AsyncRetry)
    share: StrictInt = Field(default=DEFAULT_ASYNC_SHARE_PERCENT, ge=1, le=100)
    backlog: StrictInt = Field(default=DEFAULT_ASYNC_BACKLOG, ge=1, le=MAX_ASYNC_BACKLOG)
    retentionSeconds: StrictInt = Field(
        default=DEFAULT_ASYNC_RETENTION_SECONDS,
        ge=MIN_ASYNC_RETENTION_SECONDS,
        le=MAX_ASYNC_RETENTION_SECONDS,
    )
    callback: AsyncCallback | None = None


class FunctionMode(ApiModel):
    """How long the function may stay idle, and how many invocations it takes: up to
    ``concurrency`` run at once (unset: 1; a krm runtime's: the host's --krm-concurrency), up to
    ``queue`` more wait their turn in order, each for at most ``queueTimeoutSeconds``; beyond
    that an invocation is refused (429). Invocations are not scheduler capacity: a Run is one
    unit of its host's capacity whatever its concurrency."""

    idleTimeoutSeconds: StrictInt | None = Field(default=None, ge=1, le=MAX_TIMEOUT_SECONDS)
    concurrency: StrictInt | None = Field(default=None, ge=1, le=MAX_FUNCTION_CONCURRENCY)
    queue: StrictInt | None = Field(default=None, ge=0, le=MAX_FUNCTION_QUEUE)  # unset: none
    queueTimeoutSeconds: StrictFloat | None = Field(
        default=None, gt=0, le=MAX_INVOKE_TIMEOUT_SECONDS, allow_inf_nan=False
    )
    # Unset: async invocations take the defaults of AsyncInvocations (docs/async-invocations.md).
    asyncInvocations: AsyncInvocations | None = None

    @property
    def async_invocations(self) -> AsyncInvocations:
        """The async invocations' policy, the defaults when none is named."""
        return self.asyncInvocations if self.asyncInvocations is not None else AsyncInvocations()

    @model_validator(mode="after")
    def _queue_timeout_needs_a_queue(self) -> Self:
        if self.queueTimeoutSeconds is not None and not self.queue:
            raise ValueError("queueTimeoutSeconds needs a queue (set queue to 1 or more)")
        return self

    @property
    def queue_timeout_seconds(self) -> float:
        """How long a queued invocation waits at most (the default when none is named)."""
        if self.queueTimeoutSeconds is not None:
            return self.queueTimeoutSeconds
        return float(DEFAULT_QUEUE_TIMEOUT_SECONDS)


def encode_input(value: JsonValue) -> bytes:
    """A task's input as the handler receives it: compact UTF-8 JSON (what its bound measures)."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()


class TaskMode(ApiModel):
    # What the task's handler is called with (python: its argument; bash: its stdin, as JSON).
    # It travels in the workflow input, so the payload codec encrypts it as it does env.
    input: JsonValue | None = None

    @field_validator("input")
    @classmethod
    def _input_is_bounded(cls, value: JsonValue | None) -> JsonValue | None:
        if value is None:
            return None
        try:
            size = len(encode_input(value))
        except ValueError as e:
            raise ValueError(f"input: not JSON: {e}") from None
        if size > MAX_TASK_INPUT_BYTES:
            raise ValueError(f"input: {size} bytes as JSON, at most {MAX_TASK_INPUT_BYTES}")
        return value

    def encoded_input(self) -> bytes:
        """The input as the host hands it to the handler: JSON, `null` when none was given."""
        return encode_input(self.input)


class ModeSpec(ApiModel):
    """Exactly one of ``function`` (keep registered, invoke many times) or ``task`` (run once);
    a manifest without ``spec.mode`` is a function Run, as `krt run create` makes."""

    function: FunctionMode | None = None
    task: TaskMode | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.function is None) == (self.task is None):
            raise ValueError("mode: exactly one of 'function' or 'task' must be set")
        return self

    @property
    def kind(self) -> Literal["function", "task"]:
        return "function" if self.function is not None else "task"


class InlineFile(ApiModel):
    name: Annotated[str, AfterValidator(validate_relative_file_name)]
    content: str
    executable: StrictBool = False


class SourceSpec(ApiModel):
    """Exactly one of ``path`` (a directory, resolved to absolute by the caller) or ``inline`` files."""

    path: str | None = None
    inline: list[InlineFile] | None = None

    @field_validator("path")
    @classmethod
    def _path_is_usable(cls, value: str | None) -> str | None:
        if value is not None and (not value or "\x00" in value):
            raise ValueError("source.path must be non-empty and must not contain NUL")
        return value

    @field_validator("inline")
    @classmethod
    def _inline_is_bounded(cls, files: list[InlineFile] | None) -> list[InlineFile] | None:
        if files is None:
            return None
        if not 1 <= len(files) <= MAX_INLINE_FILES:
            raise ValueError(f"source.inline must hold 1..{MAX_INLINE_FILES} files, got {len(files)}")
        names = {f.name for f in files}
        if len(names) != len(files):
            raise ValueError("source.inline file names must be unique")
        for name in names:
            parts = name.split("/")
            for depth in range(1, len(parts)):
                if "/".join(parts[:depth]) in names:
                    raise ValueError(f"source.inline file {name!r} lies under another file, not a directory")
        total = sum(utf8_len(f.content, field="source.inline content") for f in files)
        if total > MAX_INLINE_SOURCE_BYTES:
            raise ValueError(f"source.inline contents total {total} bytes, at most {MAX_INLINE_SOURCE_BYTES}")
        return files

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.path is None) == (self.inline is None):
            raise ValueError("source: exactly one of 'path' or 'inline' must be set")
        return self


class RetryPolicy(ApiModel):
    """Registration attempts (function mode) or executions (task mode) before the Run ends Failed."""

    limit: StrictInt = Field(default=3, ge=1, le=MAX_RETRY_LIMIT)
    backoffSeconds: StrictFloat = Field(default=1.0, ge=0, le=MAX_BACKOFF_SECONDS, allow_inf_nan=False)
    backoffMultiplier: StrictFloat = Field(default=2.0, ge=1, le=MAX_BACKOFF_MULTIPLIER, allow_inf_nan=False)
    maxBackoffSeconds: StrictFloat = Field(default=60.0, ge=0, le=MAX_BACKOFF_SECONDS, allow_inf_nan=False)

    @model_validator(mode="after")
    def _max_covers_initial(self) -> Self:
        if self.maxBackoffSeconds < self.backoffSeconds:
            raise ValueError("retryPolicy.maxBackoffSeconds must be >= retryPolicy.backoffSeconds")
        return self


class SecretRef(ApiModel):
    name: Annotated[str, _label("secretRef.name")]


class EnvFromSource(ApiModel):
    """Every key of a secret of the Run's namespace as an environment variable (named `prefix`
    + key). The host resolves it when it registers the function: values never enter the Run's
    spec, its history or its status."""

    secretRef: SecretRef
    prefix: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$|^$")] = ""


class RunSpec(ApiModel):
    """The workflow input; never changes after creation."""

    runtime: Annotated[RuntimeName, _label("spec.runtime")]
    mode: ModeSpec = Field(default_factory=lambda: ModeSpec(function=FunctionMode()))
    source: SourceSpec
    handler: str
    env: dict[str, str] = Field(default_factory=dict)
    envFrom: list[EnvFromSource] = Field(default_factory=list, max_length=MAX_ENV_FROM)
    timeoutSeconds: StrictInt | None = Field(default=None, ge=1, le=MAX_TIMEOUT_SECONDS)
    retryPolicy: RetryPolicy = Field(default_factory=RetryPolicy)
    # Moves to another host after its host was lost or drained; beyond it the Run ends Failed
    # (RecoveriesExhausted). A host loss is not the function's fault: retryPolicy does not count it.
    recoveryLimit: StrictInt = Field(default=DEFAULT_RECOVERY_LIMIT, ge=0, le=MAX_RECOVERY_LIMIT)
    ttlSecondsAfterFinished: StrictInt | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS_AFTER_FINISHED)
    tenant: Annotated[str, _label("spec.tenant")] | None = None

    @field_validator("handler")
    @classmethod
    def _handler_is_bounded(cls, handler: str) -> str:
        if not 1 <= utf8_len(handler, field="spec.handler") <= MAX_HANDLER_BYTES:
            raise ValueError(f"spec.handler must be 1..{MAX_HANDLER_BYTES} bytes")
        if has_control_chars(handler):
            raise ValueError("spec.handler must not contain control characters")
        return handler

    @field_validator("env")
    @classmethod
    def _env_is_valid(cls, env: dict[str, str]) -> dict[str, str]:
        if len(env) > MAX_ENV_VARS:
            raise ValueError(f"env holds {len(env)} variables, at most {MAX_ENV_VARS}")
        for name, value in env.items():
            validate_env_name(name)
            if utf8_len(value, field=f"env.{name}") > MAX_ENV_VALUE_BYTES:
                raise ValueError(f"env.{name}: value exceeds {MAX_ENV_VALUE_BYTES} bytes")
            if "\x00" in value:
                raise ValueError(f"env.{name}: value must not contain NUL")
        return env

    @model_validator(mode="after")
    def _handler_fits_builtin_runtime(self) -> Self:
        # Other runtimes name their adapter in the runtime config; the caller checks them there.
        if self.runtime in ADAPTERS:
            self.validate_handler_for(self.runtime)
        return self

    def validate_handler_for(self, adapter: str) -> Self:
        """Check ``handler`` against the adapter that will run it; returns self, raises ValueError."""
        try:
            validate_handler(adapter, self.handler)
        except ValueError as e:
            raise ValueError(f"spec.handler: {e}") from e
        return self
