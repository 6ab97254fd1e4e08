"""Changing the platform CA without cutting off a running host: a rotation in two phases.

Every component trusts its peers by the CA bundle in its `ca.crt`, and a host learns a new bundle
only when its certificate is renewed. So a new CA must be trusted everywhere before it signs
anything, and an old CA must stay trusted until nothing it signed can still be valid:

    steady     bundle = [current]; the current CA signs.
    published  (phase 1) a next CA is made and published in every trust bundle: bundle =
               [current, next], the current CA still signs. Every certificate renewed or issued
               from now on carries the two-CA bundle (a certificate whose `ca.crt` is not the
               current bundle is re-issued at its next renewal check, due or not).
    switched   (phase 2) once `switch_after` has passed — an overlap of the longest leaf
               lifetime the CA issues, plus a margin (`overlap`) — the next CA signs: bundle =
               [new current, retired]. Every certificate issued before phase 1 has expired by
               then, so each certificate still valid trusts the new CA. Certificates not signed
               by the current CA are re-issued at their next renewal check.
    dropped    once `retire_until` has passed (the switch plus the same overlap: no certificate
               the retired CA signed can still be valid), the retired CA leaves the bundle; the
               rotation is back to steady.

A rotation starts when the current CA is due (`rotation_due`: two thirds into its validity, or
earlier so that the whole rotation ends before the current CA expires), or when an operator asks
(`start=True`). A CA found expired (a platform left off for years) is replaced at once: nothing
it signed can be valid, so there is no overlap to wait for. `advance` is a pure function of the
state and the clock: running it again at the same time changes nothing.

The state (`Rotation`) is one document: the current CA (certificate and key), the next one, the
retired certificates and the three times. `to_json`/`from_json` carry it between processes; it
holds private keys (kept 0600, in a Secret). `load`/`save` keep it in a CA directory:

    ca-state.json   the state (0600): written first, by rename, so a crash loses nothing
    .ca-state.lock  held while a process reads, advances and writes the state (one at a time)
    ca.crt ca.key   the signing CA (ca.key 0600): derived from the state
    bundle.crt      the trust bundle every certificate issued carries as its ca.crt: derived

A crash between the state and the derived files is repaired by the next `ensure` (the derived
files are written again from the state; nothing is made twice). An unreadable state file is an
error, never a reason to make a new CA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kruntimes.pki import builder
from kruntimes.pki.authority import (
    BUNDLE,
    CA_CERT,
    CA_KEY,
    CA_LIFETIME,
    MAX_SKEW,
    RENEW_AFTER,
    Authority,
    AuthorityError,
    check_lifetime,
    private_directory,
    read_bundle,
    read_if_present,
    write_private,
    write_public,
)

STATE = "ca-state.json"
LOCK = ".ca-state.lock"
VERSION = 1
MAX_STATE_BYTES = 256 * 1024
MAX_RETIRED = 8


class Step(StrEnum):
    PUBLISHED = "published"  # phase 1: a next CA is in the bundle
    SWITCHED = "switched"  # phase 2: the next CA signs
    DROPPED = "dropped"  # the retired CA left the bundle


def overlap(max_leaf_lifetime: dt.timedelta) -> dt.timedelta:
    """How long each phase lasts: the longest leaf lifetime, so every leaf issued before the
    phase began has expired, plus a tenth for the renewal checks and the propagation of files
    (a Secret volume's update) that each phase waits on."""
    check_lifetime(max_leaf_lifetime)
    return max_leaf_lifetime + max_leaf_lifetime / 10


def rotation_due(ca: x509.Certificate, max_leaf_lifetime: dt.timedelta) -> dt.datetime:
    """When a rotation of `ca` starts: two thirds into its validity, or earlier so that both
    phases end before it expires."""
    start, end = ca.not_valid_before_utc, ca.not_valid_after_utc
    return min(start + (end - start) * RENEW_AFTER, end - 2 * overlap(max_leaf_lifetime))


def new_ca(now: dt.datetime, *, lifetime: dt.timedelta = CA_LIFETIME) -> Authority:
    """A new CA, valid from a little before `now` for `lifetime`; its name is its own, so a bundle
    of several CAs never holds two of one name."""
    subject = builder.name(f"kruntimes platform CA {secrets.token_hex(4)}")
    cert, key = builder.build_ca(subject, not_before=now - MAX_SKEW, not_after=now + lifetime)
    return Authority(cert, key)


@dataclass(frozen=True)
class Rotation:
    """The CA's rotation state (see the module docstring)."""

    current: Authority
    next: Authority | None = None
    retired: tuple[x509.Certificate, ...] = ()
    published_at: dt.datetime | None = None
    switch_after: dt.datetime | None = None
    retire_until: dt.datetime | None = None

    @property
    def phase(self) -> str:
        if self.next is not None:
            return "published"
        return "switched" if self.retired else "steady"

    def bundle(self) -> list[x509.Certificate]:
        """The CAs every component trusts: the current, the next, the retired ones."""
        found = [self.current.cert, *([self.next.cert] if self.next else []), *self.retired]
        return list({builder.cert_pem(c): c for c in found}.values())

    def bundle_pem(self) -> bytes:
        return b"".join(builder.cert_pem(c) for c in self.bundle())

    def authority(self) -> Authority:
        """The signing CA, handing out this rotation's bundle with every certificate."""
        return Authority(self.current.cert, self.current.key, bundle_pem=self.bundle_pem())

    def advance(
        self,
        *,
        now: dt.datetime,
        max_leaf_lifetime: dt.timedelta,
        ca_lifetime: dt.timedelta = CA_LIFETIME,
        start: bool = False,
    ) -> tuple[Rotation, list[Step]]:
        """The state at `now` and the steps taken to reach it (none: nothing to do).

        `max_leaf_lifetime` is the longest lifetime of the certificates this CA issues (hosts,
        worker, gateways); `start` begins a rotation now even if the current CA is not due."""
        span = overlap(max_leaf_lifetime)
        state, steps = self, []
        if now >= state.current.cert.not_valid_after_utc:
            # nothing the current CA signed is valid any more, so there is nothing to wait for:
            # the next CA (or a new one) signs at once, alone
            return Rotation(current=state.next or new_ca(now, lifetime=ca_lifetime)), [Step.SWITCHED]
        if state.retired and state.retire_until is None:  # kept from before rotations had state
            state = dataclasses.replace(state, retire_until=now + span)
        elif state.retired and state.retire_until is not None and now >= state.retire_until:
            state = dataclasses.replace(state, retired=(), retire_until=None)
            steps.append(Step.DROPPED)
        if state.next is None:
            if start or now >= rotation_due(state.current.cert, max_leaf_lifetime):
                state = dataclasses.replace(
                    state, next=new_ca(now, lifetime=ca_lifetime), published_at=now, switch_after=now + span
                )
                steps.append(Step.PUBLISHED)
        else:
            published = state.published_at or now
            switch_after = max(state.switch_after or published + span, published + span)
            if now >= switch_after:
                state = Rotation(
                    current=state.next,
                    retired=(state.current.cert, *state.retired)[:MAX_RETIRED],
                    retire_until=now + span,
                )
                steps.append(Step.SWITCHED)
        return state, steps

    # -- the document -----------------------------------------------------------------------------

    def to_json(self) -> bytes:
        def pair(a: Authority | None) -> dict[str, str] | None:
            if a is None:
                return None
            return {"cert": a.cert_pem.decode("ascii"), "key": builder.key_pem(a.key).decode("ascii")}

        def when(t: dt.datetime | None) -> str | None:
            return t.isoformat() if t is not None else None

        document = {
            "version": VERSION,
            "current": pair(self.current),
            "next": pair(self.next),
            "retired": [builder.cert_pem(c).decode("ascii") for c in self.retired],
            "publishedAt": when(self.published_at),
            "switchAfter": when(self.switch_after),
            "retireUntil": when(self.retire_until),
        }
        return json.dumps(document, indent=2).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Rotation:
        """The state in `data`; AuthorityError naming what is wrong (never key material)."""
        if len(data) > MAX_STATE_BYTES:
            raise AuthorityError(f"the CA state is larger than {MAX_STATE_BYTES} bytes")
        try:
            document = json.loads(data)
        except ValueError as e:
            raise AuthorityError(f"the CA state is not JSON: {e}") from e
        if not isinstance(document, dict) or document.get("version") != VERSION:
            raise AuthorityError(f"the CA state is not a version {VERSION} document")
        current = _pair(document.get("current"), "current")
        if current is None:
            raise AuthorityError("the CA state has no current CA")
        retired = document.get("retired") or []
        if not isinstance(retired, list) or len(retired) > MAX_RETIRED:
            raise AuthorityError("the CA state's retired CAs are not a short list")
        state = cls(
            current=current,
            next=_pair(document.get("next"), "next"),
            retired=tuple(_ca_cert(pem, "retired") for pem in retired),
            published_at=_time(document.get("publishedAt"), "publishedAt"),
            switch_after=_time(document.get("switchAfter"), "switchAfter"),
            retire_until=_time(document.get("retireUntil"), "retireUntil"),
        )
        if state.next is not None and (state.published_at is None or state.switch_after is None):
            raise AuthorityError("the CA state has a next CA but not when it was published and may sign")
        return state


def _ca_cert(pem: Any, what: str) -> x509.Certificate:
    if not isinstance(pem, str):
        raise AuthorityError(f"the CA state's {what} certificate is not PEM text")
    try:
        cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        cert.verify_directly_issued_by(cert)
    except (ValueError, TypeError, UnicodeError, x509.ExtensionNotFound, InvalidSignature) as e:
        raise AuthorityError(f"the CA state's {what} certificate is not a self-signed CA: {e}") from e
    if not constraints.ca:
        raise AuthorityError(f"the CA state's {what} certificate is not a CA")
    return cert


def _pair(value: Any, what: str) -> Authority | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("key"), str):
        raise AuthorityError(f"the CA state's {what} CA is not a certificate and a key")
    cert = _ca_cert(value.get("cert"), what)
    try:
        key = serialization.load_pem_private_key(value["key"].encode("ascii"), password=None)
    except (ValueError, TypeError, UnicodeError) as e:
        raise AuthorityError(f"the CA state's {what} key cannot be read") from e
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise AuthorityError(f"the CA state's {what} key does not belong to its certificate")
    return Authority(cert, key)


def _time(value: Any, what: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        found = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError) as e:
        raise AuthorityError(f"the CA state's {what} is not a time") from e
    if found.tzinfo is None:
        raise AuthorityError(f"the CA state's {what} has no time zone")
    return found


def describe(step: Step, rotation: Rotation | None) -> str:
    """One line on a step `rotation` took, for a log."""
    if step is Step.PUBLISHED and rotation is not None and rotation.switch_after is not None:
        return (
            "published the next CA in every bundle; it signs from the first check after "
            f"{rotation.switch_after:%Y-%m-%dT%H:%M:%SZ}"
        )
    if step is Step.SWITCHED and rotation is not None and rotation.retire_until is not None:
        return (
            "the next CA signs now; the previous stays in every bundle until "
            f"{rotation.retire_until:%Y-%m-%dT%H:%M:%SZ}"
        )
    if step is Step.DROPPED:
        return "dropped the previous CA from every bundle"
    return str(step)


# --- a CA directory ------------------------------------------------------------------------------


def load(directory: Path) -> Rotation | None:
    """The rotation kept in `directory`: its state file, else (a directory made before rotations)
    its ca.crt and ca.key as a steady state with the bundle.crt's other CAs retired; None when it
    holds no CA."""
    state = directory / STATE
    data = read_if_present(state)
    if data is not None:
        try:
            return Rotation.from_json(data)
        except AuthorityError as e:
            raise AuthorityError(f"{state}: {e}") from e
    if not (directory / CA_CERT).exists() and not (directory / CA_KEY).exists():
        return None
    authority = Authority.load(directory)
    others = tuple(c for c in read_bundle(authority.bundle_pem) if c != authority.cert)
    return Rotation(current=authority, retired=others[:MAX_RETIRED])


def save(directory: Path, rotation: Rotation) -> bool:
    """Keep `rotation` in `directory`: the state file first, then each derived file whose content
    differs (the key before its certificate); True if anything was written."""
    private_directory(directory)
    wanted_private = {STATE: rotation.to_json(), CA_KEY: builder.key_pem(rotation.current.key)}
    wanted_public = {CA_CERT: rotation.current.cert_pem, BUNDLE: rotation.bundle_pem()}
    written = False
    for name in (STATE, CA_KEY, CA_CERT, BUNDLE):
        data = wanted_private.get(name) or wanted_public[name]
        path = directory / name
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        (write_private if name in wanted_private else write_public)(path, data)
        written = True
    return written


def ensure(
    directory: Path,
    *,
    max_leaf_lifetime: dt.timedelta,
    now: dt.datetime | None = None,
    ca_lifetime: dt.timedelta = CA_LIFETIME,
    start: bool = False,
) -> tuple[Rotation, list[Step]]:
    """The rotation of the CA in `directory` (0700) advanced to `now`, kept there: a new CA when
    it holds none; the steps taken."""
    now = now or dt.datetime.now(dt.UTC)
    private_directory(directory)
    with _locked(directory):
        rotation = load(directory)
        if rotation is None:
            rotation = Rotation(current=new_ca(now, lifetime=ca_lifetime))
        rotation, steps = rotation.advance(
            now=now, max_leaf_lifetime=max_leaf_lifetime, ca_lifetime=ca_lifetime, start=start
        )
        save(directory, rotation)
    return rotation, steps


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One writer of the directory's rotation at a time (the platform's renewal and an operator's
    command): an exclusive lock on its lock file, held while it reads, advances and writes."""
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
