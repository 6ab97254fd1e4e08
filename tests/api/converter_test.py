"""The data converter every kruntimes process uses (kruntimes.temporal.connect)."""

from __future__ import annotations

from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, pydantic_data_converter

from kruntimes.contracts.run import RunInput
from kruntimes.temporal.connect import DATA_CONVERTER, PayloadConverter
from tests.workflows.conftest import run_manifest


def _json(converter: PayloadConverter) -> PydanticJSONPlainPayloadConverter:
    found = converter.converters[b"json/plain"]
    assert isinstance(found, PydanticJSONPlainPayloadConverter)
    return found


def test_every_instance_shares_one_json_encoder_and_so_its_type_adapter_cache() -> None:
    first, second = PayloadConverter(), PayloadConverter()
    assert _json(first) is _json(second)
    payload = first.to_payloads([RunInput(run=run_manifest("a", runtime="python"))])[0]
    first.from_payloads([payload], [RunInput])
    hits = _json(second)._type_adapter.cache_info().hits
    second.from_payloads([payload], [RunInput])  # the adapter built for the first is reused
    assert _json(second)._type_adapter.cache_info().hits == hits + 1


def test_the_wire_format_is_the_sdk_pydantic_converters() -> None:
    value = RunInput(run=run_manifest("b", runtime="python"), starterAdmits=True)
    ours = DATA_CONVERTER.payload_converter.to_payloads([value])
    theirs = pydantic_data_converter.payload_converter.to_payloads([value])
    assert ours == theirs
    assert DATA_CONVERTER.payload_converter.from_payloads(theirs, [RunInput]) == [value]
