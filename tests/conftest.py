"""Fixtures shared by the test folders that use them (pytest creates them only when asked)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from kruntimes.activities.hosts._rpc import use_peer_tls
from kruntimes.temporal.devserver import DevServer
from tests.sdk.stack import Platform, delete_runs, failing_pool_tasks, shared_platform
from tests.support.pki import TestPKI


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """The session's platform CA and assignment key; channels the control plane makes to hosts
    (kruntimes.activities.hosts._rpc.host_channel) present its control-plane certificate."""
    created = TestPKI.create(tmp_path_factory.mktemp("pki"))
    use_peer_tls(created.control_plane)
    return created


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One Temporal dev server for the session's tests that start their own workers."""
    server = DevServer(state_dir=tmp_path_factory.mktemp("temporal"), persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
async def session_platform(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    """One embedded platform (`krt up --detach`) for the SDK and CLI suites."""
    async with shared_platform(tmp_path_factory, pki) as started:
        yield started


@pytest.fixture
async def platform(session_platform: Platform) -> AsyncIterator[Platform]:
    """The shared platform; the Runs a test leaves are deleted after it. A Temporal worker of it
    that stopped on its own was started again (SupervisedWorkers), and fails the test it stopped
    during (or the next one to use the platform) with what ended."""
    _no_worker_ended(session_platform, "before this test")
    yield session_platform
    await delete_runs(session_platform)
    _no_worker_ended(session_platform, "during this test")
    stuck = await failing_pool_tasks(session_platform)
    if stuck:
        pytest.fail("; ".join(stuck))


def _no_worker_ended(platform: Platform, when: str) -> None:
    ended = platform.workers.take_endings()
    if ended:
        pytest.fail(f"the shared platform's workers were started again {when}: {'; '.join(ended)}")


# The folders whose files take longest start first, so that split over two processes (make test:
# pytest-xdist, a file at a time) no long file is left running alone at the end.
_FIRST = (
    "kubernetes",
    "embedded",
    "workflows",
    "cli",
    "sdk",
    "helm",
    "chaos",
    "e2e",
    "krm",
    "hosts",
    "workers",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        parts = item.nodeid.split("/")
        folder = parts[1] if len(parts) > 2 else ""
        return _FIRST.index(folder) if folder in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order
