"""The invoke API's HTTP headers, shared by the gateway and the SDK."""

from __future__ import annotations

# Caller-chosen invocation id (<= 128 bytes, no control characters), echoed in every answer.
INVOCATION_ID = "X-Kruntime-Invocation-ID"
# The invocation's timeout in seconds, (0, 900].
TIMEOUT = "X-Kruntime-Timeout"
RETRY_AFTER = "Retry-After"
AUTHORIZATION = "Authorization"
