"""A HostProvider for tests that creates nothing: it records each call and answers as the test
tells it to (a failure to raise, a create held until the test releases it)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kruntimes.contracts.providers import CreatedHost, HostSpec

HOLD_BOUND_S = 30.0  # a held create waits at most this for its release


class StandInProvider:
    """A HostProvider named `name` whose every call raises `fail` when it is set."""

    def __init__(self, name: str = "standin", *, fail: BaseException | None = None) -> None:
        self.name = name
        self.fail = fail
        self.release: asyncio.Event | None = None  # set: create waits until the test releases it
        self.calls: list[tuple[str, str]] = []  # (create, delete or probe; the host id)
        self.created: list[HostSpec] = []
        self.deleted: list[tuple[str, str, str]] = []  # runtime, host id, host uid

    async def create(self, spec: HostSpec) -> CreatedHost:
        self.calls.append(("create", spec.hostId))
        self.created.append(spec)
        if self.release is not None:
            await asyncio.wait_for(self.release.wait(), HOLD_BOUND_S)
        if self.fail is not None:
            raise self.fail
        return CreatedHost(
            provider=self.name,
            runtime=spec.runtime,
            hostId=spec.hostId,
            hostUid=f"uid-{spec.hostId}",
            address="127.0.0.1:1",
            createdAt=datetime.now(UTC),
        )

    async def delete(self, *, runtime: str, host_id: str, host_uid: str) -> bool:
        self.calls.append(("delete", host_id))
        self.deleted.append((runtime, host_id, host_uid))
        if self.fail is not None:
            raise self.fail
        return True

    async def probe(self, host: CreatedHost) -> bool:
        self.calls.append(("probe", host.hostId))
        if self.fail is not None:
            raise self.fail
        return True
