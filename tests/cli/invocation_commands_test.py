"""`krt invoke --async` and `krt invocation get|list|wait|resubmit` as a user runs them (a
subprocess) against the whole platform: what each prints, with -o json and as a table, and its
exit code."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import kruntimes
from kruntimes.api.run import Run
from kruntimes.cli import main as cli
from kruntimes.sdk.client import Client
from tests.cli.conftest import krt, one_error_line
from tests.sdk.stack import Platform, manifest, unique

# Appends a line to p['log'] for each call, then fails if asked to.
COUNTING = (
    "def handle(p):\n"
    "    with open(p['log'], 'a') as f:\n"
    "        f.write('called\\n')\n"
    "    if p.get('fail'):\n"
    "        raise ValueError('asked to fail')\n"
    "    return {'n': p.get('n')}\n"
)


async def _ready_run(platform: Platform) -> tuple[str, Path]:
    name = unique("cli-async")
    async with Client(platform.config) as client:
        await client.create(Run.from_dict(manifest(name, source=COUNTING)))
        await client.wait(name)
    exchange = platform.shared / unique("cli-async")
    exchange.mkdir()
    exchange.chmod(0o1777)
    return name, exchange / "calls"


async def test_invoke_async_prints_the_id_and_location_then_wait_get_and_list_show_it(
    platform: Platform,
) -> None:
    name, log = await _ready_run(platform)
    inv = f"cli-{uuid.uuid4().hex[:8]}"
    data = json.dumps({"log": str(log), "n": 5})
    accepted = await krt(platform, "invoke", name, "--async", "--id", inv, "-d", data)
    assert accepted.code == 0, accepted.err
    assert accepted.out.startswith(f"invocation/{inv} accepted (") and f"/invocations/{inv}" in accepted.out
    again = await krt(platform, "invoke", name, "--async", "--id", inv, "-d", data, "-o", "json")
    assert again.code == 0, again.err
    document = json.loads(again.out)
    assert document["invocationId"] == inv and document["location"].endswith(f"/invocations/{inv}")

    waited = await krt(platform, "invocation", "wait", name, inv, "--timeout", "60")
    assert waited.code == 0, waited.err
    assert waited.out.splitlines() == [f"invocation/{inv} Succeeded", '{"n": 5}'], (
        "its state, then its outputs"
    )
    got = await krt(platform, "invocation", "get", name, inv, "-o", "json")
    assert got.code == 0, got.err
    status = json.loads(got.out)
    assert status["state"] == "Succeeded" and status["result"]["outputs"] == {"n": 5}
    by_location = await krt(platform, "invocation", "get", document["location"])
    assert by_location.code == 0, by_location.err
    header, row = by_location.out.splitlines()
    assert header.split() == ["ID", "STATE", "ATTEMPTS", "REASON", "AGE"]
    assert row.split()[:4] == [inv, "Succeeded", "1", "<none>"]
    listed = await krt(platform, "invocation", "list", name, "--state", "Succeeded", "-o", "json")
    assert listed.code == 0, listed.err
    assert [i["invocationId"] for i in json.loads(listed.out)["items"]] == [inv]
    assert len(log.read_text().splitlines()) == 1, "one run for one id, however often submitted"

    missing = await krt(platform, "invocation", "get", name, "no-such-id")
    assert missing.code == 3 and "InvocationNotFound" in one_error_line(missing.err)


async def test_a_failed_invocation_waits_to_exit_1_is_listed_and_is_resubmitted(platform: Platform) -> None:
    name, log = await _ready_run(platform)
    inv = f"cli-fail-{uuid.uuid4().hex[:8]}"
    data = json.dumps({"log": str(log), "fail": True})
    accepted = await krt(platform, "invoke", name, "--async", "--invocation-id", inv, "-d", data)
    assert accepted.code == 0, accepted.err
    waited = await krt(platform, "invocation", "wait", name, inv, "--timeout", "60")
    assert waited.code == 1, waited.err
    assert waited.out.startswith(f"invocation/{inv} Failed: ")
    dead = await krt(platform, "invocation", "list", name, "--state", "Failed", "-o", "wide")
    assert dead.code == 0, dead.err
    lines = dead.out.splitlines()
    assert lines[0].split() == [
        "ID",
        "STATE",
        "ATTEMPTS",
        "REASON",
        "AGE",
        "STARTED",
        "ENDED",
        "EXPIRES",
        "RETRIED",
    ]
    assert [line.split()[0] for line in lines[1:]] == [inv]
    resubmitted = await krt(
        platform, "invocation", "resubmit", name, inv, "--new-id", f"{inv}-2", "-o", "json"
    )
    assert resubmitted.code == 0, resubmitted.err
    assert json.loads(resubmitted.out)["invocationId"] == f"{inv}-2"
    again = await krt(platform, "invocation", "wait", name, f"{inv}-2", "-o", "json", "--timeout", "60")
    assert again.code == 1 and json.loads(again.out)["state"] == "Failed"
    assert len(log.read_text().splitlines()) == 2, "the resubmission ran once more"


REFUSALS: list[tuple[BaseException, int, str]] = [
    (kruntimes.InvocationConflict(409, "InvocationConflict", "x", invocation_id="i"), 1, "another --id"),
    (
        kruntimes.AsyncBacklogFull(429, "AsyncBacklogFull", "x", invocation_id="i", retry_after=7),
        1,
        "submit it again with the same --id in 7 s",
    ),
    (
        kruntimes.AsyncUnavailable(503, "AsyncUnavailable", "x", invocation_id="i", retry_after=2),
        1,
        "nothing was recorded",
    ),
    (
        kruntimes.InvocationNotFound(404, "InvocationNotFound", "x", invocation_id="i"),
        3,
        "krt invocation list NAME",
    ),
    (kruntimes.WaitTimeout("invocation 'i' is still Running after 5 s"), 1, "krt invocation get"),
]


@pytest.mark.parametrize(("error", "code", "says"), REFUSALS, ids=[type(e[0]).__name__ for e in REFUSALS])
def test_each_async_refusal_has_its_exit_code_and_says_what_to_do(
    error: BaseException, code: int, says: str
) -> None:
    got, message = cli.explain(error)
    assert got == code and says in message
    assert message.startswith(("invocation i: ", "invocation 'i'")), "it names the invocation"


def test_an_invocation_named_by_neither_id_nor_location_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KRT_STATE_DIR", str(tmp_path))  # refused before any connection
    assert cli.run(["invocation", "get", "hello"]) == 2
    assert "ID is required" in one_error_line(capsys.readouterr().err)
