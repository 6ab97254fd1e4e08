"""The platform CA's two-phase rotation as state and files: the phases and their timing with the
clock injected, idempotence, the state kept in a CA directory surviving a crash at every point of
its writes, and a partial or tampered bundle refused by the readers (the worker's AuthorityWatch,
every component's PeerTLS), which keep what they had."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from kruntimes.pki import (
    BUNDLE,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    Authority,
    AuthorityError,
    AuthorityWatch,
    HostIssuer,
    Identity,
    PeerTLS,
    Role,
)
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.authority import read_bundle
from kruntimes.pki.rotation import STATE, Rotation, Step

LEAF = dt.timedelta(days=30)
SPAN = ca_rotation.overlap(LEAF)
HOST = Identity.host(runtime="python", host_id="python-0")
NOW = dt.datetime.now(dt.UTC)


def certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def test_the_phases_follow_one_another_at_their_times_and_each_is_taken_once() -> None:
    start = Rotation(current=ca_rotation.new_ca(NOW))
    old = start.current.cert
    due = ca_rotation.rotation_due(old, LEAF)
    assert due == old.not_valid_before_utc + (old.not_valid_after_utc - old.not_valid_before_utc) * 2 / 3

    assert start.advance(now=due - dt.timedelta(seconds=1), max_leaf_lifetime=LEAF) == (start, [])
    published, steps = start.advance(now=due, max_leaf_lifetime=LEAF)
    assert steps == [Step.PUBLISHED] and published.phase == "published"
    assert published.next is not None
    assert published.current.cert == old and published.authority().cert == old  # still signs
    assert published.bundle() == [old, published.next.cert]
    assert published.switch_after == due + SPAN
    # again at the same time, or any time before the overlap passed: nothing more
    for when in (due, due + SPAN - dt.timedelta(seconds=1)):
        assert published.advance(now=when, max_leaf_lifetime=LEAF) == (published, [])

    switched, steps = published.advance(now=due + SPAN, max_leaf_lifetime=LEAF)
    assert steps == [Step.SWITCHED] and switched.phase == "switched"
    assert switched.current.cert == published.next.cert and switched.next is None
    assert switched.bundle() == [published.next.cert, old]
    assert switched.retire_until == due + 2 * SPAN
    assert switched.advance(now=due + 2 * SPAN - dt.timedelta(seconds=1), max_leaf_lifetime=LEAF) == (
        switched,
        [],
    )

    dropped, steps = switched.advance(now=due + 2 * SPAN, max_leaf_lifetime=LEAF)
    assert steps == [Step.DROPPED] and dropped.phase == "steady"
    assert dropped.bundle() == [published.next.cert]
    # the whole rotation ends well before the old CA expires
    assert due + 2 * SPAN < old.not_valid_after_utc


def test_a_rotation_starts_early_enough_to_end_before_a_short_lived_ca_expires() -> None:
    short = Rotation(current=ca_rotation.new_ca(NOW, lifetime=dt.timedelta(days=150)))
    due = ca_rotation.rotation_due(short.current.cert, LEAF)
    assert due == short.current.cert.not_valid_after_utc - 2 * SPAN
    assert short.advance(now=due, max_leaf_lifetime=LEAF)[1] == [Step.PUBLISHED]


def test_an_operator_starts_a_rotation_once_and_the_overlap_follows_the_longest_lifetime() -> None:
    start = Rotation(current=ca_rotation.new_ca(NOW))
    published, steps = start.advance(now=NOW, max_leaf_lifetime=LEAF, start=True)
    assert steps == [Step.PUBLISHED]
    assert published.advance(now=NOW, max_leaf_lifetime=LEAF, start=True) == (published, [])
    # a longer lifetime configured meanwhile postpones the switch to cover it
    longer = dt.timedelta(days=90)
    assert published.advance(now=NOW + SPAN, max_leaf_lifetime=longer)[1] == []
    assert published.advance(now=NOW + ca_rotation.overlap(longer), max_leaf_lifetime=longer)[1] == [
        Step.SWITCHED
    ]


def test_the_state_document_round_trips_and_a_damaged_one_is_refused_without_key_material() -> None:
    published, _ = Rotation(current=ca_rotation.new_ca(NOW)).advance(
        now=NOW, max_leaf_lifetime=LEAF, start=True
    )
    switched, _ = published.advance(now=NOW + SPAN, max_leaf_lifetime=LEAF)
    for state in (published, switched):
        again = Rotation.from_json(state.to_json())
        assert again.to_json() == state.to_json() and again.bundle() == state.bundle()
    document = published.to_json()
    other = ca_rotation.new_ca(NOW)
    wrong_key = document.replace(
        published.current.cert_pem.decode().replace("\n", "\\n").encode(),
        other.cert_pem.decode().replace("\n", "\\n").encode(),
    )
    for damaged, says in (
        (document[: len(document) // 2], "not JSON"),
        (b'{"version": 2}', "not a version 1 document"),
        (b'{"version": 1}', "no current CA"),
        (wrong_key, "does not belong to its certificate"),
        (document.replace(b'"publishedAt": "', b'"publishedAt": null, "x": "'), "not when it was published"),
    ):
        with pytest.raises(AuthorityError) as caught:
            Rotation.from_json(damaged)
        assert says in str(caught.value)
        assert "PRIVATE KEY" not in str(caught.value)


def files(directory: Path) -> dict[str, bytes]:
    return {n: (directory / n).read_bytes() for n in (STATE, CA_KEY, CA_CERT, BUNDLE)}


def test_a_ca_directory_keeps_the_state_first_and_the_derived_files_private(tmp_path: Path) -> None:
    ca = tmp_path / "pki"
    state, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert steps == [] and state.phase == "steady"
    assert stat.S_IMODE(os.stat(ca).st_mode) == 0o700
    for private in (STATE, CA_KEY):
        assert stat.S_IMODE(os.stat(ca / private).st_mode) == 0o600
    assert Authority.load(ca).bundle_pem == (ca / BUNDLE).read_bytes() == state.bundle_pem()
    kept = files(ca)
    stamps = {n: os.stat(ca / n).st_mtime_ns for n in kept}
    assert ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)[1] == []
    assert files(ca) == kept and {n: os.stat(ca / n).st_mtime_ns for n in kept} == stamps  # nothing rewritten


def test_a_directory_made_before_rotations_is_taken_as_it_is(tmp_path: Path) -> None:
    ca = tmp_path / "pki"
    legacy = Authority.ensure(ca)  # ca.crt and ca.key only
    state, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert steps == [] and state.current.cert == legacy.cert
    assert (ca / CA_CERT).read_bytes() == legacy.cert_pem and (ca / BUNDLE).read_bytes() == legacy.cert_pem


@pytest.mark.parametrize("written", range(1, 5))
def test_a_crash_at_any_point_of_a_step_resumes_without_taking_it_twice(tmp_path: Path, written: int) -> None:
    """The switch writes the state, then ca.key, ca.crt and bundle.crt (each by rename); a process
    killed after `written` of them left the others as they were, and a temporary file cut short.
    The next run completes the step it finds in the state, and takes no other."""
    ca = tmp_path / "pki"
    ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    published, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, start=True)
    before = files(ca)
    switched, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, now=published.switch_after)
    assert steps == [Step.SWITCHED]
    after = files(ca)
    for name in [STATE, CA_KEY, CA_CERT, BUNDLE][written:]:
        (ca / name).write_bytes(before[name])  # the crash: not written yet
    (ca / f".{CA_KEY}.999.tmp").write_bytes(after[CA_KEY][:40])
    resumed, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, now=published.switch_after)
    assert steps == [], "the step is not taken again"
    assert resumed.to_json() == switched.to_json()
    assert files(ca) == after
    assert Authority.load(ca).cert == switched.current.cert


def test_a_crash_in_the_first_phase_keeps_the_next_ca_it_made(tmp_path: Path) -> None:
    ca = tmp_path / "pki"
    steady, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    before = files(ca)
    published, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, start=True)
    assert steps == [Step.PUBLISHED]
    for name in (CA_KEY, CA_CERT, BUNDLE):  # killed right after the state file
        (ca / name).write_bytes(before[name])
    resumed, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert steps == [] and resumed.next is not None and published.next is not None
    assert resumed.next.cert == published.next.cert
    assert certs((ca / BUNDLE).read_bytes()) == [steady.current.cert, published.next.cert]


def test_an_unreadable_state_is_an_error_never_a_new_ca(tmp_path: Path) -> None:
    ca = tmp_path / "pki"
    ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    kept = files(ca)
    (ca / STATE).write_bytes(kept[STATE][:100])
    with pytest.raises(AuthorityError) as caught:
        ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert str(caught.value).startswith(f"{ca / STATE}: the CA state is not JSON")
    assert {n: (ca / n).read_bytes() for n in (CA_KEY, CA_CERT, BUNDLE)} == {
        n: kept[n] for n in (CA_KEY, CA_CERT, BUNDLE)
    }


def test_the_worker_takes_up_the_new_bundle_then_the_new_key_and_refuses_a_partial_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = tmp_path / "pki"
    steady, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    watch = AuthorityWatch(ca)
    issuer = HostIssuer(watch, b"-----BEGIN PUBLIC KEY-----\n", LEAF)
    host = tmp_path / "host"
    issuer.issue(host, runtime="python", host_id="python-0")
    assert issuer.renew_due([host]) == 0

    published, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, start=True)
    assert issuer.authority.bundle_pem == published.bundle_pem()
    assert issuer.renew_due([host]) == 1, "a host whose ca.crt is not the bundle is re-issued"
    assert (host / CA_CERT).read_bytes() == published.bundle_pem()
    x509.load_pem_x509_certificate((host / TLS_CERT).read_bytes()).verify_directly_issued_by(
        steady.current.cert
    )
    assert issuer.renew_due([host]) == 0

    # a bundle.crt cut short (a writer that does not rename) is refused; the previous CA kept
    good = (ca / BUNDLE).read_bytes()
    (ca / BUNDLE).write_bytes(good[: len(good) - 200])
    with caplog.at_level(logging.WARNING, logger="kruntimes.pki.authority"):
        assert watch.current().bundle_pem == published.bundle_pem()
    assert "the platform CA files changed but cannot be used; keeping the previous" in caplog.text
    (ca / BUNDLE).write_bytes(good)

    switched, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, now=published.switch_after)
    assert issuer.authority.cert == switched.current.cert
    assert issuer.renew_due([host]) == 1, "a host the old CA signed is re-issued by the new one"
    assert published.next is not None
    x509.load_pem_x509_certificate((host / TLS_CERT).read_bytes()).verify_directly_issued_by(
        published.next.cert
    )


def tampered(pem: bytes) -> bytes:
    """`pem` with one byte of its last certificate's body changed (its signature no longer holds)."""
    lines = pem.split(b"\n")
    i = len(lines) - 4
    lines[i] = lines[i][:10] + (b"A" if lines[i][10:11] != b"A" else b"B") + lines[i][11:]
    return b"\n".join(lines)


@pytest.mark.parametrize("damage", ["partial", "tampered", "empty", "a leaf"])
def test_a_component_refuses_a_damaged_bundle_and_keeps_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    ca = tmp_path / "pki"
    ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    published, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF, start=True)
    authority = published.authority()
    host = tmp_path / "host"
    authority.write(host, HOST, lifetime=LEAF)
    clock = [0.0]
    tls = PeerTLS(host, role=Role.HOST, check_interval_s=1.0, clock=lambda: clock[0])
    serial = tls.serial
    good = (host / CA_CERT).read_bytes()
    bad = {
        "partial": good[: len(good) // 2 + 20],
        "tampered": tampered(good),
        "empty": b"",
        "a leaf": good + (host / TLS_CERT).read_bytes(),
    }[damage]
    (host / CA_CERT).write_bytes(bad)
    with pytest.raises(ValueError):
        read_bundle(bad)
    clock[0] += 2
    with caplog.at_level(logging.WARNING, logger="kruntimes.pki.material"):
        assert tls.refresh() is False
    assert "certificate files changed but cannot be used; keeping the previous" in caplog.text
    assert tls.serial == serial and tls.generation == 0
    # repaired: taken up at the next look
    authority.write(host, HOST, lifetime=LEAF)
    clock[0] += 2
    assert tls.refresh() is True and tls.serial != serial


def test_krt_pki_rotate_ca_starts_a_rotation_once_and_ca_status_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kruntimes.workers import pki as command

    ca = tmp_path / "pki"
    assert command.main(["rotate-ca", "--ca-dir", str(ca)]) == 1
    assert f"krt pki: {ca} holds no CA" in capsys.readouterr().err
    steady, _ = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert command.main(["ca-status", "--ca-dir", str(ca), "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["phase"], shown["bundle"], shown["nextStep"]) == ("steady", 1, "publish")

    assert command.main(["rotate-ca", "--ca-dir", str(ca)]) == 0
    assert "platform CA rotation: published the next CA in every bundle" in capsys.readouterr().out
    state = ca_rotation.load(ca)
    assert state is not None and state.next is not None and state.current.cert == steady.current.cert
    assert certs((ca / BUNDLE).read_bytes()) == [steady.current.cert, state.next.cert]
    kept = files(ca)
    assert command.main(["rotate-ca", "--ca-dir", str(ca)]) == 0
    assert "a rotation is under way already (published); nothing done" in capsys.readouterr().out
    assert files(ca) == kept
    assert command.main(["ca-status", "--ca-dir", str(ca)]) == 0
    text = capsys.readouterr().out
    assert "phase      published (2 CA(s) in the bundle)" in text
    assert f"next step  switch, from {state.switch_after:%Y-%m-%dT%H:%M:%SZ}" in text
    assert "PRIVATE KEY" not in text


def test_an_expired_ca_is_replaced_at_once_by_the_next_one_or_a_new_one() -> None:
    steady = Rotation(current=ca_rotation.new_ca(NOW))
    expired = steady.current.cert.not_valid_after_utc
    replaced, steps = steady.advance(now=expired, max_leaf_lifetime=LEAF)
    assert steps == [Step.SWITCHED] and replaced.phase == "steady"
    assert replaced.current.cert != steady.current.cert and replaced.bundle() == [replaced.current.cert]
    published, _ = steady.advance(now=NOW, max_leaf_lifetime=LEAF, start=True)
    assert published.next is not None
    switched, steps = published.advance(now=expired, max_leaf_lifetime=LEAF)
    assert steps == [Step.SWITCHED] and switched.bundle() == [published.next.cert]


ROTATE_FOREVER = """
import datetime as dt, sys
from pathlib import Path
from kruntimes.pki import rotation
directory, lifetime = Path(sys.argv[1]), dt.timedelta(days=30)
rotation.ensure(directory, max_leaf_lifetime=lifetime)
now = dt.datetime.now(dt.UTC)
print("rotating", flush=True)
while True:
    rotation.ensure(directory, max_leaf_lifetime=lifetime, now=now, start=True)
    now += rotation.overlap(lifetime)
"""


@pytest.mark.parametrize("after_s", [0.05, 0.2, 0.4])
def test_a_process_killed_while_it_rotates_leaves_a_state_the_next_run_completes(
    tmp_path: Path, after_s: float
) -> None:
    """A process taking step after step (the clock moved along each time) is killed with SIGKILL
    wherever it is; the state it left reads, and the next run only writes the derived files the
    state says, taking no step."""
    ca = tmp_path / "pki"
    proc = subprocess.Popen(
        [sys.executable, "-c", ROTATE_FOREVER, str(ca)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"rotating\n"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=after_s)  # it runs until killed
        assert proc.poll() is None, "it rotates until killed"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    left = ca_rotation.load(ca)
    assert left is not None
    resumed, steps = ca_rotation.ensure(ca, max_leaf_lifetime=LEAF)
    assert steps == [] and resumed.to_json() == left.to_json()
    authority = Authority.load(ca)
    assert authority.cert == left.current.cert and authority.bundle_pem == left.bundle_pem()
