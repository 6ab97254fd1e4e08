"""The `temporal` CLI's configuration for the embedded platform: `krt up` writes temporal.toml into
the state directory (0600), and `TEMPORAL_CONFIG_FILE=<state>/temporal.toml temporal ...` (or
`--config-file`) reaches the platform through its front with the owner's client certificate.

    [profile.default]   the front's address, the namespace, the owner's certificate and the
                        front's CA
    [profile.decode]    the same, and the codec endpoint with the admin token: `--profile decode`
                        shows payloads decoded (the CLI verifies the endpoint's certificate with
                        the system's roots, so give it SSL_CERT_FILE=<the front's CA>)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kruntimes.temporal.settings import TemporalSettings


def _string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, ASCII only)."""
    return json.dumps(value, ensure_ascii=True)


def render(temporal: TemporalSettings, *, codec_endpoint: str, token: str) -> str:
    lines = ["# Written by `krt up`: the temporal CLI's way to this platform (TEMPORAL_CONFIG_FILE)."]
    for profile in ("default", "decode"):
        lines += [
            "",
            f"[profile.{profile}]",
            f"address = {_string(temporal.address)}",
            f"namespace = {_string(temporal.namespace)}",
            "",
            f"[profile.{profile}.tls]",
            f"client_cert_path = {_string(str(temporal.tlsCert))}",
            f"client_key_path = {_string(str(temporal.tlsKey))}",
            f"server_ca_cert_path = {_string(str(temporal.tlsCa))}",
        ]
    lines += [
        "",
        "[profile.decode.codec]",
        f"endpoint = {_string(codec_endpoint)}",
        f"auth = {_string('Bearer ' + token)}",
    ]
    return "\n".join(lines) + "\n"


def write(path: Path, temporal: TemporalSettings, *, codec_endpoint: str, token: str) -> None:
    """temporal.toml, 0600 from its first byte (it holds the admin token), replaced at once."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render(temporal, codec_endpoint=codec_endpoint, token=token))
    tmp.replace(path)
