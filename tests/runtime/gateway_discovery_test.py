"""Hosts find the gateways by a name that resolves to all of them (`dns+all://NAME:PORT`, the
gateways' headless Service on Kubernetes): a host's heartbeats go to every address the name
resolves to, a gateway that appears in the answer is heard from within an interval, one that
leaves gets a last `leaving` heartbeat, and a failing resolution keeps the last set, logged once.

Real gateways (their heartbeat servers over mutual TLS) on 127.0.0.1; the resolver is the one
function the discovery is given, answering what the test says (a name the system resolves cannot
be changed by a test)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.server import Gateway, GatewayOptions
from kruntimes.pki import PeerTLS, Role
from kruntimes.pki.local import ensure_tls
from kruntimes.runtime import discovery
from kruntimes.runtime.discovery import GatewayDiscovery, resolve_all, split_target
from kruntimes.runtime.heartbeat import HeartbeatSender
from kruntimes.workers import host as host_main
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

NAME, PORT = "gateways.krt.test", 9443
TARGET = f"dns+all://{NAME}:{PORT}"
INTERVAL_S = 1.0  # the shortest resolve interval allowed
WAIT_S = 30.0


class Dns:
    """The resolver the discovery is given: answers NAME with the addresses set, or fails."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.failing = False
        self.asked = 0

    def __call__(self, name: str, port: int) -> list[str]:
        assert (name, port) == (NAME, PORT)
        self.asked += 1
        if self.failing:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.addresses)


async def wait_for(check: Callable[[], bool], what: str) -> None:
    await eventually(check, within=WAIT_S, what=what)


@pytest.fixture
async def gateways(tmp_path: Path, pki: TestPKI) -> AsyncIterator[list[Gateway]]:
    tls = ensure_tls(tmp_path / "tls")
    (tmp_path / "tokens.csv").write_text("")
    (tmp_path / "tokens.csv").chmod(0o600)
    (tmp_path / "bindings.yaml").write_text("bindings: []\n")
    started = []
    try:
        for _ in range(3):
            authorizer = CachingAuthorizer(
                EmbeddedAuthorizer(
                    TokenFile(tmp_path / "tokens.csv"), RoleBindings.load(tmp_path / "bindings.yaml")
                )
            )
            gw = Gateway(
                GatewayOptions(
                    listen_host="127.0.0.1",
                    listen_port=0,
                    heartbeat_listen="127.0.0.1:0",
                    cert_file=tls.cert,
                    key_file=tls.key,
                    authorizer=authorizer,
                    peer_tls=pki.gateway,
                    assignments=pki.verifier(),
                )
            )
            await gw.start()
            started.append(gw)
        yield started
    finally:
        for gw in started:
            await gw.stop()


def hears(gw: Gateway, host_uid: str) -> bool:
    return host_uid in gw.routes._hosts  # (no public view of one host's entry)


async def test_heartbeats_follow_the_addresses_the_name_resolves_to(
    gateways: list[Gateway], pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    g1, g2, g3 = gateways
    dns = Dns()
    dns.addresses = [g1.heartbeat_address, g2.heartbeat_address]
    sender = HeartbeatSender(
        gateways=[TARGET],
        host_id="discovered-0",
        host_uid="uid-discovered-0",
        runtime="python",
        address="127.0.0.1:1",
        interval_s=0.2,
        tls=PeerTLS(pki.host_dir("discovered-0"), role=Role.HOST),
        snapshot=list,
        discovery=GatewayDiscovery(resolve=dns, interval_s=INTERVAL_S),
    )
    caplog.set_level(logging.INFO, logger=discovery.__name__)
    sender.start()
    try:
        await wait_for(lambda: hears(g1, "uid-discovered-0") and hears(g2, "uid-discovered-0"), "g1 and g2")
        assert not hears(g3, "uid-discovered-0")
        assert sender.gateways == [TARGET]  # what the supervision stream compares with stays the name
        await wait_for(
            lambda: {a for a, up in sender.links() if up} == {g1.heartbeat_address, g2.heartbeat_address},
            "both links up",
        )

        # a gateway added and one removed: picked up at the next resolution
        dns.addresses = [g2.heartbeat_address, g3.heartbeat_address]
        await wait_for(lambda: hears(g3, "uid-discovered-0"), "the added gateway hears the host")
        await wait_for(lambda: not hears(g1, "uid-discovered-0"), "the removed gateway got `leaving`")
        assert [a for a, _ in sender.links()] == [g2.heartbeat_address, g3.heartbeat_address]

        # resolution fails: the last set stays, and the failure is logged once, not per look
        dns.failing = True
        asked = dns.asked
        await wait_for(lambda: dns.asked >= asked + 3, "three failed resolutions")
        assert [a for a, _ in sender.links()] == [g2.heartbeat_address, g3.heartbeat_address]
        assert hears(g2, "uid-discovered-0") and hears(g3, "uid-discovered-0")
        failures = [r for r in caplog.records if r.getMessage().startswith("cannot resolve a gateway name")]
        assert len(failures) == 1 and failures[0].levelno == logging.WARNING

        # and it resolves again
        dns.failing = False
        dns.addresses = [g1.heartbeat_address]
        await wait_for(lambda: hears(g1, "uid-discovered-0"), "g1 hears the host again")
        await wait_for(
            lambda: not hears(g2, "uid-discovered-0") and not hears(g3, "uid-discovered-0"),
            "g2 and g3 dropped",
        )
        assert any(r.getMessage() == "gateway name resolves again" for r in caplog.records)
    finally:
        await asyncio.to_thread(sender.stop)
    await wait_for(lambda: not hears(g1, "uid-discovered-0"), "the stopping host says leaving")


def test_a_name_that_never_resolved_stands_for_no_gateway_and_addresses_pass_as_they_are() -> None:
    dns = Dns()
    dns.failing = True
    found = GatewayDiscovery(resolve=dns).expand(["127.0.0.1:7000", TARGET, "127.0.0.1:7000"])
    assert found == ["127.0.0.1:7000"]


def test_the_system_resolver_answers_every_address_with_the_port() -> None:
    assert resolve_all("127.0.0.1", PORT) == [f"127.0.0.1:{PORT}"]
    assert discovery._address("fd00::1", PORT) == f"[fd00::1]:{PORT}"
    with pytest.raises(OSError):
        resolve_all("no-such-name.invalid", PORT)


@pytest.mark.parametrize(
    "target", ["dns+all://", "dns+all://name", "dns+all://name:0", "dns+all://name:http", "dns+all://:80"]
)
def test_a_malformed_name_target_is_refused_by_krt_host(target: str) -> None:
    with pytest.raises(ValueError):
        split_target(target)
    argv = ["--host-id", "h", "--runtime", "python", "--state-dir", "/x", "--peer-tls", "/x"]
    args = host_main.parse_args([*argv, "--assignment-public-key", "/x", "--gateway", target])
    with pytest.raises(SystemExit, match="--gateway"):
        host_main.gateway_targets(args)


def test_the_resolve_interval_is_bounded() -> None:
    for interval in (0.5, 301.0):
        with pytest.raises(ValueError):
            GatewayDiscovery(interval_s=interval)
