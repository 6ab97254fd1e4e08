"""kruntimes: run user functions on a pool of runtime hosts, orchestrated by Temporal.

`kruntimes.Client` is the Python SDK, exported here with its errors (kruntimes.sdk.errors draws
their tree) and results, all from kruntimes.client; `Run` is the Run model (kruntimes.api holds
the rest). Names load on first use, so `import kruntimes` stays cheap for function processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kruntimes import _lazy

if TYPE_CHECKING:
    from kruntimes.api.run import Run
    from kruntimes.client import (
        Applied,
        Busy,
        Client,
        ConfigError,
        FunctionNotFound,
        HostNotFound,
        HostView,
        InvocationFailed,
        InvokeError,
        InvokeResult,
        KruntimesError,
        NotReady,
        OutcomeUnknown,
        PayloadRejected,
        RunAlreadyExists,
        RunFailed,
        RunNotFound,
        RunObject,
        SpecConflict,
        Unauthorized,
        WaitTimeout,
    )

# Spelled out, as kruntimes.client's is (the same names and Run): a type checker takes re-exports
# only from a literal __all__, and this module must not import kruntimes.client to read its list.
# tests/sdk/public_api_test.py holds the two equal.
__all__ = [
    "Applied",
    "Busy",
    "Client",
    "ConfigError",
    "FunctionNotFound",
    "HostNotFound",
    "HostView",
    "InvocationFailed",
    "InvokeError",
    "InvokeResult",
    "KruntimesError",
    "NotReady",
    "OutcomeUnknown",
    "PayloadRejected",
    "Run",
    "RunAlreadyExists",
    "RunFailed",
    "RunNotFound",
    "RunObject",
    "SpecConflict",
    "Unauthorized",
    "WaitTimeout",
]

# Each name → the module it is imported from: the Run model, else the SDK's facade.
_LAZY: dict[str, str] = {name: "kruntimes.client" for name in __all__} | {"Run": "kruntimes.api.run"}


__getattr__ = _lazy.loader(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
