"""FunctionConfigs from a watched directory: changes apply to the next evaluation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kruntimes.krm import errors
from kruntimes.krm.directory import DirectoryFeed
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.resources import dump, dump_all, parse_resource_list
from kruntimes.krm.store import Store
from tests.krm.conftest import eventually, function_config, request

IMAGE = "example.com/fn/labels:v1.0.0"


def config(path: str) -> dict:
    return function_config("labels", prefixes=["example.com/fn/labels"], path=path, tags=["1.x"])


def binary_of(store: Store) -> str | None:
    try:
        return store.binary(IMAGE, "").path.name
    except errors.NotFound:
        return None


@pytest.fixture
async def feed(tmp_path: Path, functions: Path) -> AsyncIterator[DirectoryFeed]:
    directory = tmp_path / "configs"
    directory.mkdir()
    feed = DirectoryFeed(Store(functions_dir=functions), directory, interval=0.05)
    task = asyncio.create_task(feed.run())
    yield feed
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_changed_file_takes_effect_without_restart(feed: DirectoryFeed) -> None:
    evaluator = ExecEvaluator(feed.store)
    path = feed.directory / "labels.yaml"
    path.write_text(dump(config("set-labels")))
    await eventually(lambda: binary_of(feed.store) == "set-labels", what="the first version is read")
    await evaluator.evaluate(request(IMAGE))

    path.write_text(dump(config("exit-1")))  # same size, likely the same mtime tick
    await eventually(lambda: binary_of(feed.store) == "exit-1", what="the rewrite is read")
    with pytest.raises(errors.FunctionFailed):
        await evaluator.evaluate(request(IMAGE))

    path.unlink()
    await eventually(lambda: binary_of(feed.store) is None, what="the removal is read")
    with pytest.raises(errors.NotFound):
        await evaluator.evaluate(request(IMAGE))


async def test_a_file_may_hold_several_function_configs(feed: DirectoryFeed) -> None:
    other = function_config("echo", prefixes=["example.com/fn/echo"], path="echo", tags=["1.x"])
    (feed.directory / "all.yml").write_text(dump_all([config("set-labels"), other]))
    await eventually(lambda: len(feed.store.configs()) == 2)
    evaluation = await ExecEvaluator(feed.store).evaluate(request("example.com/fn/echo:1.0.0"))
    assert len(parse_resource_list(evaluation.resource_list)["items"]) == 2


async def test_an_invalid_file_is_reported_and_its_last_valid_contents_kept(feed: DirectoryFeed) -> None:
    path = feed.directory / "labels.yaml"
    path.write_text(dump(config("set-labels")))
    await eventually(lambda: binary_of(feed.store) == "set-labels")
    broken = config("exit-1")
    broken["spec"]["binaryExecutor"]["tags"] = ["not a version!"]
    path.write_text(dump(broken))
    await eventually(lambda: bool(feed.store.errors()), what="the error is reported")
    (where, problem) = next(iter(feed.store.errors().items()))
    assert where == str(path) and "spec.binaryExecutor.tags" in problem
    assert binary_of(feed.store) == "set-labels"
    path.write_text(dump(config("echo")))
    await eventually(lambda: binary_of(feed.store) == "echo" and not feed.store.errors())


async def test_hidden_files_and_other_extensions_are_not_read(tmp_path: Path, functions: Path) -> None:
    directory = tmp_path / "configs"
    (directory / "..data").mkdir(parents=True)
    (directory / "..data" / "labels.yaml").write_text(dump(config("echo")))
    (directory / ".hidden.yaml").write_text(dump(config("echo")))
    (directory / "notes.txt").write_text("not yaml: [")
    (directory / "labels.yaml").symlink_to(directory / "..data" / "labels.yaml")
    store = Store(functions_dir=functions)
    DirectoryFeed(store, directory).scan()
    assert [c.key for c in store.configs()] == ["labels"]
    assert store.errors() == {}
