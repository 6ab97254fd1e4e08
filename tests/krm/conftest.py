from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kruntimes.krm.evaluation import Request
from kruntimes.krm.resources import resource_list
from kruntimes.krm.store import Store
from tests.krm import programs
from tests.support import waiting

IMAGE = "example.com/fn/set-labels"


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], *, timeout: float = 10.0, what: str = ""
) -> None:
    """Wait until `check()` holds, polling every 20 ms, for at most `timeout` seconds."""
    await waiting.eventually(check, within=timeout, what=what)


def function_config(name: str, *, prefixes: list[str], path: str, tags: list[str]) -> dict:
    return {
        "apiVersion": "kruntimes.io/v1alpha1",
        "kind": "FunctionConfig",
        "metadata": {"name": name},
        "spec": {"prefixes": prefixes, "binaryExecutor": {"path": path, "tags": tags}},
    }


def items() -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "two", "labels": {"owner": "x"}},
        },
    ]


def request(
    image: str = IMAGE + ":v1.0.0", *, config: dict | None = None, timeout: float = 30.0, tag: str = ""
) -> Request:
    data = resource_list(items(), function_config=config)
    return Request.new(image=image, resource_list=data, tag=tag, timeout=timeout)


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    directory = tmp_path / "functions"
    directory.mkdir()
    pids = str(tmp_path / "pids")
    programs.write(directory, "set-labels", programs.SET_LABELS)
    programs.write(directory, "validator", programs.VALIDATOR)
    programs.write(directory, "exit-1", programs.EXIT_1)
    programs.write(directory, "garbage", programs.GARBAGE)
    programs.write(directory, "echo", programs.ECHO)
    programs.write(directory, "noisy", programs.NOISY)
    programs.write(directory, "sleeper", programs.SLEEPER, pids=pids)
    programs.write(directory, "stubborn", programs.STUBBORN, pids=pids)
    programs.write(directory, "leaver", programs.LEAVER, pids=pids)
    return directory


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "pids"


def store_with(functions: Path, *binaries: str) -> Store:
    """A store where `example.com/fn/NAME` at any 1.x version runs the binary NAME."""
    from kruntimes.krm import config as fc

    store = Store(functions_dir=functions)
    store.replace(
        "test",
        [
            fc.parse(
                function_config(name, prefixes=[f"example.com/fn/{name}"], path=name, tags=["1.x"]),
                source=name,
            )
            for name in binaries
        ],
    )
    return store
