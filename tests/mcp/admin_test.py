"""`krt mcp`'s admin tools (admission, schedules, hosts) over HTTPS with the admin's token, against
the shared embedded platform, left as found: a paused queue is resumed, a schedule deleted (a
drained host is replaced by the pool, as tests/sdk/lifecycle_test.py's drain leaves it)."""

from __future__ import annotations

import re

from kruntimes.api.phases import RunPhase
from kruntimes.sdk.client import Client
from tests.mcp.conftest import ADMIN_TOKEN, CAROL_TOKEN, HttpServer, refusal, structured
from tests.sdk.moves import moved_off
from tests.sdk.stack import RUNTIME, TASK, Platform, manifest, unique
from tests.support.waiting import eventually


async def test_an_admin_pauses_a_runtimes_admission_sees_it_paused_by_them_and_resumes_it(
    platform: Platform, mcp_http: HttpServer
) -> None:
    async with mcp_http.session(ADMIN_TOKEN) as mcp:
        before = structured(await mcp.call_tool("queue_list", {"runtime": RUNTIME}))
        assert before["paused"] is False
        try:
            paused = structured(
                await mcp.call_tool("queue_pause", {"runtime": RUNTIME, "message": "maintenance"})
            )
            assert paused["paused"] is True
            view = structured(await mcp.call_tool("queue_list", {"runtime": RUNTIME}))
            assert (view["paused"], view["by"], view["message"]) == (True, "mcp:root", "maintenance")
        finally:
            resumed = await mcp.call_tool("queue_resume", {"runtime": RUNTIME, "message": "done"})
        assert structured(resumed)["paused"] is False
        async with Client(platform.config) as krt:
            assert not (await krt.queue(RUNTIME)).paused
        unknown = refusal(await mcp.call_tool("queue_list", {"runtime": "no-such-runtime"}))
        assert "no pool runs for runtime" in unknown["message"]
    log = mcp_http.log.read_text()
    assert f"queue_pause by mcp:root: runtime {RUNTIME}" in log
    assert f"queue_resume by mcp:root: runtime {RUNTIME}" in log


async def test_an_admin_creates_lists_triggers_and_deletes_a_schedule_and_a_user_may_not(
    platform: Platform, mcp_http: HttpServer
) -> None:
    name = unique("sched")
    task = manifest("template", source=TASK, mode={"task": {}}, ttlSecondsAfterFinished=300)
    started = re.compile(rf"^{re.escape(name)}-\d{{14}}$")
    async with mcp_http.session(ADMIN_TOKEN) as mcp, Client(platform.config) as krt:
        # paused and hourly: only the trigger starts a Run while the test runs
        arguments = {"name": name, "manifest": task, "everySeconds": 3600, "paused": True}
        created = structured(await mcp.call_tool("schedule_create", arguments))
        try:
            assert (created["every"], created["paused"], created["runtime"]) == ("3600s", True, RUNTIME)
            again = refusal(await mcp.call_tool("schedule_create", arguments))
            assert again["reason"] == "ScheduleAlreadyExists"
            listed = structured(await mcp.call_tool("schedule_list", {"namespace": "default"}))
            assert name in [s["name"] for s in listed["items"]]
            structured(await mcp.call_tool("schedule_trigger", {"name": name}))

            async def succeeded() -> list[str]:
                runs = [r for r in await krt.list() if started.match(r.metadata.name)]
                assert runs and runs[0].status.phase is RunPhase.Succeeded
                # the schedule's Runs record the caller who created it
                assert str(runs[0].metadata.creator) == "schedule:root"
                return [r.metadata.name for r in runs]

            [run] = await eventually(
                succeeded, within=60, every=0.2, ignoring=(AssertionError,), what="the triggered Run"
            )
            unpaused = structured(await mcp.call_tool("schedule_pause", {"name": name, "paused": False}))
            assert unpaused["paused"] is False and unpaused["note"] == "unpaused by mcp:root"
        finally:
            deleted = await mcp.call_tool("schedule_delete", {"name": name})
            for leftover in [r for r in await krt.list() if started.match(r.metadata.name)]:
                await krt.delete(leftover.metadata.name)
        assert structured(deleted)["deleted"] is True
        gone = refusal(await mcp.call_tool("schedule_trigger", {"name": name}))
        assert gone["reason"] == "ScheduleNotFound"
    async with mcp_http.session(CAROL_TOKEN) as carol:
        assert refusal(await carol.call_tool("schedule_list", {}))["reason"] == "Forbidden"
    log = mcp_http.log.read_text()
    for tool in ("schedule_create", "schedule_trigger", "schedule_delete"):
        assert f"{tool} by mcp:root: schedule/{name} -n default" in log
    assert run.startswith(name)


async def test_an_admin_drains_a_runs_host_and_the_run_moves_with_the_drain_recorded_as_theirs(
    platform: Platform, mcp_http: HttpServer
) -> None:
    name = unique("mcpdrain")
    async with mcp_http.session(ADMIN_TOKEN) as mcp, Client(platform.config) as krt:
        before = structured(await mcp.call_tool("run_create", {"manifest": manifest(name), "wait": True}))
        host, uid = before["status"]["assignedHost"], before["status"]["assignedHostUID"]
        drained = structured(await mcp.call_tool("host_drain", {"name": host, "message": "mcp test"}))
        assert (drained["accepted"], drained["state"], drained["runtime"]) == (True, "Draining", RUNTIME)
        after = await moved_off(krt, name, uid)
        assert after.endpoint is not None and after.endpoint.url == before["status"]["endpoint"]["url"]
        answer = structured(await mcp.call_tool("invoke", {"name": name, "data": {"moved": True}}))
        assert answer["outputs"]["echo"] == {"moved": True}
    assert f"host_drain by mcp:root: host/{host}" in mcp_http.log.read_text()
