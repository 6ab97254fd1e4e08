"""How a runtime's network is said (the runtimes file, `krt host` flags) and checked, with no
packet sent: allow-list entries, the modes, the resolvers read, what `krt up` warns of, and when
a uid's leftover elements are scrubbed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kruntimes.activities.hosts.process import host_flags
from kruntimes.config.egress import MAX_ALLOW, parse_allow, parse_allow_list
from kruntimes.config.runtimes import PlatformConfigError, network_warnings, parse_config
from kruntimes.contracts.providers import HostDefaults, host_sandbox
from kruntimes.runtime.sandbox import egress, landlock
from kruntimes.runtime.sandbox.identity import NoFreeUid, UidPool, UidRange
from kruntimes.runtime.sandbox.policy import Network, SandboxSettings
from kruntimes.workers import host as host_main


@pytest.mark.parametrize(
    ("entry", "canonical", "ports"),
    [
        ("10.1.2.3/32:5432", "10.1.2.3/32:5432", "5432"),
        ("10.1.2.3:5432", "10.1.2.3/32:5432", "5432"),
        ("[fd00::/8]:443", "[fd00::/8]:443", "443"),
        ("[::1]:8080", "[::1/128]:8080", "8080"),
        ("192.0.2.0/24:*", "192.0.2.0/24:*", "1-65535"),
        ("198.51.100.7:8000-8099", "198.51.100.7/32:8000-8099", "8000-8099"),
    ],
)
def test_an_allow_entry_is_a_cidr_and_a_port(entry: str, canonical: str, ports: str) -> None:
    rule = parse_allow(entry)
    assert str(rule) == canonical and rule.ports() == ports


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.1.2.3/8:5432", "host bits set"),
        ("10.1.2.3", "not CIDR:PORT"),
        ("10.1.2.3:0", "1..65535"),
        ("10.1.2.3:70000", "1..65535"),
        ("10.1.2.3:123456", "number, LOW-HIGH or *"),
        ("10.1.2.3:90-80", "low to high"),
        ("10.1.2.3:ssh", "number, LOW-HIGH or *"),
        ("10.1.2.3:４４３", "not CIDR:PORT"),  # fullwidth digits: ASCII only
        ("fd00::/8:443", "IPv6 goes in brackets"),
        ("[10.0.0.0/8]:443", "brackets are for IPv6 only"),
        ("[fd00::/8]443", "[CIDR]:PORT"),
        ("example.com:443", "is not a CIDR"),
        ("1" * 80 + ":1", "not CIDR:PORT"),
    ],
)
def test_a_bad_allow_entry_is_refused_saying_why(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_allow(entry)


def test_an_allow_list_is_bounded_and_duplicates_count_once() -> None:
    assert len(parse_allow_list(["10.1.2.3:1", "10.1.2.3/32:1", "[fd00::/8]:443"])) == 2
    with pytest.raises(ValueError, match=f"at most {MAX_ALLOW}"):
        parse_allow_list([f"10.0.0.{i % 250}:{i + 1}" for i in range(MAX_ALLOW + 1)])


def _runtime(network: object) -> dict[str, object]:
    return {"runtimes": [{"name": "python", "adapter": "python", "network": network}]}


def test_the_runtimes_file_defaults_to_outbound_and_a_mapping_is_outbound_with_its_allow_list() -> None:
    default = parse_config({"runtimes": [{"name": "python", "adapter": "python"}]}).runtimes[0]
    assert (default.network_mode, default.egress_allow) == ("outbound", [])
    allowed = parse_config(_runtime({"egress": {"allow": ["10.1.2.3/32:5432", "[fd00::/8]:443"]}}))
    runtime = allowed.runtimes[0]
    assert (runtime.network_mode, runtime.egress_allow) == (
        "outbound",
        ["10.1.2.3/32:5432", "[fd00::/8]:443"],
    )
    opted_out = parse_config(_runtime("host")).runtimes[0]
    assert (opted_out.network_mode, opted_out.egress_allow) == ("host", [])


@pytest.mark.parametrize(
    ("network", "says"),
    [
        ("hots", "runtimes.0.network: one of outbound, host, none"),
        ({"egress": {"allow": ["10.1.2.3/8:5432"]}}, "runtimes.0.network: egress.allow: '10.1.2.3/8:5432'"),
        ({"egress": {"allow": ["10.0.0.1:1"] * (MAX_ALLOW + 1)}}, f"at most {MAX_ALLOW} items"),
        ({"egress": {"deny": []}}, "deny"),
    ],
)
def test_a_bad_network_in_the_runtimes_file_is_refused_by_field(network: object, says: str) -> None:
    with pytest.raises(PlatformConfigError) as refused:
        parse_config(_runtime(network))
    assert says in str(refused.value)


def _host_args(*flags: str) -> list[str]:
    return [
        "--host-id=python-0",
        "--runtime=python",
        "--state-dir=/tmp/krt-no-state",
        "--peer-tls=/tmp/krt-no-tls",
        "--assignment-public-key=/tmp/krt-no-key",
        *flags,
    ]


def test_the_runtimes_allow_list_reaches_the_host_as_flags() -> None:
    config = parse_config(_runtime({"egress": {"allow": ["10.1.2.3/32:5432", "[fd00::/8]:443"]}}))
    flags = host_flags(host_sandbox(config.runtimes[0], HostDefaults()))
    args = host_main.parse_args(_host_args(*flags))
    settings = host_main.sandbox_settings(args, host_main.limits(args))
    assert settings.network is Network.OUTBOUND
    assert [str(rule) for rule in settings.egress_allow] == ["10.1.2.3/32:5432", "[fd00::/8]:443"]


def test_krt_host_refuses_an_allow_list_outside_outbound_and_a_bad_entry() -> None:
    for flags, says in (
        (["--network=host", "--egress-allow=10.1.2.3:1"], "for network outbound, not host"),
        (["--egress-allow=10.1.2.3:0"], "1..65535"),
    ):
        args = host_main.parse_args(_host_args(*flags))
        with pytest.raises(SystemExit, match=says):
            host_main.sandbox_settings(args, host_main.limits(args))


def test_an_allow_list_is_for_outbound_only() -> None:
    with pytest.raises(ValueError, match="not none"):
        SandboxSettings(network=Network.NONE, egress_allow=(parse_allow("10.1.2.3:1"),))


def test_the_resolvers_are_the_nameservers_of_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# a comment\nsearch example.com\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\n"
        "nameserver not-an-address\nnameserver 10.255.255.53\noptions ndots:2\n"
    )
    assert [str(a) for a in egress.nameservers(str(conf))] == ["10.255.255.53", "fe80::1"]
    assert egress.nameservers(str(tmp_path / "none")) == ()


def test_krt_up_warns_of_network_host_and_of_outbound_it_cannot_enforce() -> None:
    config = parse_config(
        {
            "runtimes": [
                {"name": "open", "adapter": "python", "network": "host"},
                {"name": "fenced", "adapter": "python"},
                {"name": "alone", "adapter": "python", "network": "none"},
                {"name": "mine", "adapter": "bash", "isolation": "same-user"},
            ]
        }
    )
    as_root = network_warnings(config, default_isolation="uid", root=True)
    assert len(as_root) == 2
    assert as_root[0].startswith("runtime open: network host: its functions reach every listener")
    assert as_root[1].startswith("runtime mine: outbound unenforced: functions run as the host's own user")
    as_user = network_warnings(config, default_isolation="same-user", root=False)
    assert [w.split(":")[0] for w in as_user] == ["runtime open", "runtime fenced", "runtime mine"]
    assert "no packet rules without root" in as_user[1]


@pytest.mark.parametrize(
    ("abi", "deny", "says"),
    [
        (0, True, "no Landlock (the kernel lacks it)"),
        (3, True, "not scoped (Landlock ABI 3 < 6), TCP bind allowed (ABI 3 < 4)"),
        (5, True, "not scoped (Landlock ABI 5 < 6), TCP bind denied"),
        (7, True, "Landlock ABI 7: abstract Unix sockets and signals scoped, TCP bind denied"),
        (7, False, "Landlock ABI 7: abstract Unix sockets and signals scoped"),
    ],
)
def test_what_landlock_puts_in_force_is_said_per_kernel(abi: int, deny: bool, says: str) -> None:
    assert says in landlock.describe(abi, deny_tcp_bind=deny)


def test_a_busy_uid_is_scrubbed_before_it_is_handed_out_and_a_new_one_is_not(tmp_path: Path) -> None:
    scrubbed: list[int] = []
    first = 2_099_999_000  # no host's: between the default range and the pods'
    pool = UidPool(UidRange(first, 2), lock_dir=str(tmp_path), scrub=scrubbed.append)
    (tmp_path / str(first + 1)).write_bytes(b"busy")  # as a host that died left it
    claims = [pool.claim(), pool.claim()]
    assert [c.uid for c in claims] == [first, first + 1] and scrubbed == [first + 1]
    for claim in claims:
        pool.release(claim, contained=True)
    assert (tmp_path / str(first)).read_bytes() == b"clean"


def test_a_uid_whose_scrub_fails_is_never_handed_out(tmp_path: Path) -> None:
    def failing(uid: int) -> None:
        raise egress.PacketRulesUnavailable(f"nft: cannot list uid {uid}")

    first = 2_099_999_100
    (tmp_path / str(first)).write_bytes(b"busy")
    with pytest.raises(NoFreeUid):
        UidPool(UidRange(first, 1), lock_dir=str(tmp_path), scrub=failing).claim()
