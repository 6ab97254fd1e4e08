"""The one way every kruntimes process connects to Temporal: the pydantic data converter, the
payload codec when keys are given, and TLS, mTLS or an API key as the `temporal` CLI takes them.

Whoever reaches the Temporal frontend can list, read, cancel, terminate and start Runs: Temporal
access is control-plane admin. Against a cluster, use TLS (mTLS or an API key); the embedded dev
server listens on loopback only.

    TemporalSettings   address, namespace, TLS files, API key (or its file), codec key directory
    add_arguments      the --temporal-* flags of an entry point (worker, gateway, codec server)
    settings_from      those flags (and KRT_TEMPORAL_* variables) → TemporalSettings
                       (these three live in kruntimes.temporal.settings, which loads no SDK)
    connect            a Client with all of it
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    EncodingPayloadConverter,
    PayloadCodec,
)
from temporalio.converter import PayloadConverter as SdkPayloadConverter
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime

from kruntimes.contracts.names import POOL_READING_BACK, QUERY_POOL
from kruntimes.contracts.pool import PoolQuery, PoolState, pool_query_parts
from kruntimes.temporal.codec import PLAIN, PlainFailure
from kruntimes.temporal.settings import ENV, MAX_API_KEY_BYTES, TemporalSettings, add_arguments, settings_from
from kruntimes.wire.summaries import Plain

__all__ = [  # the settings and flags are kruntimes.temporal.settings', named here too
    "DATA_CONVERTER",
    "ENV",
    "MAX_API_KEY_BYTES",
    "POOL_SETTLE_S",
    "PayloadConverter",
    "TemporalSettings",
    "add_arguments",
    "connect",
    "data_converter",
    "query_pool",
    "settings_from",
]

POOL_SETTLE_S = 10.0  # how long a pool query waits out a read-back after continue-as-new

# The SDK's loggers append the workflow's or activity's details to a line's format string, where a
# caller's `%` (an async invocation's id, in its workflow id) breaks the line's formatting; the
# same details stay on the record (`temporal_workflow`, `temporal_activity`), which the JSON lines
# (kruntimes.system.logs) carry.
workflow.logger.workflow_info_on_message = False
activity.logger.activity_info_on_message = False


class PayloadConverter(PydanticPayloadConverter):
    """The SDK's pydantic payload converter, with one set of encoders for the whole process.

    The worker builds a new payload converter for every workflow activation; the stock class
    starts each with an empty pydantic TypeAdapter cache, so every activation would rebuild the
    adapters of the models it decodes. Instances here share the first instance's encoders and
    with them its cache (an LRU bounded at the SDK's default of 1024 types, thread-safe). The
    wire format is unchanged.
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


# The platform's own failures whose text is fixed and which a caller tells apart by their message
# (a query's failure reaches the client as its message alone): they stay plain text.
PLAIN_FAILURE_TYPES = frozenset({"PoolReadingBack"})


class SealedFailureConverter(DefaultFailureConverter):
    """With a codec, a failure's message and stack trace go into its encoded attributes, which
    the codec encrypts like any payload: they may quote what a handler wrote (a connection
    string, a secret from its env), and history would otherwise keep them as plain text. Only
    the type (a Run's reason) stays readable, and the message reads "Encoded failure" to whoever
    has no key; the worker, krt and the SDK decode it, the UI and `temporal` through the codec
    server. PLAIN_FAILURE_TYPES and a PlainFailure (the platform's own words) are left as they
    are: its details are payloads and the codec encrypts them."""

    def __init__(self) -> None:
        super().__init__(encode_common_attributes=True)
        self._plain = DefaultFailureConverter()

    def to_failure(
        self, exception: BaseException, payload_converter: SdkPayloadConverter, failure: Failure
    ) -> None:
        if isinstance(exception, PlainFailure):
            self._plain.to_failure(exception, payload_converter, failure)
            failure.stack_trace = ""  # the workflow's own frames: what the message says is all
        elif isinstance(exception, ApplicationError) and exception.type in PLAIN_FAILURE_TYPES:
            self._plain.to_failure(exception, payload_converter, failure)
        else:
            super().to_failure(exception, payload_converter, failure)


# Without a codec: what tests and tools that read plain histories use. (Failures stay plain too:
# without a key, encoded attributes would hide nothing, only make them unreadable.)
DATA_CONVERTER = DataConverter(payload_converter_class=PayloadConverter)


def data_converter(codec: PayloadCodec | None = None) -> DataConverter:
    if codec is None:
        return DATA_CONVERTER
    return DataConverter(
        payload_converter_class=PayloadConverter,
        payload_codec=codec,
        failure_converter_class=SealedFailureConverter,
    )


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


async def query_pool(
    client: Client, workflow_id: str, *, rpc_timeout: timedelta | None = None, reservations: bool = True
) -> PoolState:
    """A pool's state, read in parts: the state without its reservations first, then the
    reservations and owners of POOL_QUERY_SLOTS slots' worth of hosts at a time (the whole of a
    big pool is past what the server takes as one answer, 2 MB). The parts
    are read one after another, so a Run that moved between hosts meanwhile can show on both or
    neither; its readers (the reconciler, `krt hosts`) leave what is younger than a grace alone.
    With `reservations` False only the first part is read: the hosts, the queue and the
    scale-outs, no reservation or owner. A pool that takes no argument (older code) is read
    whole."""
    try:
        summary = await _query_pool(client, workflow_id, PoolQuery(reservations=False), rpc_timeout)
    except WorkflowQueryFailedError as err:
        if POOL_READING_BACK in str(err):
            raise
        return await _query_pool(client, workflow_id, None, rpc_timeout)
    if not reservations:
        return summary
    held = []
    owners: dict[str, str] = {}
    for hosts in pool_query_parts(summary.hosts):
        part = await _query_pool(client, workflow_id, PoolQuery(hosts=hosts), rpc_timeout)
        held.extend(part.reservations)
        owners.update(part.owners)
    return summary.model_copy(update={"reservations": held, "owners": owners})


async def _query_pool(
    client: Client, workflow_id: str, ask: PoolQuery | None, rpc_timeout: timedelta | None
) -> PoolState:
    """One `pool` query. Right after the pool continued as new it refuses the query until it has
    read its hosts' reservations back (a state without them would show taken slots as free);
    that takes a few local activities, so this asks again for up to `POOL_SETTLE_S`."""
    deadline = time.monotonic() + POOL_SETTLE_S
    pause = 0.02
    args = [] if ask is None else [ask]
    while True:
        try:
            state: PoolState = await client.get_workflow_handle(workflow_id).query(
                QUERY_POOL, *args, result_type=PoolState, rpc_timeout=rpc_timeout
            )
            return state
        except WorkflowQueryFailedError as err:
            if POOL_READING_BACK not in str(err) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)
