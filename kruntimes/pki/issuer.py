"""What a host provider hands a host it starts: a certificate directory with the host's identity,
the CA bundle, and the public key its assignments are verified with.

    <directory>/tls.crt tls.key ca.crt     kruntimes.pki.authority's layout
    <directory>/assignments.pub            the control plane's assignment key (kruntimes.pki.assignments)

`renew_due` re-issues, in every directory given, the certificates that are stale (due for renewal,
or not of the CA's current key and bundle: Authority.stale); a worker calls it periodically for
the hosts it started. Given an `AuthorityWatch`, the issuer takes up a changed CA (a rotation's
new bundle, then its new signing key) at the next certificate it issues, without a restart.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from kruntimes.pki.authority import (
    DEFAULT_LIFETIME,
    Authority,
    AuthorityError,
    AuthorityWatch,
    Issued,
    write_public,
)
from kruntimes.pki.identity import Identity

log = logging.getLogger(__name__)

ASSIGNMENT_PUBLIC_KEY = "assignments.pub"


class HostIssuer:
    def __init__(
        self,
        authority: Authority | AuthorityWatch,
        assignment_public_key: bytes,
        lifetime: dt.timedelta = DEFAULT_LIFETIME,
    ) -> None:
        """`authority`: a fixed CA, or a CA directory's watch (taken up as its files change);
        `assignment_public_key`: PEM."""
        self._authority = authority
        self.assignment_public_key = assignment_public_key
        self.lifetime = lifetime
        # one writer at a time: a renewal and an issue into one directory would mix their key and cert
        self._lock = threading.Lock()

    @property
    def authority(self) -> Authority:
        """The CA as it is now."""
        found = self._authority
        return found.current() if isinstance(found, AuthorityWatch) else found

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
        authority = self.authority
        issued = authority.issue(Identity.host(runtime=runtime, host_id=host_id), lifetime=self.lifetime)
        return {**authority.directory_files(issued), ASSIGNMENT_PUBLIC_KEY: self.assignment_public_key}

    def renew_due(self, directories: Iterable[Path], *, now: dt.datetime | None = None) -> int:
        """Re-issue the certificates due for renewal among `directories`; returns how many."""
        renewed = 0
        authority = self.authority
        for directory in directories:
            try:
                with self._lock:
                    issued = authority.renew_if_due(directory, now=now)
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
