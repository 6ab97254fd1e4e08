"""What a host provider hands a host it starts: a certificate directory with the host's identity,
the CA bundle, and the public key its assignments are verified with.

    <directory>/tls.crt tls.key ca.crt     kruntimes.pki.authority's layout
    <directory>/assignments.pub            the control plane's assignment key (kruntimes.assignments)

`renew_due` re-issues, in every directory given, the certificates due for renewal (two thirds of
their validity passed); a worker calls it periodically for the hosts it started.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kruntimes.pki.authority import (
    CA_CERT,
    DEFAULT_LIFETIME,
    TLS_CERT,
    TLS_KEY,
    Authority,
    AuthorityError,
    Issued,
    write_public,
)
from kruntimes.pki.identity import Identity

log = logging.getLogger(__name__)

ASSIGNMENT_PUBLIC_KEY = "assignments.pub"


@dataclass(frozen=True)
class HostIssuer:
    authority: Authority
    assignment_public_key: bytes  # PEM
    lifetime: dt.timedelta = DEFAULT_LIFETIME
    # one writer at a time: a renewal and an issue into one directory would mix their key and cert
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def issue(
        self,
        directory: Path,
        *,
        runtime: str,
        host_id: str,
        ip_addresses: Iterable[str] = ("127.0.0.1",),
        dns_names: Iterable[str] = ("localhost",),
    ) -> Issued:
        """Write the files of host `runtime/host_id` into `directory` (0700, its key 0600)."""
        with self._lock:
            issued = self.authority.write(
                directory,
                Identity.host(runtime=runtime, host_id=host_id),
                lifetime=self.lifetime,
                dns_names=dns_names,
                ip_addresses=ip_addresses,
            )
            write_public(directory / ASSIGNMENT_PUBLIC_KEY, self.assignment_public_key)
        return issued

    def files(self, *, runtime: str, host_id: str) -> dict[str, bytes]:
        """The same files as `issue` writes, in memory (for a Secret): name -> content."""
        issued = self.authority.issue(Identity.host(runtime=runtime, host_id=host_id), lifetime=self.lifetime)
        return {
            TLS_CERT: issued.cert_pem,
            TLS_KEY: issued.key_pem,
            CA_CERT: self.authority.cert_pem,
            ASSIGNMENT_PUBLIC_KEY: self.assignment_public_key,
        }

    def renew_due(self, directories: Iterable[Path], *, now: dt.datetime | None = None) -> int:
        """Re-issue the certificates due for renewal among `directories`; returns how many."""
        renewed = 0
        for directory in directories:
            try:
                with self._lock:
                    issued = self.authority.renew_if_due(directory, now=now)
            except AuthorityError as e:
                log.warning("cannot renew a host certificate: %s", e)
                continue
            if issued is not None:
                renewed += 1
                log.info(
                    "host certificate renewed",
                    extra={"identity": str(issued.identity), "not_after": issued.not_after.isoformat()},
                )
        return renewed
