"""kruntimes: run user functions on a pool of runtime hosts, orchestrated by Temporal.

`kruntimes.Client` is the Python SDK (see kruntimes.client for its errors); `kruntimes.api` holds
the Run model. Names load on first use, so `import kruntimes` stays cheap for function processes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kruntimes.api.run import Run
    from kruntimes.client import (
        Client,
        InvokeResult,
        KruntimesError,
        RunObject,
    )

_LAZY: dict[str, str] = {
    "Client": "kruntimes.client",
    "InvokeResult": "kruntimes.client",
    "KruntimesError": "kruntimes.client",
    "RunObject": "kruntimes.client",
    "Run": "kruntimes.api.run",
}

__all__ = ["Client", "InvokeResult", "KruntimesError", "Run", "RunObject"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
