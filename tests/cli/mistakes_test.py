"""Mistakes that can never succeed end at once, with one line that says what is wrong: through the
real `krt` CLI against a real platform.

A registration its host refuses for the Run's own source or handler (an import or syntax error, a
source path that is missing or outside the allowed roots) fails the Run at attempt 1, whatever
its retry policy; a runtime that does not exist is refused at create, naming those that do.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from kruntimes.api.run import Run
from kruntimes.sdk.client import Client, RunNotFound, RuntimeNotFound
from tests.cli.conftest import krt, one_error_line
from tests.sdk.stack import RUNTIME, Platform, manifest, unique

RETRIES = '{"limit": 5, "backoffSeconds": 1, "maxBackoffSeconds": 1}'  # what would be spent


def _source(tmp_path: Path, main: str) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.py").write_text(main)
    return source


async def _failed_at_once(platform: Platform, name: str, *create: str) -> str:
    """`krt run create NAME ... --wait`: its one error line, once the Run is known to have failed at
    attempt 1."""
    done = await krt(platform, "run", "create", name, "--runtime", RUNTIME, *create, "--wait")
    assert done.code == 1, done
    errors = [
        line for line in done.err.splitlines() if not line.startswith(f"run/{name}: ")
    ]  # --wait's progress
    line = one_error_line("\n".join(errors))
    got = await krt(platform, "run", "get", name, "-o", "json")
    status = json.loads(got.out)["status"]
    assert (status["phase"], status["attempt"]) == ("Failed", 1), status
    return line


async def test_a_handler_module_that_does_not_exist_fails_at_the_first_attempt(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("mian")
    source = _source(tmp_path, "def handle(p):\n    return p\n")
    line = await _failed_at_once(platform, name, "--source", str(source), "--handler", "mian:handle")
    assert line.startswith(
        f"krt: run '{name}' ended Failed: HandlerLoadFailed: cannot import 'mian': No module named 'mian'; "
    )


async def test_a_syntax_error_fails_at_the_first_attempt_naming_the_file_and_line(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("syntax")
    source = _source(tmp_path, "def handle(p)\n    return p\n")
    line = await _failed_at_once(platform, name, "--source", str(source), "--handler", "main:handle")
    assert (
        "ended Failed: HandlerLoadFailed: cannot import 'main': SyntaxError: expected ':' (main.py, line 1);"
        in line
    )


async def test_an_import_error_in_the_source_names_its_line(platform: Platform, tmp_path: Path) -> None:
    name = unique("imports")
    source = _source(tmp_path, "\nimport requestz\ndef handle(p):\n    return p\n")
    line = await _failed_at_once(platform, name, "--source", str(source), "--handler", "main:handle")
    assert "HandlerLoadFailed: cannot import 'main': No module named 'requestz' (main.py, line 2);" in line


async def test_a_source_outside_the_allowed_roots_fails_at_the_first_attempt(platform: Platform) -> None:
    name = unique("outside")
    line = await _failed_at_once(platform, name, "--source", "/etc", "--handler", "main:handle")
    assert "ended Failed: SourceInvalid: source path '/etc' is not under an allowed source root" in line


async def test_a_source_path_that_is_gone_fails_at_the_first_attempt(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("gone")
    run = manifest(name, retryPolicy=json.loads(RETRIES))
    run["spec"]["source"] = {"path": str(tmp_path / "not-there")}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    applied = await krt(platform, "apply", "-f", str(path))
    assert applied.code == 0, applied
    done = await krt(platform, "run", "wait", name, "--for", "Failed")
    assert done.code in (0, 1), done
    got = json.loads((await krt(platform, "run", "get", name, "-o", "json")).out)["status"]
    assert (got["phase"], got["attempt"]) == ("Failed", 1), got
    ready = next(c for c in got["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "SourceInvalid" and "not-there" in got["message"], got


async def test_a_handler_that_is_not_module_colon_function_is_refused_before_any_run(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("nocolon")
    source = _source(tmp_path, "def handle(p):\n    return p\n")
    done = await krt(
        platform, "run", "create", name, "--runtime", RUNTIME, "--source", str(source), "--handler", "main"
    )
    assert done.code == 2, done
    assert "spec.handler: python handler 'main' must be 'module.path:function'" in one_error_line(done.err)
    assert (await krt(platform, "run", "get", name)).code == 3


async def test_a_runtime_that_does_not_exist_is_refused_at_create_listing_those_that_do(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("typo")
    source = _source(tmp_path, "def handle(p):\n    return p\n")
    done = await krt(
        platform,
        "run",
        "create",
        name,
        "--runtime",
        "pyhton",
        "--source",
        str(source),
        "--handler",
        "main:handle",
    )
    assert done.code == 1, done
    assert one_error_line(done.err) == f"krt: no runtime 'pyhton' is configured; the runtimes are: {RUNTIME}"
    assert (await krt(platform, "run", "get", name)).code == 3, "no Run was started"


async def test_the_sdk_refuses_an_unknown_runtime_with_the_list(platform: Platform) -> None:
    name = unique("typo")
    document = manifest(name)
    document["spec"]["runtime"] = "pyhton"
    run = Run.from_dict(document)
    async with Client(platform.config) as client:
        with pytest.raises(RuntimeNotFound) as refused:
            await client.create(run)
        assert (refused.value.runtime, refused.value.runtimes) == ("pyhton", (RUNTIME,))
        with pytest.raises(RunNotFound):
            await client.get(name)


async def test_a_schedule_of_a_runtime_that_does_not_exist_is_refused(platform: Platform) -> None:
    name = unique("typo")
    document = manifest(name, mode={"task": {}})
    document["spec"]["runtime"] = "pyhton"
    async with Client(platform.config) as client:
        with pytest.raises(RuntimeNotFound):
            await client.schedules.create(
                name, Run.from_dict(document), namespace="default", every=timedelta(hours=1)
            )
        assert name not in [s.name for s in await client.schedules.list("default")]
