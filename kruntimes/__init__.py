"""kruntimes: run user functions on a pool of runtime hosts, orchestrated by Temporal.

`kruntimes.Client` is the Python SDK, exported here with its errors (kruntimes.sdk.errors draws
their tree) and results, all from kruntimes.sdk.client; `Run` is the Run model (kruntimes.api holds
the rest). Names load on first use, so `import kruntimes` stays cheap for function processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kruntimes import _lazy

if TYPE_CHECKING:
    from kruntimes.api.run import Run as Run

    # kruntimes.sdk.client.__all__ is the one list of the SDK's names; the package exports them all.
    from kruntimes.sdk.client import *  # noqa: F403

# Run from the model; every name kruntimes.sdk.client.__all__ lists, from it (`__all__` included).
__getattr__ = _lazy.loader(__name__, {"Run": "kruntimes.api.run"}, globals(), rest="kruntimes.sdk.client")


def __dir__() -> list[str]:
    exported: list[str] = __getattr__("__all__")
    return sorted({*globals(), *exported})
