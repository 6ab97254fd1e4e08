"""The one way every kruntimes process connects to Temporal: with the pydantic data converter."""

from __future__ import annotations

from typing import ClassVar

from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter
from temporalio.runtime import Runtime


class PayloadConverter(PydanticPayloadConverter):
    """The SDK's pydantic payload converter, with one set of encoders for the whole process.

    The worker builds a new payload converter for every workflow activation; the stock class
    starts each with an empty pydantic TypeAdapter cache, so every activation rebuilt the
    adapters of the models it decoded (5% of the worker's CPU for warm Runs, measured with
    py-spy). Instances here share the first instance's encoders and with them its cache (an LRU
    bounded at the SDK's default of 1024 types, thread-safe). The wire format is unchanged.
    """

    _shared: ClassVar[tuple[EncodingPayloadConverter, ...] | None] = None

    def __init__(self) -> None:
        shared = PayloadConverter._shared
        if shared is None:
            super().__init__()
            PayloadConverter._shared = tuple(self.converters.values())
        else:
            CompositePayloadConverter.__init__(self, *shared)


DATA_CONVERTER = DataConverter(payload_converter_class=PayloadConverter)


async def connect(address: str, namespace: str = "default", *, runtime: Runtime | None = None) -> Client:
    return await Client.connect(address, namespace=namespace, data_converter=DATA_CONVERTER, runtime=runtime)
