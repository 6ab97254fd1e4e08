"""`krt gateway`'s flags: the connection limits (validated, named by their flags in errors) and the
optional Temporal connection of the known-Runs view (the shared --temporal-* flags)."""

from __future__ import annotations

import pytest

from kruntimes.gateway.listener import HttpLimits
from kruntimes.workers.gateway import limits_from, parse_args, temporal_settings

REQUIRED = ["--cert", "c.pem", "--key", "k.pem", "--peer-tls", "pki", "--assignment-public-key", "a.pub"]


def test_the_limits_default_to_the_safe_ones_and_take_their_flags() -> None:
    assert limits_from(parse_args(REQUIRED)) == HttpLimits()
    args = parse_args(
        [
            *REQUIRED,
            *("--header-timeout", "2.5", "--body-timeout", "4", "--body-min-rate", "100"),
            *("--idle-timeout", "30", "--max-connections", "50", "--max-connections-per-client", "5"),
        ]
    )
    assert limits_from(args) == HttpLimits(
        header_timeout_s=2.5,
        body_timeout_s=4,
        body_min_rate=100,
        idle_timeout_s=30,
        max_connections=50,
        max_connections_per_client=5,
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--header-timeout", "0"], "--header-timeout"),
        (["--body-min-rate", "0"], "--body-min-rate"),
        (["--max-connections", "4", "--max-connections-per-client", "8"], "--max-connections-per-client"),
    ],
)
def test_a_limit_out_of_bounds_stops_the_gateway_naming_its_flag(flags: list[str], named: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        limits_from(parse_args([*REQUIRED, *flags]))
    assert str(stopped.value).startswith("krt gateway: ") and named in str(stopped.value)


def test_temporal_is_used_only_when_an_address_is_given() -> None:
    assert temporal_settings(parse_args(REQUIRED), env={}) is None
    flagged = temporal_settings(
        parse_args([*REQUIRED, "--temporal-address", "127.0.0.1:7233", "--temporal-tls-ca", "ca.pem"]), env={}
    )
    assert flagged is not None and flagged.address == "127.0.0.1:7233" and flagged.tlsCa == "ca.pem"
    from_env = temporal_settings(parse_args(REQUIRED), env={"KRT_TEMPORAL_ADDRESS": "temporal:7233"})
    assert from_env is not None and from_env.address == "temporal:7233" and not from_env.uses_tls
    with pytest.raises(SystemExit, match="krt gateway: the Temporal settings are unusable"):
        temporal_settings(
            parse_args([*REQUIRED, "--temporal-address", "t:1", "--temporal-tls-cert", "c"]), env={}
        )
