"""`krt queue` as a user runs it (a subprocess) against the cli suite's shared platform."""

from __future__ import annotations

import getpass
import json

from tests.cli.conftest import krt
from tests.sdk.stack import Platform


async def test_queue_pause_list_and_resume_say_who_paused_and_why(platform: Platform) -> None:
    done = await krt(platform, "queue", "pause", "python", "-m", "maintenance")
    try:
        assert done.code == 0, done.err
        assert done.out.startswith("runtime python: paused (paused, ")
        listed = await krt(platform, "queue", "list", "python", "-o", "json")
        assert listed.code == 0, listed.err
        view = json.loads(listed.out)
        assert (view["paused"], view["message"], view["by"]) == (True, "maintenance", getpass.getuser())
    finally:
        resumed = await krt(platform, "queue", "resume", "python", "-m", "done")
    assert resumed.code == 0, resumed.err
    assert resumed.out.startswith("runtime python: resumed (admitting, ")
    listed = await krt(platform, "queue", "list", "python")
    assert listed.out.startswith("runtime python: admitting, ")
