"""The invoke API's HTTP headers, shared by the gateway and the SDK."""

from __future__ import annotations

# Caller-chosen invocation id (1..128 printable ASCII characters), echoed in every answer.
INVOCATION_ID = "X-Kruntime-Invocation-ID"
# The invocation's timeout in seconds, (0, 900], in ASCII digits ("30", "0.5").
TIMEOUT = "X-Kruntime-Timeout"
RETRY_AFTER = "Retry-After"
AUTHORIZATION = "Authorization"
# RFC 7240: `Prefer: respond-async` asks for an async invocation (202), confirmed by
# `Preference-Applied: respond-async`; its resource is at `Location`.
PREFER = "Prefer"
PREFERENCE_APPLIED = "Preference-Applied"
RESPOND_ASYNC = "respond-async"
LOCATION = "Location"
# An async invocation's own callback URL (https, at most 2,048 bytes), within the origins the
# gateway's --callback-origins allows the target's namespace; refused on a sync invoke.
CALLBACK_URL = "X-Kruntime-Callback-URL"
