"""The one way every kruntimes process connects to Temporal: the pydantic data converter, the
payload codec when keys are given, and TLS, mTLS or an API key as the `temporal` CLI takes them.

Whoever reaches the Temporal frontend can list, read, cancel, terminate and start Runs: Temporal
access is control-plane admin. Against a cluster, use TLS (mTLS or an API key); the embedded dev
server listens on loopback only.

    TemporalSettings   address, namespace, TLS files, API key (or its file), codec key directory
    add_arguments      the --temporal-* flags of an entry point (worker, gateway, codec server)
    settings_from      those flags (and KRT_TEMPORAL_* variables) → TemporalSettings
    connect            a Client with all of it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, TLSConfig, WorkflowQueryFailedError
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    EncodingPayloadConverter,
    PayloadCodec,
)
from temporalio.runtime import Runtime

from kruntimes.api._base import ApiModel
from kruntimes.codec import PLAIN
from kruntimes.lifecycle import POOL_READING_BACK, QUERY_POOL, PoolState
from kruntimes.wire.summaries import Plain

MAX_API_KEY_BYTES = 16 * 1024
POOL_SETTLE_S = 10.0  # how long a pool query waits out a read-back after continue-as-new


class PayloadConverter(PydanticPayloadConverter):
    """The SDK's pydantic payload converter, with one set of encoders for the whole process.

    The worker builds a new payload converter for every workflow activation; the stock class
    starts each with an empty pydantic TypeAdapter cache, so every activation rebuilt the
    adapters of the models it decoded (5% of the worker's CPU for warm Runs, measured with
    py-spy). Instances here share the first instance's encoders and with them its cache (an LRU
    bounded at the SDK's default of 1024 types, thread-safe). The wire format is unchanged.
    """

    _shared: ClassVar[tuple[EncodingPayloadConverter, ...] | None] = None

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        """As the SDK's, except that a summary (`summaries.Plain`) is marked to stay unencrypted."""
        if not any(type(v) is Plain for v in values):
            return super().to_payloads(values)
        payloads = super().to_payloads([v for v in values if type(v) is not Plain])[::-1]
        return [
            Payload(
                metadata={"encoding": b"json/plain", PLAIN: b"1"},
                data=json.dumps(str(v), ensure_ascii=False).encode(),
            )
            if type(v) is Plain
            else payloads.pop()
            for v in values
        ]

    def __init__(self) -> None:
        shared = PayloadConverter._shared
        if shared is None:
            super().__init__()
            PayloadConverter._shared = tuple(self.converters.values())
        else:
            CompositePayloadConverter.__init__(self, *shared)


# Without a codec: what tests and tools that read plain histories use.
DATA_CONVERTER = DataConverter(payload_converter_class=PayloadConverter)


def data_converter(codec: PayloadCodec | None = None) -> DataConverter:
    if codec is None:
        return DATA_CONVERTER
    return DataConverter(payload_converter_class=PayloadConverter, payload_codec=codec)


class TemporalSettings(ApiModel):
    """How to reach Temporal. TLS is on when `tls` is set or any TLS file is given."""

    address: str = Field(default="127.0.0.1:7233", min_length=1)
    namespace: str = Field(default="default", min_length=1)
    tls: bool = False
    tlsCert: str | None = None  # client certificate (PEM) for mTLS
    tlsKey: str | None = None
    tlsCa: str | None = None  # the server's CA (PEM); None: the system's roots
    tlsServerName: str | None = None
    apiKey: str | None = Field(default=None, repr=False)
    apiKeyFile: str | None = None
    codecKeys: str | None = None  # directory of payload codec keys (kruntimes.codec)

    @model_validator(mode="after")
    def _pairs(self) -> TemporalSettings:
        if (self.tlsCert is None) != (self.tlsKey is None):
            raise ValueError(
                "tlsCert: a client certificate needs its key (tlsKey), and a key its certificate"
            )
        if self.apiKey is not None and self.apiKeyFile is not None:
            raise ValueError("apiKey: give the API key or its file (apiKeyFile), not both")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.tls or any(v is not None for v in (self.tlsCert, self.tlsCa, self.tlsServerName))

    def tls_config(self) -> TLSConfig | bool:
        if not self.uses_tls:
            return False
        return TLSConfig(
            server_root_ca_cert=_read(self.tlsCa) if self.tlsCa else None,
            client_cert=_read(self.tlsCert) if self.tlsCert else None,
            client_private_key=_read(self.tlsKey) if self.tlsKey else None,
            domain=self.tlsServerName,
        )

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
        from kruntimes.codec import EncryptionCodec, Keyring

        return EncryptionCodec(Keyring.load(self.codecKeys))


def _read(path: str, *, limit: int = 1024 * 1024) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


async def connect(
    target: str | TemporalSettings, namespace: str = "default", *, runtime: Runtime | None = None
) -> Client:
    """A Temporal client with the pydantic converter (and the codec, TLS and API key of `target`)."""
    settings = (
        target
        if isinstance(target, TemporalSettings)
        else TemporalSettings(address=target, namespace=namespace)
    )
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        data_converter=data_converter(settings.codec()),
        tls=settings.tls_config(),
        api_key=settings.api_key(),
        runtime=runtime,
    )


async def query_pool(client: Client, workflow_id: str, *, rpc_timeout: timedelta | None = None) -> PoolState:
    """A pool's state. Right after the pool continued as new it refuses the query until it has
    read its hosts' reservations back (a state without them would show taken slots as free);
    that takes a few local activities, so this asks again for up to `POOL_SETTLE_S`."""
    deadline = time.monotonic() + POOL_SETTLE_S
    pause = 0.02
    while True:
        try:
            state: PoolState = await client.get_workflow_handle(workflow_id).query(
                QUERY_POOL, result_type=PoolState, rpc_timeout=rpc_timeout
            )
            return state
        except WorkflowQueryFailedError as err:
            if POOL_READING_BACK not in str(err) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


# --- the --temporal-* flags of the entry points -----------------------------------------------

_FLAGS: dict[str, tuple[str, str]] = {
    # field: (flag, help)
    "address": ("--temporal-address", "Temporal frontend host:port"),
    "namespace": ("--namespace", "Temporal namespace"),
    "tlsCert": ("--temporal-tls-cert", "client certificate (PEM) for mTLS to Temporal"),
    "tlsKey": ("--temporal-tls-key", "its private key (PEM)"),
    "tlsCa": ("--temporal-tls-ca", "CA bundle (PEM) of Temporal's server certificate"),
    "tlsServerName": ("--temporal-tls-server-name", "the server name to verify"),
    "apiKeyFile": ("--temporal-api-key-file", "a file holding a Temporal API key"),
    "codecKeys": ("--codec-keys", "directory of payload encryption keys (kruntimes.codec)"),
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
    values: dict[str, object] = {}
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
    return TemporalSettings.model_validate(values)


def _default(field: str) -> str | None:
    return {"address": "127.0.0.1:7233", "namespace": "default"}.get(field)
