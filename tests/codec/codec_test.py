"""The payload codec: encrypted at rest, every key decrypts, the newest encrypts."""

from __future__ import annotations

import base64
import os

import pytest
from temporalio.api.common.v1 import Payload

from kruntimes.temporal.codec import (
    ENCODING,
    KEY_ID,
    CodecError,
    EncryptionCodec,
    Keyring,
    add_key,
    ensure_key,
)


def _payload(text: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text)


async def test_a_payload_round_trips_and_is_ciphertext_in_between(tmp_path):
    codec = EncryptionCodec(Keyring.load(ensure_key(tmp_path / "keys")))
    secret = b'{"env": {"DB_PASSWORD": "hunter2"}}'
    (sealed,) = await codec.encode([_payload(secret)])
    assert sealed.metadata["encoding"] == ENCODING
    assert b"hunter2" not in sealed.SerializeToString()
    (opened,) = await codec.decode([sealed])
    assert opened == _payload(secret)


async def test_rotation_the_newest_key_encrypts_and_old_payloads_still_decrypt(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    add_key(keys, key_id="20260101T000000Z")
    old = EncryptionCodec(Keyring.load(keys))
    (sealed_old,) = await old.encode([_payload(b'"a"')])
    add_key(keys, key_id="20261201T000000Z")
    new = EncryptionCodec(Keyring.load(keys))
    (sealed_new,) = await new.encode([_payload(b'"b"')])
    assert sealed_new.metadata[KEY_ID] == b"20261201T000000Z"
    assert [p.data for p in await new.decode([sealed_old, sealed_new])] == [b'"a"', b'"b"']


async def test_a_payload_of_a_dropped_key_is_an_error_naming_the_key_not_the_key_material(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    add_key(keys, key_id="k1")
    (sealed,) = await EncryptionCodec(Keyring.load(keys)).encode([_payload(b"1")])
    (keys / "k1").unlink()
    add_key(keys, key_id="k2")
    with pytest.raises(CodecError, match="'k1'"):
        await EncryptionCodec(Keyring.load(keys)).decode([sealed])


async def test_tampered_ciphertext_does_not_decrypt(tmp_path):
    codec = EncryptionCodec(Keyring.load(ensure_key(tmp_path / "keys")))
    (sealed,) = await codec.encode([_payload(b"1")])
    sealed.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(CodecError):
        await codec.decode([sealed])


async def test_plain_payloads_written_before_the_codec_stay_readable(tmp_path):
    codec = EncryptionCodec(Keyring.load(ensure_key(tmp_path / "keys")))
    assert await codec.decode([_payload(b"1")]) == [_payload(b"1")]


def test_a_key_readable_by_others_is_refused(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k1").write_bytes(base64.b64encode(os.urandom(32)))
    (keys / "k1").chmod(0o644)
    with pytest.raises(CodecError, match="0600"):
        Keyring.load(keys)


@pytest.mark.parametrize(
    ("content", "why"), [(b"not base64!", "base64"), (base64.b64encode(b"short"), "bytes")]
)
def test_malformed_keys_are_refused(tmp_path, content, why):
    keys = tmp_path / "keys"
    keys.mkdir()
    fd = os.open(keys / "k1", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(CodecError, match=why):
        Keyring.load(keys)


def test_an_empty_key_directory_is_refused(tmp_path):
    (tmp_path / "keys").mkdir()
    with pytest.raises(CodecError, match="no key"):
        Keyring.load(tmp_path / "keys")


def test_ensure_key_keeps_existing_keys(tmp_path):
    keys = ensure_key(tmp_path / "keys")
    before = sorted(p.name for p in keys.iterdir())
    ensure_key(keys)
    assert sorted(p.name for p in keys.iterdir()) == before
    assert oct((keys / before[0]).stat().st_mode & 0o777) == "0o600"


async def test_only_summaries_the_converter_marked_stay_unencrypted(tmp_path):
    from kruntimes.temporal.codec import PLAIN
    from kruntimes.temporal.connect import data_converter
    from kruntimes.wire.summaries import summary

    codec = EncryptionCodec(Keyring.load(ensure_key(tmp_path)))
    converter = data_converter(codec)
    # A summary is marked by the converter and left as it is; the same text as an ordinary
    # value (an input, a secret that happens to read like a summary) is encrypted.
    text = "function python default/hello"
    marked, ordinary, number = await converter.encode([summary(text), text, 42])
    # Stored as an ordinary json/plain payload: the mark only tells the codec to pass it.
    assert dict(marked.metadata) == {"encoding": b"json/plain"} and PLAIN not in marked.metadata
    assert marked.data == b'"function python default/hello"'
    assert ordinary.metadata["encoding"] == ENCODING and text.encode() not in ordinary.data
    assert number.metadata["encoding"] == ENCODING
    assert await converter.decode([marked, ordinary, number], [str, str, int]) == [text, text, 42]
    # Values decoded from a payload are plain str, never the marked type: what a workflow
    # received cannot be sent on unencrypted by passing it along.
    [back] = await converter.decode([ordinary], [str])
    assert type(back) is str
    [again] = await converter.encode([back])
    assert again.metadata["encoding"] == ENCODING


def test_failures_are_sealed_but_the_pools_read_back_refusal_stays_plain() -> None:
    """With a codec, a failure's message and stack trace move into its encoded attributes (which
    the codec encrypts) and come back whole; the type stays readable. PoolReadingBack, which a
    client tells by its message alone, is left plain."""
    from temporalio.api.failure.v1 import Failure
    from temporalio.exceptions import ApplicationError

    from kruntimes.contracts.names import POOL_READING_BACK
    from kruntimes.temporal.connect import PayloadConverter, SealedFailureConverter

    converter, payloads = SealedFailureConverter(), PayloadConverter()
    sealed = Failure()
    try:
        raise ApplicationError("password=hunter2", type="HandlerError")
    except ApplicationError as err:
        converter.to_failure(err, payloads, sealed)
    assert sealed.message == "Encoded failure" and "hunter2" not in sealed.stack_trace
    assert sealed.application_failure_info.type == "HandlerError"
    assert sealed.HasField("encoded_attributes")
    back = converter.from_failure(sealed, payloads)
    assert isinstance(back, ApplicationError) and back.message == "password=hunter2"
    assert back.type == "HandlerError"
    plain = Failure()
    converter.to_failure(ApplicationError(POOL_READING_BACK, type="PoolReadingBack"), payloads, plain)
    assert plain.message == POOL_READING_BACK and not plain.HasField("encoded_attributes")
