"""Names a package exports but loads on first use (a module `__getattr__`), so that importing the
package stays cheap: a function process imports `kruntimes` without the SDK or the whole model."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def loader(package: str, modules: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The `__getattr__` of ``package``: ``modules`` maps each name loaded on first use to the
    module it comes from; a loaded name is kept in ``namespace`` (the package's globals), so it is
    looked up there from then on."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
