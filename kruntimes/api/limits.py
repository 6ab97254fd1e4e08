"""Every size, count and time bound of the API, named once.

Byte bounds are measured on the UTF-8 encoding; output bounds on the compact JSON encoding.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB
DAY_SECONDS = 24 * 60 * 60

# Invoke request body.
MAX_PAYLOAD_BYTES = 1 * MIB
# A task Run's spec.mode.task.input, as compact JSON: what the host takes as one payload.
MAX_TASK_INPUT_BYTES = MAX_PAYLOAD_BYTES
# X-Kruntime-Invocation-ID header value.
MAX_INVOCATION_ID_BYTES = 128

# Keys in one outputs object (task outputs and invoke results alike).
MAX_OUTPUT_KEYS = 64
# One outputs key.
MAX_OUTPUT_KEY_BYTES = 128
# JSON-serialized size of one outputs value.
MAX_OUTPUT_VALUE_BYTES = 64 * KIB
# JSON-serialized size of the whole outputs object.
MAX_OUTPUTS_TOTAL_BYTES = 256 * KIB
# Captured stdout or stderr, per stream.
MAX_LOG_BYTES = 64 * KIB
# An invocation error's message (the handler's exception, or what was wrong with its outputs);
# longer text is truncated, not rejected.
MAX_INVOCATION_ERROR_MESSAGE_BYTES = 4 * KIB
# An invocation error's type: a token such as HandlerError or ValueError.
MAX_INVOCATION_ERROR_TYPE_BYTES = 128

# Sum of the contents of a Run's inline source files.
MAX_INLINE_SOURCE_BYTES = 256 * KIB
# Inline source files in one Run.
MAX_INLINE_FILES = 64
# One path component of a source file name.
MAX_FILE_NAME_BYTES = 255
# Total size of a source directory copied to a host.
MAX_SOURCE_DIR_BYTES = 64 * MIB
# Files in a source directory copied to a host.
MAX_SOURCE_DIR_FILES = 2000
# Handler string ("module:function" or a script path).
MAX_HANDLER_BYTES = 256

# Environment variables in one Run spec.
MAX_ENV_VARS = 128
# One environment variable value.
MAX_ENV_VALUE_BYTES = 32 * KIB
MAX_ENV_FROM = 16  # secrets a Run takes env from
MAX_SECRET_KEYS = 64  # keys of one secret
MAX_SECRET_BYTES = 256 * KIB  # all values of one secret

# status.endpoint.url.
MAX_ENDPOINT_URL_BYTES = 2048
# status.endpoint.caBundle (PEM).
MAX_CA_BUNDLE_BYTES = 16 * KIB
# status.message and condition messages; longer text is truncated, not rejected.
MAX_STATUS_MESSAGE_BYTES = 4 * KIB
# Conditions in one status (one per type).
MAX_CONDITIONS = 16
# A condition's type or reason token.
MAX_CONDITION_TOKEN_BYTES = 128

# spec.retryPolicy.limit.
MAX_RETRY_LIMIT = 100
# spec.recoveryLimit: moves to another host after a host loss, and its default.
MAX_RECOVERY_LIMIT = 10_000
DEFAULT_RECOVERY_LIMIT = 100
# retryPolicy.backoffSeconds and retryPolicy.maxBackoffSeconds.
MAX_BACKOFF_SECONDS = 3600.0
# retryPolicy.backoffMultiplier.
MAX_BACKOFF_MULTIPLIER = 10.0
# spec.timeoutSeconds and mode.function.idleTimeoutSeconds.
MAX_TIMEOUT_SECONDS = 7 * DAY_SECONDS
# spec.ttlSecondsAfterFinished; bounded so durable timers never overflow.
MAX_TTL_SECONDS_AFTER_FINISHED = 30 * DAY_SECONDS
# One invocation's timeout.
MAX_INVOKE_TIMEOUT_SECONDS = 900
# Invocation timeout when the caller names none.
DEFAULT_INVOKE_TIMEOUT_SECONDS = 30
# mode.function.concurrency: invocations of one function Run running at once.
MAX_FUNCTION_CONCURRENCY = 1000
# mode.function.queue: invocations of one function Run waiting their turn.
MAX_FUNCTION_QUEUE = 10_000
# mode.function.queueTimeoutSeconds when a queue is set and no timeout is named.
DEFAULT_QUEUE_TIMEOUT_SECONDS = DEFAULT_INVOKE_TIMEOUT_SECONDS

# spec.scale.min and spec.scale.max: replicas of one Function.
MAX_FUNCTION_REPLICAS = 100
# A Function's name: its replicas' Run names (`<function>-r<revision>-<5 hex>`) stay DNS-1123 labels.
MAX_FUNCTION_NAME_CHARS = 45
# spec.scale.scaleDownDelaySeconds.
MAX_SCALE_DOWN_DELAY_SECONDS = 3600

# spec.mode.function.asyncInvocations.backlog: Queued async invocations of one target at most
# (here, not in spec.py: the gateway and the host bound the value a registration carries without
# loading pydantic).
MAX_ASYNC_BACKLOG = 100_000
