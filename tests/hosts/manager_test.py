"""The host manager: provider look-up by name, delegation, and structured failures only."""

from __future__ import annotations

from pathlib import Path

import pytest

from kruntimes.activities.hosts import AttachProvider, HostManager, default_manager
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation
from kruntimes.pki import HostIssuer
from tests.hosts.conftest import host_record, spec
from tests.hosts.standin import StandInProvider


def test_duplicate_provider_names_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="duplicate host provider name: fake"):
        HostManager([StandInProvider("fake"), StandInProvider("other"), StandInProvider("fake")])


def test_provider_names_must_be_stable_lowercase_labels() -> None:
    with pytest.raises(ValueError, match="DNS-1123"):
        HostManager([StandInProvider("Fake_Provider")])


def test_the_default_manager_has_the_process_and_attach_providers(issuer: HostIssuer) -> None:
    manager = default_manager(issuer=issuer)

    assert manager.names == ("process", "attach")
    assert isinstance(manager.provider("attach"), AttachProvider)


@pytest.mark.parametrize("name", ["kubernetes", "Not A Name"])
def test_an_unknown_provider_is_a_structured_not_found_failure(name: str) -> None:
    with pytest.raises(ProviderError) as caught:
        HostManager([StandInProvider("fake")]).provider(name)

    failure = caught.value.failure
    assert (failure.reason, failure.retryable) == (FailureReason.ProviderNotFound, False)
    assert failure.operation is ProviderOperation.Select
    assert name in failure.message


async def test_create_of_an_unknown_provider_fails_before_any_provider_is_called(tmp_path: Path) -> None:
    fake = StandInProvider("fake")

    with pytest.raises(ProviderError) as caught:
        await HostManager([fake]).create(spec(tmp_path, provider="kubernetes"))

    assert (caught.value.failure.provider, caught.value.reason) == (
        "kubernetes",
        FailureReason.ProviderNotFound,
    )
    assert fake.calls == []


async def test_calls_go_to_the_provider_the_spec_or_host_names(tmp_path: Path) -> None:
    one, two = StandInProvider("one"), StandInProvider("two")
    manager = HostManager([one, two])

    host = await manager.create(spec(tmp_path, provider="two"))
    assert await manager.probe(host)
    assert await manager.delete(provider="two", runtime="python", host_id="python-0", host_uid="uid-1")

    assert one.calls == []
    assert two.calls == [("create", "python-0"), ("probe", "python-0"), ("delete", "python-0")]


async def test_library_errors_from_a_provider_become_unexpected_errors_with_their_cause(
    tmp_path: Path,
) -> None:
    boom = RuntimeError("boom")
    manager = HostManager([StandInProvider("fake", fail=boom)])
    host = host_record("fake")

    calls = [
        (manager.create(spec(tmp_path, provider="fake", tenant="tenant-a")), ProviderOperation.Create),
        (
            manager.delete(provider="fake", runtime="python", host_id="python-0", host_uid="u"),
            ProviderOperation.Delete,
        ),
        (manager.probe(host), ProviderOperation.Status),
    ]
    for call, operation in calls:
        with pytest.raises(ProviderError) as caught:
            await call
        failure = caught.value.failure
        assert (failure.reason, failure.retryable) == (FailureReason.UnexpectedError, False)
        assert (failure.provider, failure.operation, failure.host) == ("fake", operation, "python-0")
        assert failure.message == "RuntimeError: boom"
        assert caught.value.__cause__ is boom


async def test_provider_errors_pass_through_unchanged(tmp_path: Path) -> None:
    from kruntimes.activities.hosts import provider_error

    error = provider_error(FailureReason.CircuitOpen, provider="fake", operation=ProviderOperation.Create)
    manager = HostManager([StandInProvider("fake", fail=error)])

    with pytest.raises(ProviderError) as caught:
        await manager.create(spec(tmp_path, provider="fake"))

    assert caught.value is error
    assert caught.value.retryable


def test_host_ids_are_dns_labels_so_they_cannot_escape_the_state_directory(tmp_path: Path) -> None:
    for bad in ("../etc", "a/b", "Python-0", "x.ready", ""):
        with pytest.raises(ValueError, match="hostId"):
            spec(tmp_path, bad)
