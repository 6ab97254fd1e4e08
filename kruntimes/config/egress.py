"""A runtime's egress allow list: destinations its functions reach although `network: outbound`
refuses them (an address of the machine, a private or link-local range), one `CIDR:PORT` each.

    10.1.2.3/32:5432      one address, one port (TCP and UDP)
    10.1.2.3:5432         the same (an address alone is its /32, or /128)
    [fd00::/8]:443        IPv6 in brackets
    192.0.2.0/24:*        every port
    198.51.100.7:8000-8099  a range of ports

Standard library only: the runtimes file (kruntimes.config.runtimes), `krt host --egress-allow`
and the packet rules (kruntimes.runtime.sandbox.egress) all read it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

# What a host says of `network: outbound` where it cannot write packet rules (not root)
UNENFORCED = (
    "outbound unenforced: no packet rules without root — functions reach loopback and the machine's addresses"
)
# ... or where its functions run as its own user (packet rules tell functions apart by uid)
UNENFORCED_SAME_USER = (
    "outbound unenforced: functions run as the host's own user, which packet rules cannot tell "
    "apart — functions reach loopback and the machine's addresses"
)
# What `krt up` says of a runtime that opts out
OPT_OUT = (
    "network host: its functions reach every listener of this machine, the platform's own "
    "included (the Temporal frontend, the gateway); without it they get network outbound"
)
# Each entry is one element of the kernel's set per function start: the list stays short.
MAX_ALLOW = 64
MAX_ENTRY_CHARS = 64
MAX_PORT = 65535


@dataclass(frozen=True)
class AllowRule:
    """Destinations `network` on ports `first_port`..`last_port` (inclusive), TCP and UDP."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    first_port: int
    last_port: int

    @property
    def version(self) -> int:
        return self.network.version

    def ports(self) -> str:
        """The ports as nft writes them: `443` or `8000-8099` (every port: `1-65535`)."""
        if self.first_port == self.last_port:
            return str(self.first_port)
        return f"{self.first_port}-{self.last_port}"

    def __str__(self) -> str:
        ports = "*" if (self.first_port, self.last_port) == (1, MAX_PORT) else self.ports()
        host = str(self.network) if self.version == 4 else f"[{self.network}]"
        return f"{host}:{ports}"


def parse_allow(text: str) -> AllowRule:
    """One entry (`CIDR:PORT`, `CIDR:LOW-HIGH` or `CIDR:*`); ValueError saying what is wrong."""
    if not isinstance(text, str) or not text or len(text) > MAX_ENTRY_CHARS or not text.isascii():
        raise ValueError(f"{str(text)[:MAX_ENTRY_CHARS]!r}: not CIDR:PORT")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{text!r}: an IPv6 range is written [CIDR]:PORT")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"{text!r}: not CIDR:PORT (IPv6 goes in brackets)")
    try:
        network = ipaddress.ip_network(host, strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r}: {host!r} is not a CIDR ({exc})") from None
    if text.startswith("[") and network.version != 6:
        raise ValueError(f"{text!r}: brackets are for IPv6 only")
    first, last = _ports(port, text)
    return AllowRule(network, first, last)


def _ports(port: str, text: str) -> tuple[int, int]:
    if port == "*":
        return 1, MAX_PORT
    low, dash, high = port.partition("-")
    bounds = (low, high) if dash else (low, low)
    if not all(b.isdigit() and len(b) <= 5 for b in bounds):
        raise ValueError(f"{text!r}: the port is a number, LOW-HIGH or *")
    first, last = int(bounds[0]), int(bounds[1])
    if not 1 <= first <= last <= MAX_PORT:
        raise ValueError(f"{text!r}: ports lie within 1..{MAX_PORT}, low to high")
    return first, last


def parse_allow_list(entries: list[str] | tuple[str, ...]) -> tuple[AllowRule, ...]:
    """Every entry parsed, duplicates dropped, at most MAX_ALLOW."""
    if len(entries) > MAX_ALLOW:
        raise ValueError(f"egress allow list: at most {MAX_ALLOW} entries, got {len(entries)}")
    return tuple(sorted({parse_allow(entry) for entry in entries}, key=_order))


def _order(rule: AllowRule) -> tuple[int, int, int, int, int]:
    net = rule.network
    return net.version, int(net.network_address), net.prefixlen, rule.first_port, rule.last_port
