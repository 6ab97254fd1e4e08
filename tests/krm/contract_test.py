"""The krm adapter's invocation contract (kruntimes.wire.krm) and the store's podExecutor lookup."""

from __future__ import annotations

import json

import pytest

from kruntimes.api import outputs as api_outputs
from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.krm import errors
from kruntimes.krm.store import Store
from kruntimes.wire import krm as contract
from tests.krm.pods import WHO, pod_config


def test_a_resource_list_round_trips_through_the_payload() -> None:
    text = 'apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [] # ü "q"\n'.encode()
    assert contract.decode_request(contract.encode_request(text)) == text


def test_a_payload_over_the_invoke_bound_or_not_utf8_is_refused() -> None:
    with pytest.raises(contract.ContractError, match="over the invoke API's bound"):
        contract.encode_request(b"x" * MAX_PAYLOAD_BYTES)
    with pytest.raises(contract.ContractError, match="not UTF-8"):
        contract.encode_request(b"\xff\xfe")
    for bad in (b"", b"[]", b'{"resourceList": 1}', b"{"):
        with pytest.raises(contract.ContractError):
            contract.decode_request(bad)


@pytest.mark.parametrize("size", [0, 1, 40_000, 200_000])
def test_stdout_is_cut_into_pieces_within_the_outputs_bounds(size: int) -> None:
    line = 'metadata: {name: "x\\y", labels: {t\u00fc: a}}\n'  # quotes, a backslash, not ASCII
    stdout = (line * (size // len(line) + 1))[:size].encode()
    encoded = contract.encode_outputs(exit_code=3, stdout=stdout, stdout_bytes=len(stdout))
    api_outputs.check_encoded(encoded)  # what the gateway checks too
    assert contract.decode_outputs(json.loads(encoded)) == (3, stdout, len(stdout))


def test_stdout_over_the_bound_says_so_without_pieces() -> None:
    big = b"y" * contract.MAX_STDOUT_BYTES
    encoded = contract.encode_outputs(exit_code=0, stdout=big, stdout_bytes=len(big) + 10)
    assert contract.decode_outputs(json.loads(encoded)) == (0, None, len(big) + 10)
    escaped = b"\x01" * 100_000  # six bytes of JSON each: it cannot fit
    encoded = contract.encode_outputs(exit_code=0, stdout=escaped, stdout_bytes=len(escaped))
    api_outputs.check_encoded(encoded)
    assert contract.decode_outputs(json.loads(encoded))[1] is None


def test_the_pod_lookup_follows_the_tag_rules_and_keys_by_the_matched_entry() -> None:
    store = Store()
    store.replace(
        "test",
        [
            pod_config("fn", WHO, tags=["v2.1.0", "1.x"]),
            pod_config("any", WHO, tags=[]),
            pod_config("nosource", WHO, prefix="example.com/pod/bare"),
        ],
    )
    assert store.pod("example.com/pod/fn:v1.4.2", "").tag == "1.x"
    assert store.pod("example.com/pod/fn", "v2.1.0").tag == "v2.1.0"
    assert store.pod("example.com/pod/fn", "^2").tag == "v2.1.0"
    assert store.pod("example.com/pod/any:v9.9.9", "").tag == ""
    with pytest.raises(errors.NotFound):
        store.pod("example.com/pod/fn:v3.0.0", "")
    store.replace("test", [c for c in store.configs() if c.metadata.name == "nosource"])
    bare = store.configs()[0].model_copy(
        update={"spec": store.configs()[0].spec.model_copy(update={"podExecutor": None})}
    )
    store.replace("test", [bare])
    with pytest.raises(errors.NotFound, match="no FunctionConfig with a podExecutor source"):
        store.pod("example.com/pod/bare:v1.0.0", "")
