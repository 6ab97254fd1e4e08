"""The error trees the catalogue's tests walk."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def tree(root: type[T]) -> list[type[T]]:
    """`root` and every class below it."""
    found: list[type[T]] = []
    todo: list[type[T]] = [root]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found
