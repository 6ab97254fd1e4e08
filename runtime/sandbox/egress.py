"""`network: outbound`: packet rules keyed to the functions' uids, in the host's own network
namespace (docs/security.md says why this and not a namespace per function).

One nftables table, `inet kruntimes`, is shared by every host of the machine (they share one uid
pool and lock directory, runtime/sandbox/identity.py):

  pool     the uid ranges of the hosts' pools (interval set): every host adds its own at start
  open     uids running a `network: host` function: added when its identity is made, removed
           when it is released, before the uid is marked clean for its next function
  allow4/6 `uid . address . port` of the functions' allow lists (same lifetime)
  dns4/6   the resolvers of /etc/resolv.conf (each host adds those it reads at start)

and its output chain, where only a packet of a pool uid goes on (to the chain `function`: a
packet of any other uid, or without a socket of its own, is not touched): a reset
(what this chain's own rejects send back, with the function's socket) → accept; an open uid →
accept; an allow-list match → accept; DNS (TCP or UDP 53) to a resolver → accept; then refused —
a TCP reset or ICMP administratively prohibited, so a function fails at once instead of waiting
for a timeout — anything to an address of the machine (`fib daddr type local`: loopback 127/8 and
::1 too, so every listener of the platform), the link-local (cloud metadata) and private ranges,
multicast and broadcast. Everything else (the outside world) passes.

The table is written with `nft -f -`, one transaction each: the whole chain and sets at a host's
start (`install`, under a file lock in the lock directory, idempotent: concurrent hosts end up with
the same chain and the union of their elements), the elements of one uid when a function that
needs them gets its identity (`admit`) and when it is released (`revoke`). A uid left `busy` by
a host that died may still have elements: the next claim removes every element of that uid
(`scrub`) before handing it out. Nothing is ever removed of `pool` (another host may share a
range); `nft delete table inet kruntimes` removes it all once no host runs. Each change runs the
nft program (milliseconds, off every request's path: bench/function_start.py measures it), which
keeps libnftables and its ABI out of the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

from kruntimes.config.egress import AllowRule

FAMILY = "inet"
TABLE = "kruntimes"
CHAIN = "output"
FUNCTION = "function"  # what a packet of a pool uid goes through
REFUSE = "refuse"
LOCK_FILE = "nftables.lock"
NFT_TIMEOUT_S = 10.0
MAX_ERROR_CHARS = 400
RESOLV_CONF = "/etc/resolv.conf"
MAX_NAMESERVERS = 16
_TCP_UDP = "meta l4proto { tcp, udp }"
_OURS = "local, broadcast, anycast, multicast"  # address types of this machine's own
_ABSENT = "No such file or directory"  # what nft says of a table or set that does not exist
# where nft lives; a host's PATH may lack the sbin directories
_SEARCH = "/usr/sbin:/sbin:/usr/bin:/bin:/usr/local/sbin:/usr/local/bin"

# Destinations refused besides the machine's own addresses (fib daddr type local)
REFUSED4 = (
    "0.0.0.0/8",  # "this network": connect() to 0.0.0.0 reaches the machine
    "10.0.0.0/8",
    "100.64.0.0/10",  # carrier-grade NAT, and some clouds' internal services
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local: cloud metadata endpoints
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",  # multicast
    "255.255.255.255/32",
)
REFUSED6 = (
    "::/128",
    "::1/128",
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
)
MANUAL = (
    "install nftables (apt-get install nftables), or give the runtime `network: host` "
    "explicitly (its functions then reach every listener of the machine)"
)


class PacketRulesUnavailable(OSError):
    """The packet rules cannot be written (no nft, no CAP_NET_ADMIN, a kernel without nf_tables)."""


def nft_path() -> str | None:
    return shutil.which("nft", path=_SEARCH + ":" + os.environ.get("PATH", ""))


def nameservers(path: str = RESOLV_CONF) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    """The resolvers `path` names (at most MAX_NAMESERVERS; a scoped IPv6 one without its scope)."""
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            lines = f.read(64 * 1024).splitlines()
    except OSError:
        return ()
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            with contextlib.suppress(ValueError):
                address = ipaddress.ip_address(fields[1].partition("%")[0])
                if address not in found:
                    found.append(address)
        if len(found) >= MAX_NAMESERVERS:
            break
    return tuple(found)


def _elements(uid: int, rules: Iterable[AllowRule], version: int) -> list[str]:
    return [f"{uid} . {rule.network} . {rule.ports()}" for rule in rules if rule.version == version]


class PacketRules:
    """The machine's `inet kruntimes` table, as one host writes it (`nft`: the nft program)."""

    def __init__(self, *, lock_dir: str, nft: str | None = None) -> None:
        found = nft or nft_path()
        if found is None or not os.access(found, os.X_OK):
            raise PacketRulesUnavailable(f"nft is not installed: {MANUAL}")
        self.nft = found
        self.lock_dir = lock_dir

    # -- the whole table, at a host's start ---------------------------------------------------

    def install(self, first_uid: int, last_uid: int, *, resolvers: Iterable[Any] = ()) -> None:
        """Make the table, its sets and its chain (the chain written anew, the sets' elements
        kept), and add the range `first_uid`..`last_uid` and `resolvers`; one transaction."""
        servers = list(resolvers)
        dns4 = [str(a) for a in servers if a.version == 4]
        dns6 = [str(a) for a in servers if a.version == 6]
        t = f"{FAMILY} {TABLE}"
        script = [
            f"add table {t}",
            f"add set {t} pool {{ typeof meta skuid; flags interval; auto-merge; }}",
            f"add set {t} open {{ typeof meta skuid; }}",
            f"add set {t} allow4 {{ typeof meta skuid . ip daddr . th dport; flags interval; }}",
            f"add set {t} allow6 {{ typeof meta skuid . ip6 daddr . th dport; flags interval; }}",
            f"add set {t} dns4 {{ typeof ip daddr; }}",
            f"add set {t} dns6 {{ typeof ip6 daddr; }}",
            f"add chain {t} {REFUSE}",
            f"add chain {t} {FUNCTION}",
            f"add chain {t} {CHAIN} {{ type filter hook output priority filter; policy accept; }}",
            f"flush chain {t} {CHAIN}",
            f"flush chain {t} {FUNCTION}",
            f"flush chain {t} {REFUSE}",
            f"add rule {t} {REFUSE} meta l4proto tcp reject with tcp reset",
            f"add rule {t} {REFUSE} reject with icmpx admin-prohibited",
            # a packet without a full socket (a SYN-ACK, a time-wait's reset) matches no uid
            f"add rule {t} {CHAIN} meta skuid @pool jump {FUNCTION}",
            # the reset a reject below sends back carries the function's socket: it must pass
            f"add rule {t} {FUNCTION} tcp flags & rst == rst accept",
            f"add rule {t} {FUNCTION} meta skuid @open accept",
            f"add rule {t} {FUNCTION} {_TCP_UDP} meta skuid . ip daddr . th dport @allow4 accept",
            f"add rule {t} {FUNCTION} {_TCP_UDP} meta skuid . ip6 daddr . th dport @allow6 accept",
            f"add rule {t} {FUNCTION} {_TCP_UDP} th dport 53 ip daddr @dns4 accept",
            f"add rule {t} {FUNCTION} {_TCP_UDP} th dport 53 ip6 daddr @dns6 accept",
            f"add rule {t} {FUNCTION} fib daddr type {{ {_OURS} }} jump {REFUSE}",
            f"add rule {t} {FUNCTION} ip daddr {{ {', '.join(REFUSED4)} }} jump {REFUSE}",
            f"add rule {t} {FUNCTION} ip6 daddr {{ {', '.join(REFUSED6)} }} jump {REFUSE}",
            f"add element {t} pool {{ {first_uid}-{last_uid} }}",
        ]
        if dns4:
            script.append(f"add element {t} dns4 {{ {', '.join(dns4)} }}")
        if dns6:
            script.append(f"add element {t} dns6 {{ {', '.join(dns6)} }}")
        with self._locked():
            self._run(script)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        fd = os.open(
            os.path.join(self.lock_dir, LOCK_FILE),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- one uid's elements ---------------------------------------------------------------------

    def admit(self, uid: int, *, open_: bool = False, allow: tuple[AllowRule, ...] = ()) -> None:
        """Let `uid` reach everything (`open_`: a `network: host` function) or `allow`."""
        script = self._changes("add", uid, open_=open_, allow=allow)
        if script:
            self._run(script)

    def revoke(self, uid: int, *, open_: bool = False, allow: tuple[AllowRule, ...] = ()) -> None:
        """Take back what `admit` gave `uid` (the same arguments)."""
        script = self._changes("delete", uid, open_=open_, allow=allow)
        if script:
            self._run(script)

    def _changes(self, verb: str, uid: int, *, open_: bool, allow: tuple[AllowRule, ...]) -> list[str]:
        t = f"{FAMILY} {TABLE}"
        script = [f"{verb} element {t} open {{ {uid} }}"] if open_ else []
        for version in (4, 6):
            elements = _elements(uid, allow, version)
            if elements:
                script.append(f"{verb} element {t} allow{version} {{ {', '.join(elements)} }}")
        return script

    def holds(self, uid: int) -> list[str]:
        """The sets that hold an element of `uid` (open, allow4, allow6)."""
        return [name for name, elements in self._of(uid).items() if elements]

    def scrub(self, uid: int) -> None:
        """Remove every element of `uid` (whatever a host that died left it)."""
        found = self._of(uid)
        commands = [
            {
                "delete": {
                    "element": {
                        "family": FAMILY,
                        "table": TABLE,
                        "name": name,
                        "elem": [_deletable(e) for e in elements],
                    }
                }
            }
            for name, elements in found.items()
            if elements
        ]
        if commands:
            self._run_json({"nftables": commands})

    def _of(self, uid: int) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for name in ("open", "allow4", "allow6"):
            listed = self.elements(name)
            found[name] = [e for e in listed if _uid_of(e) == uid]
        return found

    def elements(self, name: str) -> list[Any]:
        """The elements of set `name` as `nft -j` lists them ([] where there is no table)."""
        try:
            done = self._exec(["-j", "list", "set", FAMILY, TABLE, name], "")
        except PacketRulesUnavailable as exc:
            if _ABSENT in str(exc):
                return []  # no table (no host with rules ran since boot): nothing of any uid
            raise
        for item in json.loads(done or "{}").get("nftables", []):
            if "set" in item:
                return list(item["set"].get("elem", []))
        return []

    # -- running nft ----------------------------------------------------------------------------

    def _run(self, script: list[str]) -> None:
        self._exec(["-f", "-"], "\n".join(script) + "\n")

    def _run_json(self, document: dict[str, Any]) -> None:
        self._exec(["-j", "-f", "-"], json.dumps(document))

    def _exec(self, args: list[str], text: str) -> str:
        try:
            done = subprocess.run(
                [self.nft, *args],
                input=text,
                capture_output=True,
                text=True,
                timeout=NFT_TIMEOUT_S,
                env={"PATH": _SEARCH, "LANG": "C"},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PacketRulesUnavailable(f"nft {args[0]}: {exc}") from None
        if done.returncode != 0:
            error = " ".join(done.stderr.split())[:MAX_ERROR_CHARS] or f"exit code {done.returncode}"
            raise PacketRulesUnavailable(f"nft: {error}")
        return done.stdout


def _uid_of(element: Any) -> int | None:
    """The uid of a listed element: a number (open) or the first of a concatenation."""
    if isinstance(element, dict) and "elem" in element:  # an element with attributes
        element = element["elem"].get("val")
    if isinstance(element, dict) and "concat" in element:
        element = element["concat"][0]
    return element if isinstance(element, int) else None


def _deletable(element: Any) -> Any:
    """`element` as a delete must name it: nft lists a one-address range of an interval set as
    the bare address, and finds it only as the prefix it is (/32, /128)."""
    if isinstance(element, dict) and "concat" in element:
        uid, address, *rest = element["concat"]
        if isinstance(address, str):
            length = 128 if ":" in address else 32
            address = {"prefix": {"addr": address, "len": length}}
        return {"concat": [uid, address, *rest]}
    return element
