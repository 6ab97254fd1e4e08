"""The committed gateway/openapi.json, which the gateway serves, is exactly what `make openapi`
generates from the answer bodies' models and the reasons catalogue."""

from __future__ import annotations

from kruntimes.gateway import openapi


def test_the_served_openapi_document_is_fresh() -> None:
    assert openapi.COMMITTED.read_text(encoding="utf-8") == openapi.rendered(), (
        "gateway/openapi.json is stale: run `make openapi` and commit"
    )
