from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kruntimes.sdk.client import Client
from tests.sdk.stack import Platform


@pytest.fixture
async def krt(platform: Platform) -> AsyncIterator[Client]:
    async with Client(platform.config) as client:
        yield client
