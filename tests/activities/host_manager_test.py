"""kruntimes.activities.host_manager.HostActivities in an ActivityEnvironment, with a stand-in host provider:
hosts are created and deleted through the manager, slow creates heartbeat, and every provider
failure becomes an ApplicationError typed by its reason, retryable per the catalogue (or as the
provider said), with the structured ProviderFailure as its details."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.host_manager import DeleteHostInput, HostActivities
from kruntimes.activities.hosts.base import HostManager, provider_error
from kruntimes.contracts.providers import HostSpec
from kruntimes.decisions.scheduling.failures import (
    DEFAULT_RETRYABLE,
    FailureReason,
    ProviderError,
    ProviderFailure,
    ProviderOperation,
)
from tests.hosts.standin import StandInProvider


@pytest.fixture
def provider() -> StandInProvider:
    return StandInProvider()


@pytest.fixture
def manager(provider: StandInProvider) -> HostActivities:
    return HostActivities(HostManager([provider]))


def _spec(provider: str = "standin") -> HostSpec:
    return HostSpec(runtime="python", hostId="py-0", adapter="python", provider=provider, stateDir="/unused")


DELETE = DeleteHostInput(provider="standin", runtime="python", hostId="py-0", hostUid="uid-py-0")


async def _failure(run: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await run()
    return caught.value


def _failure_of(err: ApplicationError) -> ProviderFailure:
    [details] = err.details
    return ProviderFailure.model_validate(details)


async def test_a_host_is_created_through_its_provider(
    manager: HostActivities, provider: StandInProvider
) -> None:
    created = await ActivityEnvironment().run(manager.create_host, _spec())
    assert (created.provider, created.hostId, created.hostUid) == ("standin", "py-0", "uid-py-0")
    assert [s.hostId for s in provider.created] == ["py-0"]


async def test_a_slow_create_heartbeats_until_the_host_serves(
    manager: HostActivities, provider: StandInProvider
) -> None:
    provider.release = release = asyncio.Event()
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        release.set()  # the host serves once a heartbeat went out

    env.on_heartbeat = on_heartbeat
    created = await env.run(manager.create_host, _spec())
    assert created.hostId == "py-0"
    assert beats, "the activity heartbeated while the provider was creating the host"


async def test_a_host_is_deleted_through_its_provider(
    manager: HostActivities, provider: StandInProvider
) -> None:
    assert await ActivityEnvironment().run(manager.delete_host, DELETE) is True
    assert provider.deleted == [("python", "py-0", "uid-py-0")]


@pytest.mark.parametrize("reason", list(FailureReason), ids=[r.value for r in FailureReason])
async def test_a_provider_failure_is_typed_by_its_reason_retryable_per_the_catalogue_and_carries_the_failure(
    manager: HostActivities, provider: StandInProvider, reason: FailureReason
) -> None:
    provider.fail = provider_error(
        reason, provider="standin", operation=ProviderOperation.Create, host="py-0", message="it went wrong"
    )
    err = await _failure(lambda: ActivityEnvironment().run(manager.create_host, _spec()))
    assert err.type == reason.value
    assert err.non_retryable is not DEFAULT_RETRYABLE[reason]
    # the id of who asked (here the ActivityEnvironment's workflow, "test") ends every failure
    assert err.message == "standin Create py-0: it went wrong (workflow test)"
    failure = _failure_of(err)
    assert failure == provider.fail.failure._replace(message="it went wrong (workflow test)")  # type: ignore[attr-defined]
    assert (failure.reason, failure.retryable) == (reason, DEFAULT_RETRYABLE[reason])


@pytest.mark.parametrize("retryable", [True, False])
async def test_a_provider_that_says_whether_to_retry_overrides_the_catalogue(
    manager: HostActivities, provider: StandInProvider, retryable: bool
) -> None:
    reason = FailureReason.OperationFailed if not retryable else FailureReason.OperationRejected
    assert DEFAULT_RETRYABLE[reason] is not retryable
    provider.fail = provider_error(
        reason, provider="standin", operation=ProviderOperation.Create, retryable=retryable
    )
    err = await _failure(lambda: ActivityEnvironment().run(manager.create_host, _spec()))
    assert err.non_retryable is not retryable
    assert _failure_of(err).retryable is retryable


async def test_a_delete_failure_is_mapped_the_same_way(
    manager: HostActivities, provider: StandInProvider
) -> None:
    provider.fail = provider_error(
        FailureReason.ProviderUnavailable, provider="standin", operation=ProviderOperation.Delete, host="py-0"
    )
    err = await _failure(lambda: ActivityEnvironment().run(manager.delete_host, DELETE))
    assert (err.type, err.non_retryable) == ("ProviderUnavailable", False)
    assert _failure_of(err).operation is ProviderOperation.Delete


async def test_anything_else_a_provider_raises_is_an_unexpected_error_that_is_not_retried(
    manager: HostActivities, provider: StandInProvider
) -> None:
    provider.fail = OSError("disk on fire")
    err = await _failure(lambda: ActivityEnvironment().run(manager.create_host, _spec()))
    assert (err.type, err.non_retryable) == ("UnexpectedError", True)
    failure = _failure_of(err)
    assert (failure.provider, failure.operation, failure.host) == (
        "standin",
        ProviderOperation.Create,
        "py-0",
    )
    assert failure.message == "OSError: disk on fire (workflow test)"
    assert isinstance(err.__cause__, ProviderError), "wrapped at the manager's boundary"
    assert isinstance(err.__cause__.__cause__, OSError), "the provider's own error is kept as the cause"


async def test_a_provider_the_worker_does_not_have_is_not_retried(manager: HostActivities) -> None:
    err = await _failure(lambda: ActivityEnvironment().run(manager.create_host, _spec("elsewhere")))
    assert (err.type, err.non_retryable) == ("ProviderNotFound", True)
    failure = _failure_of(err)
    assert (failure.provider, failure.operation) == ("elsewhere", ProviderOperation.Select)
    assert "known: standin" in failure.message
