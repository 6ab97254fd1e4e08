"""The one way every kruntimes process connects to Temporal: with the pydantic data converter."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime


async def connect(address: str, namespace: str = "default", *, runtime: Runtime | None = None) -> Client:
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, runtime=runtime
    )
