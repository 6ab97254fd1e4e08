"""The language adapters, described: the one list of adapter names, and for each the handler it
takes and whether a registration keeps a warm process.

This is pure data, so the API model and the platform config check names and handlers against it.
How a host starts an adapter's process and reads its answer is registered under the same name in
`kruntimes.runtime.adapters.registered`. Adding an adapter: its description here and one entry in
`ADAPTERS`, its host side in runtime/adapters/ and one entry there, its name in the Helm values
schema (tests/contracts/adapters_test.py holds all of them to this list).
"""

from __future__ import annotations

import keyword
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from kruntimes.api._text import utf8_len
from kruntimes.api.limits import MAX_HANDLER_BYTES
from kruntimes.api.names import validate_relative_file_name


@dataclass(frozen=True, slots=True, kw_only=True)
class Adapter:
    name: str
    # A registration keeps one process answering its calls (runtime/warm.py); otherwise each call
    # starts a process of its own.
    warm: bool
    # The rule of `spec.handler` for this adapter: raises ValueError naming it.
    check_handler: Callable[[str], object]

    def validate_handler(self, handler: str) -> str:
        if utf8_len(handler, field="handler") > MAX_HANDLER_BYTES:
            raise ValueError(f"handler exceeds {MAX_HANDLER_BYTES} bytes")
        self.check_handler(handler)
        return handler


def _is_python_identifier(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)


def python_handler(handler: str) -> tuple[str, str]:
    """A python handler, ``module.path:function``, as (module, function); ValueError otherwise."""
    module, sep, function = handler.partition(":")
    if not sep or ":" in function:
        raise ValueError(f"python handler {handler!r:.80} must be 'module.path:function' with one ':'")
    if not all(_is_python_identifier(part) for part in module.split(".")):
        raise ValueError(
            f"python handler {handler!r:.80}: module {module!r} is not a dotted Python identifier"
        )
    if not _is_python_identifier(function):
        raise ValueError(f"python handler {handler!r:.80}: function {function!r} is not a Python identifier")
    return module, function


def script_path(handler: str) -> str:
    """A bash handler: a script path relative to the source directory; ValueError otherwise."""
    try:
        return validate_relative_file_name(handler)
    except ValueError as e:
        raise ValueError(f"bash handler: {e}") from e


def krm_entrypoint(handler: str) -> list[str]:
    """The argv of a krm handler: a command line (shell words, no shell) whose program is an
    absolute path or a file of the source directory; ValueError otherwise."""
    try:
        words = shlex.split(handler)
    except ValueError as e:
        raise ValueError(f"krm handler {handler!r:.80} is not a command line: {e}") from e
    if not words:
        raise ValueError("krm handler must name a program")
    if not words[0].startswith("/"):
        try:
            validate_relative_file_name(words[0])
        except ValueError as e:
            raise ValueError(f"krm handler's program: {e}") from e
    return words


PYTHON = Adapter(name="python", warm=True, check_handler=python_handler)
BASH = Adapter(name="bash", warm=False, check_handler=script_path)
# A KRM function's entrypoint, run once per call (kruntimes.wire.krm is its contract).
KRM = Adapter(name="krm", warm=False, check_handler=krm_entrypoint)

# The one list of adapter names, in the order errors and schemas show them.
ADAPTERS: Mapping[str, Adapter] = MappingProxyType({a.name: a for a in (PYTHON, BASH, KRM)})

if TYPE_CHECKING:
    AdapterName = str
else:
    # pydantic sees the registered names as a Literal: its error lists them, its JSON schema is their enum
    AdapterName = Literal[tuple(ADAPTERS)]


def adapter_named(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise ValueError(f"unknown handler adapter {name!r:.80}; known: {known}") from None


def validate_handler(adapter: str, handler: str) -> str:
    """`handler` by the rule of `adapter` (python: ``module.path:function``; bash: a script path
    relative to the source directory; krm: a command line whose program is absolute or a file of
    the source directory)."""
    return adapter_named(adapter).validate_handler(handler)
