"""How to reach Temporal, without the Temporal SDK: the settings and the --temporal-* flags of the
entry points. The SDK client is made from them by `kruntimes.temporal.connect.connect`; the gateway, which
never loads the SDK, reads its visibility over gRPC with the same settings (gateway/visibility.py).

    TemporalSettings   address, namespace, TLS files, API key (or its file), codec key directory
    add_arguments      the --temporal-* flags of an entry point (worker, gateway, codec server)
    settings_from      those flags (and KRT_TEMPORAL_* variables) → TemporalSettings
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporalio.client import TLSConfig
    from temporalio.converter import PayloadCodec

MAX_API_KEY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class TemporalSettings:
    """How to reach Temporal. TLS is on when `tls` is set or any TLS file is given.

    A plain dataclass, not a pydantic model: the gateway reads these settings, and pydantic is
    not loaded in the gateway process (its memory)."""

    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    tls: bool = False
    tlsCert: str | None = None  # client certificate (PEM) for mTLS
    tlsKey: str | None = None
    tlsCa: str | None = None  # the server's CA (PEM); None: the system's roots
    tlsServerName: str | None = None
    apiKey: str | None = dataclasses.field(default=None, repr=False)
    apiKeyFile: str | None = None
    codecKeys: str | None = None  # directory of payload codec keys (kruntimes.temporal.codec)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tls":
                if not isinstance(value, bool):
                    raise ValueError(f"tls: must be true or false, not {type(value).__name__}")
            elif f.name in ("address", "namespace"):
                if not isinstance(value, str) or not value:
                    raise ValueError(f"{f.name}: must be a non-empty string")
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"{f.name}: must be a string, not {type(value).__name__}")
        if (self.tlsCert is None) != (self.tlsKey is None):
            raise ValueError(
                "tlsCert: a client certificate needs its key (tlsKey), and a key its certificate"
            )
        if self.apiKey is not None and self.apiKeyFile is not None:
            raise ValueError("apiKey: give the API key or its file (apiKeyFile), not both")

    @property
    def uses_tls(self) -> bool:
        return self.tls or any(v is not None for v in (self.tlsCert, self.tlsCa, self.tlsServerName))

    def tls_files(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The server's CA, the client certificate and its key, as read from their files (each
        None when not given)."""
        return (
            _read(self.tlsCa) if self.tlsCa else None,
            _read(self.tlsCert) if self.tlsCert else None,
            _read(self.tlsKey) if self.tlsKey else None,
        )

    def tls_config(self) -> TLSConfig | bool:
        """The SDK's TLS settings (the SDK is loaded here only: the gateway reads these settings
        without it)."""
        from temporalio.client import TLSConfig

        if not self.uses_tls:
            return False
        ca, cert, key = self.tls_files()
        return TLSConfig(
            server_root_ca_cert=ca, client_cert=cert, client_private_key=key, domain=self.tlsServerName
        )

    def cli_flags(self) -> list[str]:
        """The `temporal` CLI's flags for the address, namespace and TLS files (an API key is
        never put on a command line, where every local user sees it: TEMPORAL_API_KEY)."""
        flags = ["--address", self.address, "--namespace", self.namespace]
        for flag, value in (
            ("--tls-ca-path", self.tlsCa),
            ("--tls-cert-path", self.tlsCert),
            ("--tls-key-path", self.tlsKey),
            ("--tls-server-name", self.tlsServerName),
        ):
            if value is not None:
                flags += [flag, value]
        if self.tls and self.tlsCa is None:
            flags.append("--tls")
        return flags

    def api_key(self) -> str | None:
        if self.apiKeyFile is None:
            return self.apiKey
        raw = _read(self.apiKeyFile, limit=MAX_API_KEY_BYTES).decode().strip()
        if not raw:
            raise ValueError(f"apiKeyFile: {self.apiKeyFile} is empty")
        return raw

    def codec(self) -> PayloadCodec | None:
        if self.codecKeys is None:
            return None
        from kruntimes.temporal.codec import EncryptionCodec, Keyring

        return EncryptionCodec(Keyring.load(self.codecKeys))


def _read(path: str, *, limit: int = 1024 * 1024) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


_FLAGS: dict[str, tuple[str, str]] = {
    # field: (flag, help)
    "address": ("--temporal-address", "Temporal frontend host:port"),
    "namespace": ("--namespace", "Temporal namespace"),
    "tlsCert": ("--temporal-tls-cert", "client certificate (PEM) for mTLS to Temporal"),
    "tlsKey": ("--temporal-tls-key", "its private key (PEM)"),
    "tlsCa": ("--temporal-tls-ca", "CA bundle (PEM) of Temporal's server certificate"),
    "tlsServerName": ("--temporal-tls-server-name", "the server name to verify"),
    "apiKeyFile": ("--temporal-api-key-file", "a file holding a Temporal API key"),
    "codecKeys": ("--codec-keys", "directory of payload encryption keys (kruntimes.temporal.codec)"),
}
ENV: dict[str, str] = {
    "address": "KRT_TEMPORAL_ADDRESS",
    "namespace": "KRT_TEMPORAL_NAMESPACE",
    "tlsCert": "KRT_TEMPORAL_TLS_CERT",
    "tlsKey": "KRT_TEMPORAL_TLS_KEY",
    "tlsCa": "KRT_TEMPORAL_TLS_CA",
    "tlsServerName": "KRT_TEMPORAL_TLS_SERVER_NAME",
    "apiKey": "KRT_TEMPORAL_API_KEY",
    "apiKeyFile": "KRT_TEMPORAL_API_KEY_FILE",
    "codecKeys": "KRT_CODEC_KEYS",
}


def add_arguments(parser: argparse.ArgumentParser, *, default_address: str = "127.0.0.1:7233") -> None:
    """The Temporal connection flags (an API key is read from a file or KRT_TEMPORAL_API_KEY,
    never from the command line, where every local user sees it)."""
    for field, (flag, text) in _FLAGS.items():
        default = default_address if field == "address" else ("default" if field == "namespace" else None)
        parser.add_argument(flag, dest=f"temporal_{field}", default=default, help=text)
    parser.add_argument("--temporal-tls", action="store_true", help="TLS to Temporal with the system's roots")


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> TemporalSettings:
    """Flags first, then KRT_TEMPORAL_* variables (and KRT_CODEC_KEYS), then defaults."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for field in ENV:
        flag_value = getattr(args, f"temporal_{field}", None)
        flag_default = _default(field)
        if flag_value is not None and flag_value != flag_default:
            values[field] = flag_value
        elif env.get(ENV[field]):
            values[field] = env[ENV[field]]
        elif flag_value is not None:
            values[field] = flag_value
    values["tls"] = bool(getattr(args, "temporal_tls", False))
    if values.get("codecKeys"):
        values["codecKeys"] = str(Path(str(values["codecKeys"])).expanduser())
    return TemporalSettings(**values)


def _default(field: str) -> str | None:
    return {"address": "127.0.0.1:7233", "namespace": "default"}.get(field)
