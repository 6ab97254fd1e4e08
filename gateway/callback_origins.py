"""Per-request callback URLs of async invocations (issue #44; docs/async-invocations.md): the
header's URL checked, and the origins each namespace may name, from `krt gateway
--callback-origins FILE`.

    namespaces:
      default: ["https://hooks.example.com", "https://*.example.org:8443"]
      "*": ["https://203.0.113.7"]          # every namespace

An entry is an origin only: `https://`, a host (a DNS name, one leading `*.` label over a name of
two labels or more, an IPv4 address or a bracketed IPv6 one) and an optional port (443 when none);
no user, path, query or fragment. Hosts are compared normalized (lowercase, IDNA's ASCII form, no
trailing dot); a wildcard matches exactly one label (`*.example.org` matches `a.example.org`, never
`example.org`, `a.b.example.org`, `example.org.evil.com` or `evil-example.org`); an IP literal
matches only an IP entry of the same address, never a name. A malformed file refuses the gateway's
start, naming the entry; the file is read once, at start.

Nothing here ever puts a URL's path or query in a message: a webhook's token rides there.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from kruntimes.api.names import validate_dns1123_label

ANY_NAMESPACE = "*"
MAX_FILE_BYTES = 256 * 1024
MAX_NAMESPACES = 1_000
MAX_ORIGINS = 256  # of one namespace
MAX_ORIGIN_CHARS = 300
# kruntimes.api.spec.MAX_CALLBACK_URL_CHARS, which the workflow's input holds it to (the gateway
# loads no pydantic; tests/gateway/async_callback_url_test.py keeps them equal)
MAX_HEADER_BYTES = 2048
DEFAULT_PORT = 443
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


class OriginsError(ValueError):
    """The origins file is unusable; the message names the entry (never a secret: origins only)."""


class InvalidCallbackUrl(ValueError):
    """A per-request callback URL the gateway refuses (400); the message never echoes its path or query."""


def normalize_host(host: str) -> str:
    """A DNS name as compared: lowercase, IDNA's ASCII form, no trailing dot; ValueError when it
    is not a name of LDH labels (1..63 characters each, 253 in all)."""
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 1_000:
        raise ValueError("not a host name")
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("not a valid internationalized host name") from None
    name = name.lower()
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError("not a valid host name")
    return name


def _ipv4_spelling(name: str) -> bool:
    """Whether a name is an IPv4 address in another spelling (`127.1`, `0x7f000001`, `017.0.0.1`):
    a resolver may take it for the address, so it is neither a name nor an address here."""
    if name.rsplit(".", 1)[-1].isdigit():  # no top-level domain is all digits
        return True
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of an IP literal host (urlsplit's hostname: IPv6 without brackets), else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _shown(text: str) -> str:
    """What a message may quote of an entry: its scheme and host, never a user, path or query (an
    operator may have pasted a hook's whole URL, token and all)."""
    scheme, sep, rest = text.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0] if sep else ""
    shown = f"{scheme[:10]}{sep}{authority.rsplit('@', 1)[-1][:100]}"
    return shown if shown == text else shown + "…"


@dataclass(frozen=True, slots=True)
class Origin:
    """One allowed origin: a host (normalized), a wildcard's suffix, or an address; and a port."""

    host: str  # a name, or the suffix under a wildcard ("example.org" of "*.example.org"), or ""
    port: int
    wildcard: bool = False
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None

    @classmethod
    def parse(cls, entry: object, *, where: str) -> Origin:
        if not isinstance(entry, str) or not 1 <= len(entry) <= MAX_ORIGIN_CHARS:
            raise OriginsError(f"{where}: an origin is a string of 1..{MAX_ORIGIN_CHARS} characters")
        text = entry
        where = f"{where} ({_shown(text)!r})"
        if any(c.isspace() or not c.isprintable() for c in text):
            raise OriginsError(f"{where}: no spaces or control characters")
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as e:
            raise OriginsError(f"{where}: not an origin: {e}") from None
        if parts.scheme != "https":
            raise OriginsError(f"{where}: https:// only")
        if parts.username is not None or parts.password is not None:
            raise OriginsError(f"{where}: an origin carries no user or password")
        if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
            # never the path or query: an operator may have pasted a hook's whole URL, token and all
            raise OriginsError(f"{where}: an origin only (scheme, host, port), no path or query")
        if port == 0:
            raise OriginsError(f"{where}: port 0")
        # urlsplit keeps a netloc's case; its hostname is lowercased and unbracketed
        netloc_host = parts.netloc.rsplit("@", 1)[-1]
        host = parts.hostname or ""
        if not host:
            raise OriginsError(f"{where}: names no host")
        effective = DEFAULT_PORT if port is None else port
        if netloc_host.startswith("["):
            address = _ip(host)
            if not isinstance(address, ipaddress.IPv6Address) or "%" in host:
                raise OriginsError(f"{where}: not an IPv6 address")
            return cls(host="", port=effective, address=address)
        address = _ip(host)
        if address is not None:
            if not isinstance(address, ipaddress.IPv4Address) or str(address) != host:
                raise OriginsError(f"{where}: an IPv4 address in dotted decimal")
            return cls(host="", port=effective, address=address)
        wildcard = host.startswith("*.")
        try:
            name = normalize_host(host[2:] if wildcard else host)
        except ValueError as e:
            raise OriginsError(f"{where}: {e}") from None
        if "*" in name:
            raise OriginsError(f"{where}: a wildcard is one leading `*.` label only")
        if wildcard and name.count(".") < 1:
            raise OriginsError(f"{where}: a wildcard covers a name of two labels or more")
        if _ipv4_spelling(name):
            raise OriginsError(f"{where}: an IPv4 address is written in dotted decimal")
        return cls(host=name, port=effective, wildcard=wildcard)

    def matches(
        self, host: str, port: int, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    ) -> bool:
        """Whether a URL's normalized host (or its address, for an IP literal) and port are of this origin."""
        if port != self.port:
            return False
        if self.address is not None or address is not None:
            return self.address is not None and address is not None and self.address == address
        if self.wildcard:
            head, dot, rest = host.partition(".")
            return bool(head) and dot == "." and rest == self.host
        return host == self.host

    def __str__(self) -> str:
        if self.address is not None:
            host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        else:
            host = f"*.{self.host}" if self.wildcard else self.host
        return f"https://{host}" + ("" if self.port == DEFAULT_PORT else f":{self.port}")


@dataclass(frozen=True, slots=True)
class CallbackUrl:
    """A per-request callback URL as the gateway records it, and its origin as compared."""

    url: str  # the caller's URL with its host normalized (what the workflow delivers to)
    host: str  # normalized name, "" for an IP literal
    port: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None

    @property
    def origin(self) -> str:
        """What a message or the status may show of it: scheme, host, port."""
        if self.address is not None:
            host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        else:
            host = self.host
        return f"https://{host}" + ("" if self.port == DEFAULT_PORT else f":{self.port}")


def parse_callback_url(value: str) -> CallbackUrl:
    """The header's URL checked: https, at most MAX_HEADER_BYTES, parseable, no user or password,
    a host; its host normalized. InvalidCallbackUrl otherwise, never echoing the path or query."""
    if len(value.encode("utf-8", "surrogateescape")) > MAX_HEADER_BYTES:
        raise InvalidCallbackUrl(f"the callback URL is longer than {MAX_HEADER_BYTES} bytes")
    if not value:
        raise InvalidCallbackUrl("the callback URL is empty")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidCallbackUrl(
            "the callback URL carries spaces or control characters (percent-encode them)"
        )
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() != "https":
        raise InvalidCallbackUrl("the callback URL must be https:// (http and other schemes are refused)")
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        raise InvalidCallbackUrl(
            "the callback URL must not carry a user or password (the target's callback.secretName signs it)"
        )
    if not tail.isascii():
        raise InvalidCallbackUrl("the callback URL's path and query must be ASCII (percent-encode the rest)")
    try:
        parts = urlsplit("https://" + authority)
        port = parts.port
    except ValueError:
        raise InvalidCallbackUrl("the callback URL's host or port cannot be parsed") from None
    host = parts.hostname or ""
    if not host:
        raise InvalidCallbackUrl("the callback URL names no host")
    if port == 0:
        raise InvalidCallbackUrl("the callback URL's port is 0")
    bracketed = authority.startswith("[")
    address = _ip(host)
    if bracketed:
        if not isinstance(address, ipaddress.IPv6Address) or "%" in host:
            raise InvalidCallbackUrl("the callback URL's bracketed host is not an IPv6 address")
        netloc = f"[{address}]"
        name = ""
    elif address is not None:
        if not isinstance(address, ipaddress.IPv4Address) or str(address) != host:
            raise InvalidCallbackUrl("the callback URL's IPv4 host is not in dotted decimal")
        netloc = str(address)
        name = ""
    else:
        try:
            name = normalize_host(host)
        except ValueError as e:
            raise InvalidCallbackUrl(f"the callback URL's host is {e}") from None
        if _ipv4_spelling(name):
            raise InvalidCallbackUrl("the callback URL's IPv4 host is not in dotted decimal")
        netloc = name
    if port is not None:
        netloc += f":{port}"
    url = f"https://{netloc}{tail}"
    # what the workflow's input takes (kruntimes.api.spec.validate_callback_url), said without the URL
    if "#" in tail:
        raise InvalidCallbackUrl("the callback URL must not carry a fragment")
    if len(url) > MAX_HEADER_BYTES:  # its host in IDNA's ASCII form may be longer than sent
        raise InvalidCallbackUrl(f"the callback URL is longer than {MAX_HEADER_BYTES} bytes")
    return CallbackUrl(url=url, host=name, port=DEFAULT_PORT if port is None else port, address=address)


class CallbackOrigins:
    """The origins each namespace may name in a per-request callback (`*`: every namespace).
    `None` in place of one of these (no file): no namespace may name any."""

    def __init__(self, allowed: Mapping[str, Iterable[Origin]]) -> None:
        self._allowed = {namespace: tuple(origins) for namespace, origins in allowed.items()}

    def allows(self, namespace: str, url: CallbackUrl) -> bool:
        for bound in (namespace, ANY_NAMESPACE):
            for origin in self._allowed.get(bound, ()):
                if origin.matches(url.host, url.port, url.address):
                    return True
        return False

    @classmethod
    def from_yaml(cls, text: str) -> CallbackOrigins:
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise OriginsError(f"not valid YAML: {str(e)[:300]}") from None
        if document is None:
            document = {}
        if not isinstance(document, dict) or set(document) - {"namespaces"}:
            raise OriginsError("the document is a mapping of one key, `namespaces`")
        namespaces = document.get("namespaces") or {}
        if not isinstance(namespaces, dict):
            raise OriginsError("namespaces: a mapping of a namespace (or `*`) to a list of origins")
        if len(namespaces) > MAX_NAMESPACES:
            raise OriginsError(f"namespaces: at most {MAX_NAMESPACES}")
        allowed: dict[str, tuple[Origin, ...]] = {}
        for namespace, origins in namespaces.items():
            if not isinstance(namespace, str):
                raise OriginsError(f"namespaces: {namespace!r:.80} is not a namespace")
            if namespace != ANY_NAMESPACE:
                try:
                    validate_dns1123_label(namespace, field="namespace")
                except ValueError as e:
                    raise OriginsError(f"namespaces.{namespace:.80}: {e}") from None
            where = f"namespaces.{namespace}"
            if origins is None:
                origins = []
            if not isinstance(origins, list):
                raise OriginsError(f"{where}: a list of origins")
            if len(origins) > MAX_ORIGINS:
                raise OriginsError(f"{where}: at most {MAX_ORIGINS} origins")
            allowed[namespace] = tuple(
                Origin.parse(origin, where=f"{where}[{i}]") for i, origin in enumerate(origins)
            )
        return cls(allowed)

    @classmethod
    def load(cls, path: Path) -> CallbackOrigins:
        """The file at `path`; OriginsError (naming the file and the entry) when it is unusable."""
        try:
            with path.open("rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise OriginsError(f"{path}: cannot be read: {e.strerror or e}") from None
        if len(data) > MAX_FILE_BYTES:
            raise OriginsError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            return cls.from_yaml(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise OriginsError(f"{path}: not UTF-8") from None
        except OriginsError as e:
            raise OriginsError(f"{path}: {e}") from None


__all__ = [
    "ANY_NAMESPACE",
    "CallbackOrigins",
    "CallbackUrl",
    "InvalidCallbackUrl",
    "Origin",
    "OriginsError",
    "normalize_host",
    "parse_callback_url",
]
