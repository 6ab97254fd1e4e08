"""An async invocation's callback (docs/async-invocations.md, "Callbacks"): one HTTPS POST of its
status to the callback URL, signed with the target's Secret (kruntimes.sdk.callbacks). The
InvocationWorkflow calls `deliver_callback` and retries it with backoff itself; this activity never
raises for a delivery that failed, it answers a CallbackOutcome saying why.

Before anything leaves the worker:
- the URL is HTTPS (kruntimes.api.spec.validate_callback_url);
- the key: the target's creator must be allowed the Secret (the role bindings' `use-secrets`,
  with the host's own decision and audit line: kruntimes.config.secret_access);
- the host is resolved once, and every address it resolves to is checked: loopback, private,
  link-local (cloud metadata), multicast, unspecified, otherwise not global, and the machine's own
  addresses are refused unless `krt worker --callback-allow HOST[:PORT]` names the URL's host.
  The connection goes to the addresses checked (the connector's resolver answers only those),
  so a name that resolves elsewhere a moment later (DNS rebinding) reaches nothing new.

The request: bounded in time (CallbackPolicy.timeout_s to resolve, and again for the request);
no redirect followed; no proxy from the environment (it would connect for us to what we refused);
at most MAX_RESPONSE_BYTES of the answer read. Outcomes and logs name the URL's host and port,
never its path or query (a webhook URL often carries a token there), never the key.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from temporalio import activity

from kruntimes.api.names import validate_creator_kind, validate_subject
from kruntimes.api.spec import validate_callback_url
from kruntimes.config.secret_access import BINDINGS_FILE, BindingsFile, RunCreator, SecretAccess, SecretUse
from kruntimes.config.secret_access import SecretForbidden as _Forbidden
from kruntimes.config.secret_files import FileSecrets, SecretFileError
from kruntimes.config.secret_files import SecretNotFound as _NotFound
from kruntimes.config.secret_store import SECRETS_DIR
from kruntimes.contracts.invocation import ACTIVITY_CALLBACK, CallbackOutcome, CallbackRequest
from kruntimes.sdk.callbacks import SIGNATURE_HEADER, header
from kruntimes.wire.headers import INVOCATION_ID

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 64 * 1024
MAX_ADDRESSES = 16  # of a name's addresses, the ones checked and tried
EXCERPT_CHARS = 120  # of a failed answer's body, in the outcome's message
SECRET_KEY = "key"  # the key of a Secret of several keys that signs

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses it resolves to; tests pass their own (a name they control)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(frozen=True, slots=True)
class AllowedHost:
    """`--callback-allow HOST[:PORT]`: a callback URL's host (and port) let through to any address."""

    host: str
    port: int | None = None

    def admits(self, host: str, port: int) -> bool:
        return _same_host(self.host, host) and self.port in (None, port)

    @classmethod
    def parse(cls, text: str) -> AllowedHost:
        """HOST, HOST:PORT, an IPv6 literal in brackets ([::1]:8443); ValueError otherwise."""
        try:
            parts = urlsplit(f"https://{text}")
            port = parts.port
        except ValueError as e:
            raise ValueError(f"--callback-allow {text!r:.80}: {e}") from None
        if not parts.hostname or parts.path or parts.query or parts.username or port == 0:
            raise ValueError(f"--callback-allow {text!r:.80}: HOST or HOST:PORT")
        return cls(parts.hostname, port)


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """The worker's rules for callbacks (`krt worker --callback-allow`, `--callback-ca`)."""

    allow: tuple[AllowedHost, ...] = ()
    ca_file: Path | None = None  # trusted beside the system's store
    timeout_s: float = DEFAULT_TIMEOUT_S


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.strip("[]")) == ipaddress.ip_address(b.strip("[]"))
    except ValueError:
        return a.lower().rstrip(".") == b.lower().rstrip(".")


def _embedded(address: IPAddress) -> IPAddress | None:
    """The IPv4 address an IPv6 one carries to its destination (mapped, 6to4, Teredo), if any."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address.teredo is not None:
            return address.teredo[1]
    return None


def refusal(address: IPAddress, *, own: Callable[[IPAddress], bool]) -> str:
    """What `address` is, when a callback may not go there ("" when it may)."""
    inner = _embedded(address)
    if inner is not None:
        why = refusal(inner, own=own)
        return f"{why} ({inner} inside it)" if why else ""
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a global address"
    if own(address):
        return "an address of this machine"
    return ""


def is_own_address(address: IPAddress) -> bool:
    """Whether `address` is one of this machine's (of the worker's network namespace): only such
    an address can be bound. Any doubt counts as its own (refused)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
    except OSError as e:
        return e.errno != errno.EADDRNOTAVAIL
    return True


async def resolve_host(host: str, port: int) -> Sequence[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _Pinned(aiohttp.abc.AbstractResolver):
    """The connector's resolver: the addresses already checked, and nothing else."""

    def __init__(self, host: str, addresses: Sequence[IPAddress]) -> None:
        self._host = host
        self._addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        if not _same_host(host, self._host):
            raise OSError(errno.EHOSTUNREACH, "only the checked host is reachable")
        return [
            {
                "hostname": host,
                "host": str(a),
                "port": port,
                "family": socket.AF_INET if a.version == 4 else socket.AF_INET6,
                "proto": socket.IPPROTO_TCP,
                "flags": socket.AI_NUMERICHOST,
            }
            for a in self._addresses
            if family in (socket.AF_UNSPEC, socket.AF_INET if a.version == 4 else socket.AF_INET6)
        ]

    async def close(self) -> None:
        return None


def trust(ca_file: Path | None) -> ssl.SSLContext:
    """The system's CAs, and `ca_file`'s (PEM) beside them; ValueError naming the file."""
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"--callback-ca {ca_file}: cannot be loaded ({type(e).__name__})") from None
    return context


def _creator(text: str) -> RunCreator | None:
    """The target's creator as the workflow passes it (`kind:subject`, "" for none)."""
    if not text:
        return None
    kind, _, subject = text.partition(":")
    return RunCreator(validate_creator_kind(kind), validate_subject(subject))


def _excerpt(body: bytes) -> str:
    text = body[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else " " for c in text)[:EXCERPT_CHARS].strip()
    return f": {text}" if text else ""


def _failed(message: str, *, status: int = 0) -> CallbackOutcome:
    return CallbackOutcome(delivered=False, httpStatus=status, message=message)


class CallbackActivities:
    """Callback delivery with the worker's policy; `secrets`: the store and bindings that decide
    who may sign with which Secret (None: signed callbacks are refused)."""

    def __init__(
        self,
        policy: CallbackPolicy,
        *,
        secrets: SecretAccess | None,
        resolver: Resolver = resolve_host,
        own: Callable[[IPAddress], bool] = is_own_address,
    ) -> None:
        self.policy = policy
        self.secrets = secrets
        self.resolver = resolver
        self.own = own
        self.tls = trust(policy.ca_file)

    @classmethod
    def in_state_dir(cls, policy: CallbackPolicy, state_dir: Path | None) -> CallbackActivities:
        """With the secret store and role bindings where the embedded platform keeps them
        (`{state dir}/secrets`, `{state dir}/rolebindings.yaml`), as its hosts read them."""
        secrets = None
        if state_dir is not None:
            secrets = SecretAccess(
                FileSecrets(state_dir / SECRETS_DIR), BindingsFile(state_dir / BINDINGS_FILE)
            )
        return cls(policy, secrets=secrets)

    @activity.defn(name=ACTIVITY_CALLBACK)
    async def deliver_callback(self, request: CallbackRequest) -> CallbackOutcome:
        """POST the status to the callback URL (see the module docstring); never raises for a
        delivery that failed."""
        try:
            validate_callback_url(request.url, field="callback URL")
        except ValueError as e:
            return _failed(str(e))
        parts = urlsplit(request.url)
        host, port = parts.hostname or "", parts.port or 443
        where = f"{host}:{port}"
        key: bytes | None = None
        if request.secretName is not None:
            found = await asyncio.to_thread(self._key, request, request.secretName)
            if isinstance(found, CallbackOutcome):
                return found
            key = found
        addresses = await self._checked(host, port)
        if isinstance(addresses, CallbackOutcome):
            return addresses
        outcome = await self._post(request, host, addresses, key)
        log.info(
            "callback %s",
            "delivered" if outcome.delivered else "not delivered",
            extra={"to": where, "attempt": request.attempt, "status": outcome.httpStatus},
        )
        return outcome

    def _key(self, request: CallbackRequest, name: str) -> bytes | CallbackOutcome:
        """The signing key of the Secret `name`, for a creator allowed it (audited)."""
        if self.secrets is None:
            return _failed(f"secret {name!r}: this worker has no secret store to sign with")
        try:
            creator = _creator(request.creator)
        except ValueError as e:
            return _failed(f"SecretForbidden: the target's creator is malformed: {e}")
        target = request.status.target
        use = SecretUse(target.uid, request.attempt, request.namespace, target.name, creator, use="callback")
        try:
            values = self.secrets.resolve(use, [(name, "")])
        except _Forbidden as e:
            return _failed(f"SecretForbidden: {e.message}")
        except _NotFound as e:
            return _failed(f"SecretNotFound: {e.message}")
        except SecretFileError as e:
            return _failed(f"SecretInvalid: {e.message}")
        if SECRET_KEY in values:
            return values[SECRET_KEY].encode()
        if len(values) == 1:
            return next(iter(values.values())).encode()
        return _failed(
            f"secret {name!r} of namespace {request.namespace!r} has {len(values)} keys and none "
            f"named {SECRET_KEY!r}: the signing key is its only key, or its key {SECRET_KEY!r}"
        )

    async def _checked(self, host: str, port: int) -> list[IPAddress] | CallbackOutcome:
        """The addresses of `host` a callback may go to, all checked; an outcome when none may."""
        where = f"{host}:{port}"
        try:
            answer = await asyncio.wait_for(self.resolver(host, port), self.policy.timeout_s)
            addresses = [ipaddress.ip_address(a.partition("%")[0]) for a in answer][:MAX_ADDRESSES]
        except TimeoutError:
            return _failed(f"{host} was not resolved within {self.policy.timeout_s:g} s")
        except (OSError, ValueError) as e:
            return _failed(f"{host} cannot be resolved ({type(e).__name__})")
        if not addresses:
            return _failed(f"{host} resolves to no address")
        if any(allowed.admits(host, port) for allowed in self.policy.allow):
            return addresses
        for address in addresses:
            why = refusal(address, own=self.own)
            if why:
                return _failed(
                    f"refused: {host} resolves to {address}, {why}; a callback goes there only when "
                    f"the worker's --callback-allow names {where} or {host}"
                )
        return addresses

    async def _post(
        self, request: CallbackRequest, host: str, addresses: list[IPAddress], key: bytes | None
    ) -> CallbackOutcome:
        body = request.status.model_dump_json().encode()
        headers = {
            "Content-Type": "application/json",
            INVOCATION_ID: request.status.invocationId,
            "User-Agent": "kruntimes-callback/1",
        }
        if key is not None:
            headers[SIGNATURE_HEADER] = header(body, key, timestamp=int(time.time()))
        timeout_s = self.policy.timeout_s
        connector = aiohttp.TCPConnector(
            resolver=_Pinned(host, addresses), ssl=self.tls, use_dns_cache=False, force_close=True
        )
        session_options: dict[str, Any] = {
            "connector": connector,
            "timeout": aiohttp.ClientTimeout(total=timeout_s),
            "trust_env": False,  # no proxy: it would connect for us to what was refused
            "auto_decompress": False,  # the answer is only excerpted, never inflated
        }
        where = f"{host}:{urlsplit(request.url).port or 443}"
        try:
            async with (
                aiohttp.ClientSession(**session_options) as session,
                session.post(request.url, data=body, headers=headers, allow_redirects=False) as answer,
            ):
                head = await answer.content.read(MAX_RESPONSE_BYTES)
                status = answer.status
        except TimeoutError:
            return _failed(f"{where} did not answer within {timeout_s:g} s")
        except aiohttp.ClientConnectorCertificateError as e:
            reason = getattr(e.certificate_error, "verify_message", "") or type(e.certificate_error).__name__
            return _failed(f"{where}: its certificate is not trusted ({reason})")
        except aiohttp.ClientSSLError:
            return _failed(f"{where}: the TLS handshake failed")
        except aiohttp.ClientConnectorError as e:
            return _failed(f"{where}: cannot connect ({e.os_error.strerror or type(e.os_error).__name__})")
        except (aiohttp.ClientError, OSError) as e:
            return _failed(f"{where}: the request failed ({type(e).__name__})")
        if 200 <= status < 300:
            return CallbackOutcome(delivered=True, httpStatus=status)
        if 300 <= status < 400:
            return _failed(
                f"{where} answered a redirect ({status}), which callbacks do not follow", status=status
            )
        return _failed(f"{where} answered {status}{_excerpt(head)}", status=status)
