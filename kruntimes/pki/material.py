"""A component's certificate directory as TLS material for both ends, reloaded when it changes.

`PeerTLS(directory, role=...)` reads `tls.crt`, `tls.key` and `ca.crt` (kruntimes.pki.authority),
checks that the key belongs to the certificate and that the certificate names an identity of the
expected role, and builds from them:

    server_credentials()    grpc server credentials that require a client certificate of the CA;
                            dynamic: each new handshake sees the current files
    channel_credentials()   grpc channel credentials with this component's certificate
    channel_options(expect) the channel options that make grpc verify the server as `expect` (an
                            Identity, or any member of a Role) instead of by its address
    server_context()        an ssl.SSLContext requiring client certificates; the same object,
                            loaded in place with the current files (call it where it is used)
    client_context()        an ssl.SSLContext with this component's certificate, verifying the
                            server's DNS name (`server_hostname=expect.dns_name`)

`refresh()` looks at the files at most once per `check_interval_s` and reloads them when their
modification time, size or inode changed; a mismatched or unreadable set (a writer between its two
renames, a broken Secret, a ca.crt that is not a whole bundle of self-signed CAs: partial or
tampered) is refused with a warning and the previous material stays in use. A new CA added to
ca.crt (a CA rotation's first phase) is trusted by new connections from then on.
Established connections keep their session; new connections get the new certificate. A CA
removed from `ca.crt` stays in a running ssl server context's store (OpenSSL only adds to it), so
an ssl server also asks `issued_by_current_ca(peer)` of each connection it accepts; grpc servers
and every client drop it at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from kruntimes.pki.authority import CA_CERT, TLS_CERT, TLS_KEY, file_stamps, read_bundle
from kruntimes.pki.identity import Identity, IdentityError, Role, identity_of, role_dns_name

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
MAX_FILE_BYTES = 256 * 1024  # a certificate chain, a key or a CA bundle


class PeerTLSError(Exception):
    """The certificate directory cannot be used (missing, unreadable, mismatched, wrong identity)."""


@dataclass(frozen=True)
class _Material:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    identity: Identity
    serial: int
    not_after: str
    cas: tuple[x509.Certificate, ...]  # the CAs of ca.crt, parsed


def _read(path: Path) -> bytes:
    with path.open("rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise PeerTLSError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return data


def _load(directory: Path, role: Role) -> _Material:
    try:
        cert_pem, key_pem, ca_pem = (_read(directory / n) for n in (TLS_CERT, TLS_KEY, CA_CERT))
    except OSError as e:
        raise PeerTLSError(f"cannot read the certificate directory {directory}: {e.strerror or e}") from e
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as e:
        raise PeerTLSError(f"{directory}: not PEM certificates and key: {e}") from e
    try:
        cas = tuple(read_bundle(ca_pem))
    except ValueError as e:
        raise PeerTLSError(f"{directory}: {CA_CERT} is not a bundle of CAs: {e}") from e
    if key.public_key() != cert.public_key():
        raise PeerTLSError(f"{directory}: {TLS_KEY} does not belong to {TLS_CERT}")
    try:
        identity = identity_of(cert)
    except IdentityError as e:
        raise PeerTLSError(f"{directory}: {e}") from e
    if identity.role is not role:
        raise PeerTLSError(f"{directory}: the certificate names {identity}, not a {role}")
    return _Material(
        cert_pem, key_pem, ca_pem, identity, cert.serial_number, cert.not_valid_after_utc.isoformat(), cas
    )


_TLS_FILES = (TLS_CERT, TLS_KEY, CA_CERT)


@contextlib.contextmanager
def _as_files(*blobs: bytes) -> Iterator[list[str]]:
    """Paths the ssl module can load `blobs` from without writing key material to a disk: anonymous
    memory files (Linux), else a private temporary directory removed at once."""
    if hasattr(os, "memfd_create"):
        fds = []
        try:
            for blob in blobs:
                fd = os.memfd_create("krt-tls", getattr(os, "MFD_CLOEXEC", 0))
                fds.append(fd)
                os.write(fd, blob)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="krt-tls-") as tmp:
        paths = []
        for i, blob in enumerate(blobs):
            path = os.path.join(tmp, str(i))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            paths.append(path)
        yield paths


_heap_ready = False


def _keep_tls_reads_on_the_heap() -> None:
    """uvloop reads each TLS record into a fresh 256 KiB buffer that is shrunk afterwards. glibc
    serves an allocation that large with mmap until its dynamic mmap threshold has been raised —
    which happens only when such a block is freed whole — so until then every record costs an
    mmap, an mremap and an munmap (more CPU than the record itself, for the life of a process
    whose one TLS connection is its only one). Freeing one 1 MiB block raises the
    threshold above that size once, for the whole process."""
    global _heap_ready
    if not _heap_ready:
        block = bytearray(1 << 20)
        del block
        _heap_ready = True


def _load_chain(context: ssl.SSLContext, material: _Material) -> None:
    with _as_files(material.cert_pem, material.key_pem) as (cert, key):
        context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=material.ca_pem.decode("ascii"))


class PeerTLS:
    """One component's platform certificate (see the module docstring). Thread-safe."""

    def __init__(
        self,
        directory: Path,
        *,
        role: Role,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.role = role
        self._interval = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = file_stamps(directory, _TLS_FILES)
        self._material = _load(directory, role)
        self._next_check = clock() + check_interval_s
        self.generation = 0
        self._client: tuple[int, ssl.SSLContext] | None = None
        self._server: ssl.SSLContext | None = None
        self._server_generation = -1
        self._server_lock = threading.Lock()

    @property
    def identity(self) -> Identity:
        return self._material.identity

    @property
    def serial(self) -> int:
        """The serial number of the certificate in use."""
        return self._material.serial

    def refresh(self) -> bool:
        """Reload the files if they changed (looked at once per check interval); True if reloaded."""
        now = self._clock()
        if now < self._next_check:
            return False
        with self._lock:
            if now < self._next_check:
                return False
            self._next_check = now + self._interval
            stamp = file_stamps(self.directory, _TLS_FILES)
            if stamp == self._stamp:
                return False
            try:
                material = _load(self.directory, self.role)
            except PeerTLSError as e:
                log.warning("certificate files changed but cannot be used; keeping the previous: %s", e)
                return False  # the stamp is not taken: looked at again next interval
            self._stamp = stamp
            if material.identity != self._material.identity:
                log.error(
                    "refused a certificate for another identity",
                    extra={"directory": str(self.directory), "identity": str(material.identity)},
                )
                return False
            if material == self._material:
                return False
            self._material = material
            self.generation += 1
        log.info(
            "certificate reloaded",
            extra={
                "identity": str(material.identity),
                "serial": f"{material.serial:x}",
                "not_after": material.not_after,
            },
        )
        return True

    def issued_by_current_ca(self, peer_der: bytes | None) -> bool:
        """Whether a peer's certificate (DER, as `getpeercert(binary_form=True)` gives it) was
        signed by a CA of the current `ca.crt`: an ssl server's context still trusts a CA removed
        from it since, so a server asks this of every connection its handshake let in."""
        if not peer_der:
            return False
        try:
            cert = x509.load_der_x509_certificate(peer_der)
        except ValueError:
            return False
        for ca in self._material.cas:
            if ca.subject != cert.issuer:
                continue
            try:
                cert.verify_directly_issued_by(ca)
            except (InvalidSignature, TypeError, ValueError):
                continue
            return True
        return False

    # -- grpc -------------------------------------------------------------------------------------

    def _server_configuration(self, material: _Material) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key_pem, material.cert_pem)], root_certificates=material.ca_pem
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials of a grpc server that requires client certificates of the CA; every new
        handshake looks for new files."""
        self.refresh()
        served = {"material": self._material}

        def fetch() -> grpc.ServerCertificateConfiguration:  # None (no change) too: grpc allows it
            self.refresh()
            material = self._material
            if material is served["material"]:
                return None  # type: ignore[return-value]
            served["material"] = material
            return self._server_configuration(material)

        return grpc.dynamic_ssl_server_credentials(
            self._server_configuration(self._material), fetch, require_client_authentication=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials of a grpc channel presenting this component's current certificate."""
        self.refresh()
        m = self._material
        return grpc.ssl_channel_credentials(
            root_certificates=m.ca_pem, private_key=m.key_pem, certificate_chain=m.cert_pem
        )

    @staticmethod
    def channel_options(expect: Identity | Role) -> list[tuple[str, str]]:
        """grpc channel options that verify the server as `expect` (its DNS name) rather than by
        the address dialled."""
        name = expect.dns_name if isinstance(expect, Identity) else role_dns_name(expect)
        return [("grpc.ssl_target_name_override", name), ("grpc.default_authority", name)]

    # -- ssl --------------------------------------------------------------------------------------

    def server_context(self) -> ssl.SSLContext:
        """The ssl context of a server that requires client certificates of the CA, loaded with the
        current files. The same object every call: call this where connections are accepted, in
        the thread that accepts them."""
        self.refresh()
        with self._server_lock:
            if self._server is None:
                _keep_tls_reads_on_the_heap()
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.verify_mode = ssl.CERT_REQUIRED
                self._server = context
            with self._lock:
                material, generation = self._material, self.generation
            if self._server_generation != generation:
                _load_chain(self._server, material)
                self._server_generation = generation
            return self._server

    def client_context(self) -> ssl.SSLContext:
        """An ssl client context presenting this component's current certificate; it verifies the
        server's certificate names the `server_hostname` given with each connection."""
        self.refresh()
        with self._server_lock:
            with self._lock:
                material, generation = self._material, self.generation
            cached = self._client
            if cached is not None and cached[0] == generation:
                return cached[1]
            _keep_tls_reads_on_the_heap()
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            _load_chain(context, material)
            self._client = (generation, context)
            return context
