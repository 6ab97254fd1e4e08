"""The host manager: provider look-up by name, delegation, and structured failures only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kruntimes.activities.hosts import AttachProvider, HostManager, ProcessProvider
from kruntimes.activities.hosts.base import ProviderSetup
from kruntimes.activities.hosts.registry import PROVIDERS, UNLABELLED, provider_of, started_providers
from kruntimes.config.runtimes import load_config
from kruntimes.contracts.pool import ready_host
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation
from kruntimes.pki import HostIssuer
from tests.hosts.conftest import host_record, spec
from tests.hosts.standin import StandInProvider

ROOT = Path(__file__).resolve().parents[2]


def test_duplicate_provider_names_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="duplicate host provider name: fake"):
        HostManager([StandInProvider("fake"), StandInProvider("other"), StandInProvider("fake")])


def test_provider_names_must_be_stable_lowercase_labels() -> None:
    with pytest.raises(ValueError, match="DNS-1123"):
        HostManager([StandInProvider("Fake_Provider")])


def test_every_registered_provider_is_registered_under_its_own_name() -> None:
    assert list(PROVIDERS) == ["process", "attach", "kubernetes"]
    assert all(kind.name == name for name, kind in PROVIDERS.items())


async def test_without_a_pod_runtime_the_registry_starts_the_process_and_attach_providers(
    issuer: HostIssuer, tmp_path: Path
) -> None:
    setup = ProviderSetup(
        config=load_config(None), control_plane="test", state_dir=str(tmp_path), issuer=issuer
    )
    async with started_providers(setup, client=None) as manager:
        assert manager.names == ("process", "attach")
        assert isinstance(manager.provider("attach"), AttachProvider)
        assert isinstance(manager.local("process"), ProcessProvider)
        assert manager.local("attach") is None
        assert manager.local_providers == [manager.provider("process")]


def test_a_provider_refuses_options_that_are_not_its_own_model() -> None:
    setup = ProviderSetup(config=load_config(None), control_plane="test", options={"attach": {"a": 1}})
    with pytest.raises(ValueError, match="host provider attach: options must be AttachOptions, not dict"):
        PROVIDERS["attach"].check(setup)


def test_a_host_without_a_provider_label_is_the_unlabelled_providers() -> None:
    created = host_record("attach")
    labelled = ready_host(created, capacity=1, at=created.createdAt)
    assert provider_of(labelled) == created.provider
    unlabelled = labelled.model_copy(update={"labels": {}})
    assert provider_of(unlabelled) == UNLABELLED == "process"


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


# The modules that use providers without being one: they ask for capabilities, never for a name.
USERS = ("activities/host_manager.py", "activities/reconcile.py", "workers/assembly.py", "workers/pools.py")


@pytest.mark.parametrize("path", USERS)
def test_no_provider_is_named_outside_its_own_module(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PROVIDERS
    ]
    assert named == []
