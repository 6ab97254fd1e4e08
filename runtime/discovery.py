"""Which gateways a host sends heartbeats to: each target is an address dialled as it is
(`host:port`), or `dns+all://NAME:PORT` — every A/AAAA record of NAME, each its own gateway (the
gateways' headless Service on Kubernetes, whose name resolves to every gateway pod).

`GatewayDiscovery.expand` turns targets into addresses; a name that cannot be resolved keeps the
addresses of its last answer (none before the first), and its failure is logged once, not at every
look, until it resolves again. At most `MAX_ADDRESSES` addresses in all. The resolver is a
function (NAME, PORT) -> addresses, `resolve_all` (the system resolver) unless given.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

DNS_ALL = "dns+all://"
MAX_ADDRESSES = 16  # as many gateways as a host spec may name
DEFAULT_INTERVAL_S = 10.0
MIN_INTERVAL_S, MAX_INTERVAL_S = 1.0, 300.0
MAX_NAME = 253

Resolver = Callable[[str, int], list[str]]


def check_interval(interval_s: float) -> float:
    if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
        bounds = f"[{MIN_INTERVAL_S:g}, {MAX_INTERVAL_S:g}]"
        raise ValueError(f"the gateway resolve interval must be within {bounds} s")
    return interval_s


def split_target(target: str) -> tuple[str, int] | None:
    """(NAME, PORT) of a `dns+all://NAME:PORT` target, None for a plain address; ValueError if
    the target has the prefix but no valid name and port."""
    if not target.startswith(DNS_ALL):
        return None
    name, _, port = target[len(DNS_ALL) :].rpartition(":")
    if not name or len(name) > MAX_NAME or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{target!r:.300} is not dns+all://NAME:PORT")
    return name, int(port)


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def resolve_all(name: str, port: int) -> list[str]:
    """Every A and AAAA record of `name` as `ip:port` (`[ip]:port` for IPv6), sorted; OSError
    (socket.gaierror) when it does not resolve."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    found = {_address(str(info[4][0]).partition("%")[0], port) for info in infos}
    return sorted(found)


class GatewayDiscovery:
    """Targets to addresses (see the module docstring). Thread-safe."""

    def __init__(self, *, resolve: Resolver = resolve_all, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.resolve = resolve
        self.interval_s = check_interval(interval_s)
        self._lock = threading.Lock()
        self._last: dict[str, list[str]] = {}  # target -> its last answer
        self._failing: set[str] = set()  # targets whose failure was logged

    @staticmethod
    def dynamic(targets: Iterable[str]) -> bool:
        """Whether any target is a name to resolve (and so to look at again)."""
        return any(t.startswith(DNS_ALL) for t in targets)

    def expand(self, targets: Iterable[str]) -> list[str]:
        """The addresses of `targets`, in order, without repeats, at most MAX_ADDRESSES."""
        addresses: list[str] = []
        for target in targets:
            try:
                parsed = split_target(target)
                if parsed is None:
                    addresses.append(target)
                    continue
                found = [str(a) for a in self.resolve(*parsed)][:MAX_ADDRESSES]
            except (OSError, UnicodeError, ValueError) as e:
                addresses += self._failed(target, e)
                continue
            with self._lock:
                if target in self._failing:
                    self._failing.discard(target)
                    log.info("gateway name resolves again", extra={"target": target, "addresses": found})
                self._last[target] = found
            addresses += found
        return list(dict.fromkeys(addresses))[:MAX_ADDRESSES]

    def _failed(self, target: str, error: Exception) -> list[str]:
        with self._lock:
            kept = list(self._last.get(target, []))
            if target not in self._failing:
                self._failing.add(target)
                log.warning(
                    "cannot resolve a gateway name; keeping its last addresses",
                    extra={"target": target, "error": f"{type(error).__name__}: {error}"[:300], "kept": kept},
                )
        return kept
