"""The SDK's public names: exactly these, each resolving to its one definition (no platform)."""

from __future__ import annotations

import subprocess
import sys

import kruntimes
import kruntimes.sdk.client
from kruntimes.api.run import Run

# Each exported error → the exported error it derives from, as kruntimes.sdk.errors draws the tree.
ERROR_TREE = {
    "KruntimesError": "Exception",
    "ConfigError": "KruntimesError",
    "RunNotFound": "KruntimesError",
    "HostNotFound": "KruntimesError",
    "RunAlreadyExists": "KruntimesError",
    "RuntimeNotFound": "KruntimesError",
    "SpecConflict": "KruntimesError",
    "FunctionConflict": "KruntimesError",
    "WaitTimeout": "KruntimesError",
    "RunFailed": "KruntimesError",
    "InvokeError": "KruntimesError",
    "Busy": "InvokeError",
    "AsyncBacklogFull": "Busy",
    "FunctionNotFound": "InvokeError",
    "NotReady": "InvokeError",
    "AsyncUnavailable": "NotReady",
    "InvocationConflict": "InvokeError",
    "InvocationNotFound": "InvokeError",
    "Unauthorized": "InvokeError",
    "PayloadRejected": "InvokeError",
    "OutcomeUnknown": "InvokeError",
    "InvocationFailed": "InvokeError",
}
ERRORS = set(ERROR_TREE)
RESULTS = {
    "Applied",
    "AsyncInvocation",
    "FunctionApplied",
    "FunctionObject",
    "HostView",
    "Invocation",
    "InvokeResult",
    "RunObject",
}


def test_kruntimes_exports_the_client_its_errors_and_results_and_run() -> None:
    assert kruntimes.__all__ == sorted(kruntimes.__all__)
    assert set(kruntimes.__all__) == {"Client", "Run", *ERRORS, *RESULTS}
    assert len(kruntimes.__all__) == len(set(kruntimes.__all__))


def test_kruntimes_client_exports_the_client_its_errors_and_results() -> None:
    assert kruntimes.sdk.client.__all__ == sorted(kruntimes.sdk.client.__all__)
    assert set(kruntimes.sdk.client.__all__) == {"Client", *ERRORS, *RESULTS}


def test_each_exported_name_resolves_to_its_one_definition() -> None:
    for name in kruntimes.sdk.client.__all__:
        value = getattr(kruntimes, name)
        assert value is getattr(kruntimes.sdk.client, name), name
        assert value.__name__ == name
        assert (
            value.__module__
            == {
                "Client": "kruntimes.sdk.client",
                **dict.fromkeys(ERRORS, "kruntimes.sdk.errors"),
                **dict.fromkeys(RESULTS, "kruntimes.sdk.results"),
            }[name]
        )
    assert kruntimes.Run is Run
    assert set(kruntimes.__all__) <= set(dir(kruntimes))


def test_every_error_stands_where_the_tree_draws_it() -> None:
    for name, parent in ERROR_TREE.items():
        error = getattr(kruntimes, name)
        nearest = next(base for base in error.__mro__[1:] if base.__name__ in {*ERROR_TREE, "Exception"})
        assert nearest.__name__ == parent, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(kruntimes, "NoSuchName")


def _printed(code: str) -> list[str]:
    """What ``code`` prints in a fresh interpreter, split into words."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_importing_kruntimes_stays_cheap_and_exports_client_lazily() -> None:
    code = (
        "import sys, kruntimes; from kruntimes.system import logs; from kruntimes import api;"  # submodules, asked of the package first
        "print('temporalio' in sys.modules, 'kruntimes.sdk.client' in sys.modules);"
        "print(kruntimes.Client.__module__)"
    )
    assert _printed(code) == ["False", "False", "kruntimes.sdk.client"]


def test_importing_the_client_module_loads_no_client_library() -> None:
    code = "import sys, kruntimes.sdk.client; print(*(m in sys.modules for m in ('temporalio', 'aiohttp', 'grpc')))"
    assert _printed(code) == ["False", "False", "False"]
