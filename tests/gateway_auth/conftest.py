from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.gateway_auth.helpers import ISSUED


@pytest.fixture(autouse=True)
def no_token_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Everything logged at DEBUG and above while a test runs, tracebacks included, holds no token."""
    caplog.set_level(logging.DEBUG)
    yield
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    logged = "\n".join(formatter.format(record) for record in records)
    leaked = sum(token in logged for token in ISSUED)
    assert not leaked, f"{leaked} bearer token(s) were logged"
