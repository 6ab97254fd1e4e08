"""`network: outbound` against real packet rules, a real host and real listeners: a function (and
its setsid'd grandchild) reaches the outside world and its allowed destinations, and nothing of
the machine — no loopback listener (IPv4, 127.0.0.2, IPv6), no port of its own host, no other
address of the machine, no abstract Unix socket, nothing link-local or private — each refused at
once (a reset, not a timeout). `network: host` is the opt-out; a released uid keeps nothing.

The outside world is a network namespace this module makes (a veth pair): 198.18.0.2 stands for
the internet, 169.254.77.2 for a link-local (metadata) address, 10.213.77.2 for a private address
(a database on the LAN). No packet leaves the machine: every address here is loopback, the
machine's own (the veth's side of it), or inside that namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kruntimes.config.egress import parse_allow
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.isolation import FunctionIsolation
from kruntimes.runtime.sandbox import egress
from kruntimes.runtime.sandbox.identity import UidPool, UidRange
from kruntimes.runtime.sandbox.policy import Isolation, IsolationUnavailable, Network, SandboxSettings
from kruntimes.runtime.server import RuntimeHost
from tests.support.isolation import require_or_skip
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host
from tests.support.waiting import eventually_blocking

HOST_SIDE = {"internet": "198.18.0.1", "linklocal": "169.254.77.1", "private": "10.213.77.1"}
NS_SIDE = {"internet": "198.18.0.2", "linklocal": "169.254.77.2", "private": "10.213.77.2"}
# each test host its own uids, between the default range and the pods' (2_100_000_000, see
# kruntimes.activities.hosts.kubernetes_pods), apart from each other (the pool set merges
# adjacent ranges, and each is taken out again after)
FIRST_UID = 2_050_000_000 + (os.getpid() % 100_000) * 256
COUNT = 32
START_TIMEOUT_S = 20.0

# Listens in the test's namespace; prints {name: port}; ends when its stdin closes.
OUTSIDE = """
import json, socket, sys
held, ports = [], {}
for name, address in json.loads(sys.argv[1]).items():
    s = socket.create_server((address, 0), backlog=64)
    held.append(s)
    ports[name] = s.getsockname()[1]
spare = socket.create_server((json.loads(sys.argv[1])["private"], 0), backlog=64)
ports["private-other"] = spare.getsockname()[1]
print(json.dumps(ports), flush=True)
sys.stdin.read()
"""

# Tries every target, in the function process and in a grandchild in a session of its own.
PROBE = r"""
import json, os, socket

def attempt(kind, address):
    if kind == "bind":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
        return "bound"
    if kind == "udp":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", tuple(address))
        return "sent"
    family = {"tcp4": socket.AF_INET, "tcp6": socket.AF_INET6, "unix": socket.AF_UNIX}[kind]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect("\0" + address if kind == "unix" else tuple(address))
    return "connected"

def probe(targets):
    found = {}
    for name, (kind, address) in targets.items():
        try:
            found[name] = attempt(kind, address)
        except OSError as exc:
            found[name] = type(exc).__name__
    return found

def handle(payload):
    targets = payload["targets"]
    mine = probe(targets)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.setsid()
        if os.fork() == 0:
            os.write(w, json.dumps(probe(targets)).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    return {"function": mine, "grandchild": json.loads(data), "uid": os.getuid()}
"""


def _forget_range(first: int, last: int) -> None:
    """Take a test host's uids out of the machine's pool set (what no host does: ranges are shared)."""
    nft = egress.nft_path()
    assert nft is not None
    command = f"delete element {egress.FAMILY} {egress.TABLE} pool {{ {first}-{last} }}"
    subprocess.run([nft, command], check=True, capture_output=True, timeout=30)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Outside:
    namespace: str
    ports: dict[str, int]


@pytest.fixture(scope="module")
def outside() -> Iterator[Outside]:
    """A namespace linked to the machine by a veth pair, with listeners on its side."""
    if os.geteuid() != 0:
        require_or_skip("packet rules and network namespaces need root")
    if egress.nft_path() is None or shutil.which("ip") is None:
        require_or_skip("nft or ip is not installed (apt-get install nftables iproute2)")
    tag = f"{os.getpid() % 100000}"
    namespace, ours, theirs = f"krt-egress-{tag}", f"krteg{tag}a", f"krteg{tag}b"
    server: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", ours, "type", "veth", "peer", "name", theirs, "netns", namespace)
        for address in HOST_SIDE.values():
            _ip("addr", "add", f"{address}/30", "dev", ours)
        for address in NS_SIDE.values():
            _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", theirs)
        _ip("link", "set", ours, "up")
        _ip("-n", namespace, "link", "set", theirs, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", OUTSIDE, json.dumps(NS_SIDE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], START_TIMEOUT_S)
        assert ready, "the namespace's listeners did not start"
        yield Outside(namespace, json.loads(server.stdout.readline()))
    finally:
        if server is not None:
            assert server.stdin is not None and server.stdout is not None
            server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            server.stdout.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", ours)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", namespace)


@dataclass
class Target:
    runtime: RuntimeHost
    control: pb_grpc.FunctionRuntimeStub
    gateway: pb_grpc.FunctionRuntimeStub
    pki: TestPKI

    def register(self, source: str) -> str:
        run_uid = str(uuid.uuid4())
        run = pb.RunRef(run_uid=run_uid, attempt=1, namespace="default", name="fn", runtime="python")
        signed = self.pki.sign(
            run_uid=run_uid, attempt=1, host_id=self.runtime.options.host_id, host_uid=self.runtime.host_uid
        )
        config = pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=source.encode())]),
        )
        request = pb.RegisterFunctionRequest(run=run, config=config, assignment=signed)
        return str(self.control.RegisterFunction(request, timeout=60).registration_id)

    def unregister(self, registration: str) -> None:
        self.control.UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=registration, grace_ms=100), timeout=30
        )

    def invoke(self, registration: str, payload: dict[str, Any]) -> Any:
        answer = self.gateway.InvokeFunction(
            pb.InvokeFunctionRequest(
                registration_id=registration, payload=json.dumps(payload).encode(), timeout_ms=60_000
            ),
            timeout=70,
        )
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, (answer.error.type, answer.error.message)
        return json.loads(answer.outputs_json)

    def uid_of(self, registration: str) -> int:
        reg = self.runtime.registry.get(registration)
        assert reg is not None and reg.lease is not None and reg.lease.uid is not None
        return int(reg.lease.uid)

    @property
    def rules(self) -> egress.PacketRules:
        assert self.runtime.isolation is not None and self.runtime.isolation.rules is not None
        return self.runtime.isolation.rules


@contextlib.contextmanager
def serving(pki: TestPKI, state: Path, host_id: str, first_uid: int, **sandbox: Any) -> Iterator[Target]:
    settings = SandboxSettings(uids=UidRange(first_uid, COUNT), lock_dir=str(state / "uids"), **sandbox)
    runtime = loopback_host(pki, state, host_id=host_id, sandbox=settings)
    address = runtime.start()
    try:
        with (
            pki.channel(address, as_=pki.control_plane) as control,
            pki.channel(address, as_=pki.gateway) as gateway,
        ):
            yield Target(
                runtime, pb_grpc.FunctionRuntimeStub(control), pb_grpc.FunctionRuntimeStub(gateway), pki
            )
    finally:
        runtime.stop(grace_s=1)
        _forget_range(first_uid, first_uid + COUNT - 1)


@pytest.fixture(scope="module")
def outbound(outside: Outside, pki: TestPKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A host of the default network, allowing one port of the namespace's private address."""
    allowed = parse_allow(f"{NS_SIDE['private']}/32:{outside.ports['private']}")
    with serving(
        pki, tmp_path_factory.mktemp("outbound"), "outbound-0", FIRST_UID, egress_allow=(allowed,)
    ) as target:
        yield target


@pytest.fixture(scope="module")
def listeners() -> Iterator[dict[str, list[Any]]]:
    """What the test listens on of the machine: loopback (three ways), an address of the machine
    that is neither loopback nor private (the veth's), an abstract Unix socket."""
    made: list[socket.socket] = []
    targets: dict[str, list[Any]] = {}
    try:
        for name, family, address in (
            ("loopback", socket.AF_INET, "127.0.0.1"),
            ("loopback-2", socket.AF_INET, "127.0.0.2"),
            ("loopback-6", socket.AF_INET6, "::1"),
            ("machine", socket.AF_INET, HOST_SIDE["internet"]),
        ):
            server = socket.create_server((address, 0), family=family, backlog=64)
            made.append(server)
            targets[name] = [
                "tcp6" if family == socket.AF_INET6 else "tcp4",
                [address, server.getsockname()[1]],
            ]
        abstract = f"krt-egress-{uuid.uuid4().hex}"
        unix = socket.socket(socket.AF_UNIX)
        made.append(unix)
        unix.bind("\0" + abstract)
        unix.listen(64)
        targets["abstract"] = ["unix", abstract]
        targets["udp-loopback"] = ["udp", ["127.0.0.1", targets["loopback"][1][1]]]
        yield targets
    finally:
        for server in made:
            server.close()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _targets(outside: Outside, listeners: dict[str, list[Any]], host: RuntimeHost) -> dict[str, list[Any]]:
    targets = dict(listeners)
    targets["host-grpc"] = ["tcp4", ["127.0.0.1", _port(host.address)]]
    if host.invoke_address:
        targets["host-invoke"] = ["tcp4", ["127.0.0.1", _port(host.invoke_address)]]
    for name in ("internet", "linklocal", "private"):
        targets[name] = ["tcp4", [NS_SIDE[name], outside.ports[name]]]
    targets["private-other"] = ["tcp4", [NS_SIDE["private"], outside.ports["private-other"]]]
    targets["bind"] = ["bind", None]
    return targets


def _reachable_from_here(targets: dict[str, list[Any]]) -> None:
    """The test itself (root, no pool uid) reaches every TCP target: each refusal below is the
    rules', not a listener missing."""
    for kind, address in targets.values():
        if kind in ("tcp4", "tcp6"):
            family = socket.AF_INET6 if kind == "tcp6" else socket.AF_INET
            with socket.socket(family) as s:
                s.settimeout(10)
                s.connect(tuple(address))
        elif kind == "unix":
            with socket.socket(socket.AF_UNIX) as s:
                s.connect("\0" + address)


REFUSED = "ConnectionRefusedError"  # a reset: at once, no timeout


def test_an_outbound_function_and_its_grandchild_reach_the_world_and_nothing_of_the_machine(
    outbound: Target, outside: Outside, listeners: dict[str, list[Any]]
) -> None:
    targets = _targets(outside, listeners, outbound.runtime)
    _reachable_from_here(targets)
    registration = outbound.register(PROBE)
    try:
        found = outbound.invoke(registration, {"targets": targets})
    finally:
        outbound.unregister(registration)
    expected = {
        "loopback": REFUSED,
        "loopback-2": REFUSED,
        "loopback-6": REFUSED,
        "machine": REFUSED,
        "host-grpc": REFUSED,
        "linklocal": REFUSED,
        "private-other": REFUSED,
        "abstract": "PermissionError",  # Landlock's scope
        "udp-loopback": "PermissionError",  # refused before it leaves
        "bind": "PermissionError",  # Landlock: no TCP port of the machine taken
        "internet": "connected",
        "private": "connected",  # the allow list's one destination
    }
    if "host-invoke" in targets:
        expected["host-invoke"] = REFUSED
    assert found["uid"] in range(FIRST_UID, FIRST_UID + COUNT)
    assert found["function"] == expected
    assert found["grandchild"] == expected


def test_what_the_host_says_is_in_force(outbound: Target) -> None:
    in_force = outbound.runtime.in_force
    assert in_force is not None and in_force.network is Network.OUTBOUND
    summary = in_force.describe()
    assert "network outbound (packet rules" in summary and "1 allowed destination" in summary
    assert "Landlock ABI" in summary, summary


def test_an_allow_list_lives_as_long_as_its_function_and_resolvers_pass(outbound: Target) -> None:
    registration = outbound.register("def handle(p):\n    return {}\n")
    uid = outbound.uid_of(registration)
    assert outbound.rules.holds(uid) == ["allow4"]
    outbound.unregister(registration)
    eventually_blocking(lambda: outbound.rules.holds(uid) == [], what=f"uid {uid}'s allow list is taken back")
    listed = outbound.rules.elements("dns4") + outbound.rules.elements("dns6")
    assert {str(a) for a in egress.nameservers()} <= {str(e) for e in listed}


def test_network_host_is_the_opt_out_and_its_uid_is_closed_again_when_released(
    pki: TestPKI, tmp_path: Path, listeners: dict[str, list[Any]], outbound: Target
) -> None:
    with serving(pki, tmp_path, "opened-0", FIRST_UID + 2 * COUNT, network=Network.HOST) as host:
        registration = host.register(PROBE)
        uid = host.uid_of(registration)
        assert host.rules.holds(uid) == ["open"]
        targets = {"loopback": listeners["loopback"], "bind": ["bind", None]}
        found = host.invoke(registration, {"targets": targets})
        assert found["function"] == found["grandchild"] == {"loopback": "connected", "bind": "bound"}
        host.unregister(registration)
        eventually_blocking(lambda: host.rules.holds(uid) == [], what=f"uid {uid} is closed again")


def test_a_busy_uid_left_with_elements_is_scrubbed_before_it_is_handed_out(tmp_path: Path) -> None:
    if os.geteuid() != 0 or egress.nft_path() is None:
        require_or_skip("packet rules need root and nft")
    first = FIRST_UID + 4 * COUNT
    rules = egress.PacketRules(lock_dir=str(tmp_path))
    rules.install(first, first, resolvers=())
    try:
        allow = (parse_allow("10.1.2.3/32:5432"), parse_allow("[fd00::/8]:443"))
        rules.admit(first, open_=True, allow=allow)  # as a host that then died
        (tmp_path / str(first)).write_bytes(b"busy")
        assert rules.holds(first) == ["open", "allow4", "allow6"]
        claim = UidPool(UidRange(first, 1), lock_dir=str(tmp_path), scrub=rules.scrub).claim()
        assert claim.uid == first and rules.holds(first) == []
    finally:
        rules.scrub(first)
        _forget_range(first, first)


def _isolation(settings: SandboxSettings, **options: Any) -> FunctionIsolation:
    return FunctionIsolation(settings, host_uid="h", hide=(), keep=(), switch_uids=lambda: True, **options)


def test_outbound_without_cap_net_admin_is_refused_naming_the_way_out(tmp_path: Path) -> None:
    isolation = _isolation(SandboxSettings(lock_dir=str(tmp_path)), filter_packets=lambda: False)
    with pytest.raises(IsolationUnavailable, match="CAP_NET_ADMIN.*network: host"):
        isolation.start(namespaces=True, network_namespaces=True, work_root=tmp_path)


def test_outbound_without_nft_is_refused_naming_the_package(tmp_path: Path) -> None:
    isolation = _isolation(
        SandboxSettings(lock_dir=str(tmp_path)), filter_packets=lambda: True, nft=str(tmp_path / "no-nft")
    )
    with pytest.raises(IsolationUnavailable, match="apt-get install nftables"):
        isolation.start(namespaces=True, network_namespaces=True, work_root=tmp_path)


def test_a_same_user_host_says_outbound_is_unenforced(tmp_path: Path) -> None:
    isolation = _isolation(SandboxSettings(isolation=Isolation.SAME_USER, lock_dir=str(tmp_path)))
    try:
        in_force = isolation.start(namespaces=True, network_namespaces=True, work_root=tmp_path)
    finally:
        isolation.close()
    assert "outbound unenforced" in in_force.describe()
    assert isolation.rules is None
