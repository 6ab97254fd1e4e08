"""The gateway starts and reads InvocationWorkflows without pydantic or the Temporal SDK, so it
spells their names itself (kruntimes.wire.invocations) and writes their input by hand
(gateway/async_invoke.py `input_json`): both held here to the contract
(kruntimes.contracts.invocation) and to the workers' own converter and codec, which read what the
gateway writes."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from kruntimes.contracts import invocation as contract
from kruntimes.contracts.names import TASK_QUEUE
from kruntimes.gateway.async_invoke import FUNCTION, RUN, Target, input_json
from kruntimes.rpc.v1 import visibility_pb2 as pb
from kruntimes.temporal.codec import EncryptionCodec, Keyring, add_key
from kruntimes.temporal.sealing import Sealer
from kruntimes.wire import invocations as names

UID = "0b9d4f5e-8a51-4c7e-9d0f-1a2b3c4d5e6f"


def test_the_names_are_the_contracts() -> None:
    assert names.INVOCATION_WORKFLOW == contract.INVOCATION_WORKFLOW
    assert names.INVOCATION_STATUS_MEMO == contract.INVOCATION_STATUS_MEMO
    assert names.INVOCATION_DIGEST_MEMO == contract.INVOCATION_DIGEST_MEMO
    assert names.TASK_QUEUE == TASK_QUEUE
    assert tuple(s.value for s in contract.InvocationState) == names.STATES
    assert contract.InvocationState.Queued.value == names.QUEUED
    assert {s.value for s in contract.TERMINAL_STATES} == names.TERMINAL_STATES
    assert names.invocation_workflow_id("ns", UID, "a/b c") == contract.invocation_workflow_id(
        "ns", UID, "a/b c"
    )
    assert (contract.TargetKind.Run.value, contract.TargetKind.Function.value) == (RUN, FUNCTION)


@pytest.mark.parametrize(
    ("target", "timeout_s", "callback"),
    [
        (Target(RUN, "default", UID, "hello", "python"), None, None),
        (Target(FUNCTION, "team-a", UID, "fn"), 2.5, "https://hooks.example/in?x=1"),
    ],
)
@pytest.mark.parametrize("body", ['{"name": "x"}', "", '["é", "\\u0000", "\\"q\\"", "\u2028"]\n'])
def test_the_input_is_what_the_workers_converter_writes(
    target: Target, timeout_s: float | None, callback: str | None, body: str
) -> None:
    at = datetime(2026, 12, 6, 16, 16, 9, 123456, tzinfo=UTC)
    digest = hashlib.sha256(body.encode()).hexdigest()
    mine = input_json(
        target,
        "inv/1 ?#",
        digest=digest,
        body=body,
        timeout_s=timeout_s,
        accepted_at=at,
        caller="alice",
        callback_url=callback,
    )
    model = contract.InvocationInput(
        target=contract.Target(**target.as_json()),  # type: ignore[arg-type]
        invocationId="inv/1 ?#",
        bodySha256=digest,
        body=body,
        timeoutSeconds=timeout_s,
        acceptedAt=at,
        caller="alice",
        callbackUrl=callback,
    )
    (theirs,) = pydantic_data_converter.payload_converter.to_payloads([model])
    assert theirs.metadata == {"encoding": b"json/plain"}
    written, encoded = json.loads(mine), json.loads(theirs.data)
    # the fields it writes, in the contract's order, as the converter writes them (the others
    # keep their defaults)
    assert list(written) == [k for k in encoded if k in written]
    assert written == {k: encoded[k] for k in written}
    assert contract.InvocationInput.model_validate_json(mine) == model


async def test_a_sealed_payload_is_the_codecs_and_the_codecs_opens_here(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    add_key(keys, key_id="20260101T000000Z")
    add_key(keys, key_id="20260202T000000Z")
    sealer, codec = Sealer(Keyring.load(keys)), EncryptionCodec(Keyring.load(keys))
    plain = pb.VisiblePayload(metadata={"encoding": b"json/plain"}, data=b'"abc"')
    metadata, data = sealer.seal(plain.SerializeToString())
    assert metadata[b"encryption-key-id".decode()] == b"20260202T000000Z", "the newest key seals"
    (opened,) = await codec.decode([Payload(metadata=metadata, data=data)])
    assert (dict(opened.metadata), opened.data) == ({"encoding": b"json/plain"}, b'"abc"')
    (sealed,) = await codec.encode([Payload(metadata={"encoding": b"json/plain"}, data=b"[1]")])
    back = pb.VisiblePayload.FromString(sealer.open(sealed.metadata["encryption-key-id"], sealed.data))
    assert (dict(back.metadata), back.data) == ({"encoding": b"json/plain"}, b"[1]")
