"""Names a package exports but loads on first use (a module `__getattr__`), so that importing the
package stays cheap: a function process imports `kruntimes` without the SDK or the whole model."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def loader(
    package: str, modules: Mapping[str, str], namespace: dict[str, Any], *, rest: str | None = None
) -> Callable[[str], Any]:
    """The `__getattr__` of ``package``: ``modules`` maps each name loaded on first use to the
    module it comes from; ``rest`` names a module whose ``__all__`` lists the package's other
    exports, so that the list is written once, there (it is loaded by the first of those names,
    and by the package's own ``__all__``; not by a submodule's name, which ``from package import
    submodule`` asks for before it imports the submodule). A loaded name is kept in ``namespace``
    (the package's globals), so it is looked up there from then on."""

    def rest_exports() -> list[str]:
        return list(importlib.import_module(rest).__all__) if rest is not None else []

    def in_rest(name: str) -> bool:
        if rest is None or name.startswith("_"):
            return False
        return importlib.util.find_spec(f"{package}.{name}") is None and name in rest_exports()

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            value: Any = sorted({*modules, *rest_exports()})
            namespace[name] = value
            return value
        module = modules.get(name)
        if module is None and in_rest(name):
            module = rest
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
