"""The process provider against real host processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from kruntimes.activities.hosts import CreatedHost, ProcessProvider, list_records, stop_all
from kruntimes.activities.hosts import process as process_module
from kruntimes.activities.hosts.process import host_running
from kruntimes.decisions.scheduling.failures import (
    FailureReason,
    ProviderError,
    ProviderFailure,
    ProviderOperation,
)
from kruntimes.pki import HostIssuer, Identity, identity_of, renewal_due
from tests.hosts.conftest import gone, host_pids, host_record, killed_host, spec
from tests.support.pki import TestPKI
from tests.support.procs import alive
from tests.support.waiting import eventually


def files_of(state_dir: Path, runtime: str = "python") -> list[str]:
    directory = state_dir / "hosts" / runtime
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _failed_leaving_its_log(error: ProviderError, state_dir: Path) -> ProviderFailure:
    """A create that failed retryably and left nothing of python-0 but its log: its failure."""
    failure = error.failure
    assert (failure.reason, failure.retryable) == (FailureReason.OperationFailed, True)
    assert files_of(state_dir) == ["python-0.log"]
    assert host_pids(state_dir) == []
    return failure


async def test_create_starts_a_serving_host_on_loopback_and_records_it(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))

    assert host.provider == "process"
    assert (host.runtime, host.hostId) == ("python", "python-0")
    assert host.address.startswith("127.0.0.1:")
    assert host.pid is not None and alive(host.pid)
    assert host.createdAt.tzinfo is not None
    record = state_dir / "hosts" / "python" / "python-0.json"
    assert CreatedHost.model_validate_json(record.read_text()) == host
    ready = json.loads((state_dir / "hosts" / "python" / "python-0.ready.json").read_text())
    assert ready == {
        "pid": host.pid,
        "address": host.address,
        "hostUid": host.hostUid,
        "isolation": host.isolation,
    }
    assert "own uid per function" in host.isolation, "the host says which isolation is in force"
    assert files_of(state_dir) == [
        "python-0.json",
        "python-0.log",
        "python-0.pid",
        "python-0.ready.json",
        "python-0.tls",
    ]
    certificates = state_dir / "hosts" / "python" / "python-0.tls"
    assert stat.S_IMODE(certificates.stat().st_mode) == 0o700
    assert stat.S_IMODE((certificates / "tls.key").stat().st_mode) == 0o600
    assert identity_of(
        x509.load_pem_x509_certificate((certificates / "tls.crt").read_bytes())
    ) == Identity.host(runtime="python", host_id="python-0")
    assert await process.probe(host)
    assert list_records(state_dir) == [host]


async def test_creating_the_same_host_again_returns_the_running_one(
    issuer: HostIssuer, state_dir: Path, process: ProcessProvider
) -> None:
    first = await process.create(spec(state_dir))
    second = await process.create(spec(state_dir))
    third = await ProcessProvider(issuer=issuer).create(spec(state_dir))

    assert first == second == third
    assert host_pids(state_dir) == [first.pid]


async def test_concurrent_creates_of_one_host_start_one_process(
    state_dir: Path, process: ProcessProvider
) -> None:
    hosts = await asyncio.gather(*(process.create(spec(state_dir)) for _ in range(3)))

    assert len(set(hosts)) == 1
    assert host_pids(state_dir) == [hosts[0].pid]


async def test_delete_stops_the_host_and_a_second_delete_finds_nothing(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    assert host.pid is not None

    assert await process.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
    assert not alive(host.pid)
    assert files_of(state_dir) == ["python-0.log"]
    assert not await process.probe(host)
    assert not await process.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)


async def test_the_host_exits_cleanly_on_delete_and_removes_its_workspaces(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    assert (state_dir / "work" / host.hostUid).is_dir()

    await process.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)

    assert not (state_dir / "work" / host.hostUid).exists()


async def test_delete_of_another_incarnation_leaves_the_running_host_alone(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))

    assert not await process.delete(runtime="python", host_id="python-0", host_uid="an-older-incarnation")
    assert await process.probe(host)
    assert list_records(state_dir) == [host]


async def test_a_killed_host_is_replaced_by_create(state_dir: Path, process: ProcessProvider) -> None:
    old = await killed_host(process, state_dir)

    new = await process.create(spec(state_dir))

    assert new.pid != old.pid
    assert new.hostUid != old.hostUid
    assert await process.probe(new)
    assert not await process.probe(old)
    assert list_records(state_dir) == [new]
    assert not await process.delete(runtime="python", host_id="python-0", host_uid=old.hostUid)
    assert await process.probe(new)


async def test_a_provider_given_the_state_directory_deletes_hosts_it_did_not_create(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    restarted = ProcessProvider(state_dir=state_dir)

    assert await restarted.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
    assert await gone(host.pid)


async def test_delete_without_a_known_state_directory_is_rejected() -> None:
    with pytest.raises(ProviderError) as caught:
        await ProcessProvider().delete(runtime="python", host_id="python-0", host_uid="u")

    assert caught.value.reason is FailureReason.OperationRejected
    assert not caught.value.retryable


async def test_delete_rejects_names_that_are_not_labels(state_dir: Path) -> None:
    with pytest.raises(ProviderError) as caught:
        await ProcessProvider(state_dir=state_dir).delete(runtime="python", host_id="../x", host_uid="u")

    assert caught.value.failure.operation is ProviderOperation.Delete
    assert caught.value.reason is FailureReason.OperationRejected


async def test_delete_never_signals_a_recycled_pid(state_dir: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        directory = state_dir / "hosts" / "python"
        directory.mkdir(parents=True)
        record = host_record("process", pid=stranger.pid, createdAt="2026-01-01T00:00:00Z")
        (directory / "python-0.json").write_text(record.model_dump_json())

        deleted = await ProcessProvider(state_dir=state_dir).delete(
            runtime="python", host_id="python-0", host_uid="uid-1"
        )

        assert not deleted
        assert stranger.poll() is None
        assert list_records(state_dir) == []
    finally:
        stranger.kill()
        stranger.wait()


async def test_a_host_that_exits_at_once_fails_retryably_and_leaves_nothing_running(
    issuer: HostIssuer,
    state_dir: Path,
) -> None:
    with pytest.raises(ProviderError) as caught:
        await ProcessProvider(python="/bin/false", issuer=issuer).create(spec(state_dir))

    failure = _failed_leaving_its_log(caught.value, state_dir)
    assert (failure.provider, failure.operation, failure.host) == (
        "process",
        ProviderOperation.Create,
        "python-0",
    )
    assert "exited with status 1" in failure.message


async def test_a_host_that_cannot_use_its_state_directory_fails_with_its_log_tail(
    state_dir: Path, process: ProcessProvider
) -> None:
    state_dir.mkdir()
    (state_dir / "work").write_text("not a directory")

    with pytest.raises(ProviderError) as caught:
        await process.create(spec(state_dir, tenant="tenant-a"))

    failure = _failed_leaving_its_log(caught.value, state_dir)
    assert failure.tenant == "tenant-a"
    assert "NotADirectoryError" in failure.message


async def test_a_state_directory_that_cannot_be_created_is_rejected(
    tmp_path: Path, process: ProcessProvider
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")

    with pytest.raises(ProviderError) as caught:
        await process.create(spec(not_a_directory))

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.OperationRejected, False)


async def test_a_missing_python_is_rejected(state_dir: Path, issuer: HostIssuer) -> None:
    with pytest.raises(ProviderError) as caught:
        await ProcessProvider(python=str(state_dir / "no-such-python"), issuer=issuer).create(spec(state_dir))

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.OperationRejected, False)


def stalling_python(directory: Path) -> Path:
    """A "python" that never becomes ready: it and a child in its process group sleep."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "stall.sh"
    script.write_text(
        f"#!/bin/sh\necho starting\nsleep 60 &\necho $! > {directory}/child.pid\n"
        f"echo $$ > {directory}/main.pid\nexec sleep 60\n"
    )
    script.chmod(0o755)
    return script


async def wait_for(path: Path) -> int:
    written = await eventually(
        lambda: path.read_text().strip(), every=0.05, ignoring=(FileNotFoundError,), what=f"{path}"
    )
    return int(written)


async def test_a_host_that_is_not_ready_in_time_is_killed_with_its_process_group(
    state_dir: Path, tmp_path: Path, issuer: HostIssuer
) -> None:
    python = stalling_python(tmp_path / "bin")

    with pytest.raises(ProviderError) as caught:
        await ProcessProvider(python=str(python), start_timeout_s=1, issuer=issuer).create(spec(state_dir))

    failure = caught.value.failure
    assert (failure.reason, failure.retryable) == (FailureReason.ReadinessTimeout, True)
    assert "starting" in failure.message
    for name in ("main.pid", "child.pid"):
        assert await gone(int((tmp_path / "bin" / name).read_text()), seconds=5), name
    assert files_of(state_dir) == ["python-0.log"]


async def test_a_create_cancelled_while_starting_kills_the_process(
    issuer: HostIssuer, state_dir: Path, tmp_path: Path
) -> None:
    python = stalling_python(tmp_path / "bin")
    task = asyncio.create_task(ProcessProvider(python=str(python), issuer=issuer).create(spec(state_dir)))
    main = await wait_for(tmp_path / "bin" / "main.pid")

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert await gone(main, seconds=5)
    assert await gone(await wait_for(tmp_path / "bin" / "child.pid"), seconds=5)
    assert files_of(state_dir) == ["python-0.log"]


@pytest.mark.parametrize("reused", [False, True], ids=["its own pid", "a pid an earlier host had"])
async def test_an_unfinished_start_left_by_a_dead_worker_is_replaced(
    state_dir: Path, process: ProcessProvider, reused: bool
) -> None:
    """An orphan host a dead worker left half-started is found by its pid file and replaced.
    Pids are reused (here many times a suite): also when the orphan runs under a pid an earlier
    host of this worker had, whose process was reaped long ago (the provider once took the old
    host's exit for the orphan's, and left it running)."""
    directory = state_dir / "hosts" / "python"
    directory.mkdir(parents=True)
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--host-id", "python-0"]
        + ["--ready-file", str(directory / "python-0.ready.json")],
        start_new_session=True,
    )
    if reused:
        earlier = subprocess.Popen(["true"])
        earlier.wait()
        process_module._CHILDREN[orphan.pid] = earlier  # as if the earlier host had had this pid
    try:
        (directory / "python-0.pid").write_text(str(orphan.pid))

        host = await process.create(spec(state_dir))

        assert orphan.wait(timeout=15) is not None
        assert host_pids(state_dir) == [host.pid]
    finally:
        process_module._CHILDREN.pop(orphan.pid, None)
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


async def test_list_records_and_stop_all_cover_every_runtime(
    state_dir: Path, process: ProcessProvider
) -> None:
    python = await process.create(spec(state_dir))
    bash = await process.create(spec(state_dir, "bash-0", runtime="bash", adapter="bash"))

    assert list_records(state_dir) == [bash, python]
    assert host_running(bash) and host_running(python)
    assert await stop_all(state_dir) == 2
    assert not host_running(bash) and not host_running(python)
    assert not host_running(python.model_copy(update={"pid": None}))
    assert list_records(state_dir) == []
    assert host_pids(state_dir) == []
    assert await stop_all(state_dir) == 0


async def test_create_refuses_without_a_certificate_issuer(state_dir: Path) -> None:
    with pytest.raises(ProviderError) as caught:
        await ProcessProvider().create(spec(state_dir))
    assert caught.value.failure.reason == FailureReason.OperationRejected
    assert host_pids(state_dir) == []


async def test_host_certificates_are_renewed_once_due(state_dir: Path, pki: TestPKI) -> None:
    """Issued for 12 s, the host's certificate is due after 8 s: renewing then re-issues it (a new
    serial, the same identity) and the running host serves with the new one. (A shorter lifetime
    expires before a host on a loaded machine has started with it.)"""
    provider = ProcessProvider(start_timeout_s=30, issuer=pki.issuer(lifetime=dt.timedelta(seconds=12)))
    host = await provider.create(spec(state_dir))
    directory = state_dir / "hosts" / "python" / "python-0.tls"
    first = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
    assert provider.renew_certificates() == 0  # not due yet
    due = renewal_due(first)
    await eventually(
        lambda: dt.datetime.now(dt.UTC) >= due,
        within=(due - dt.datetime.now(dt.UTC)).total_seconds() + 5,  # bounded by the certificate's lifetime
        every=0.05,
        what="the certificate's renewal to come due",
    )
    assert provider.renew_certificates() == 1
    second = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
    assert second.serial_number != first.serial_number
    assert identity_of(second) == identity_of(first)
    assert second.not_valid_after_utc > first.not_valid_after_utc
    assert await provider.probe(host)


async def test_a_host_starts_with_a_scrubbed_environment(
    state_dir: Path, process: ProcessProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the worker's environment that could be a secret reaches a host, so a host's
    /proc/<pid>/environ (its initial environment, for as long as it runs) holds none."""
    secret = "worker-env-secret-7c1b"
    monkeypatch.setenv("KRT_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    environ = Path(f"/proc/{host.pid}/environ").read_bytes()
    assert secret.encode() not in environ
    names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
    assert names <= {"PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}, names
