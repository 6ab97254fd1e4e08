"""Payloads in Temporal history encrypted with AES-256-GCM (a Temporal `PayloadCodec`).

Run specs (env included), outputs and every other workflow and activity payload are encrypted
by each client and worker before they reach Temporal, so `temporal workflow show` and the
database hold ciphertext. Search attributes are indexes and stay plain: never put a secret there.

Keys live in a directory, one file per key: the file name is the key id
(`[A-Za-z0-9._-]{1,64}`), the content the 32-byte key in base64 (a Kubernetes Secret mounted as
a volume has exactly this shape). The newest key — the greatest id, so name keys by date —
encrypts; every key decrypts, so rotation is: add a key, restart, and drop an old key only once
no history that uses it is kept. A payload names its key id in its metadata.

Errors::

    ValueError
     └── CodecError   a key directory is unusable, or a payload cannot be decrypted

A failure's message and stack trace are encrypted too (kruntimes.temporal.connect's failure
converter), except a `PlainFailure`'s: the platform's own words, raised by workflow code.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec
from temporalio.exceptions import ApplicationError

# The keys and the sealing are SDK-free (the gateway seals without the SDK); re-exported here.
from kruntimes.temporal.sealing import AAD as AAD
from kruntimes.temporal.sealing import ENCODING as ENCODING
from kruntimes.temporal.sealing import KEY_BYTES as KEY_BYTES
from kruntimes.temporal.sealing import KEY_ID as KEY_ID
from kruntimes.temporal.sealing import MAX_KEYS as MAX_KEYS
from kruntimes.temporal.sealing import NONCE_BYTES as NONCE_BYTES
from kruntimes.temporal.sealing import CodecError as CodecError
from kruntimes.temporal.sealing import Keyring as Keyring
from kruntimes.temporal.sealing import Sealer as Sealer
from kruntimes.temporal.sealing import add_key as add_key
from kruntimes.temporal.sealing import ensure_key as ensure_key
from kruntimes.temporal.sealing import new_key_id as new_key_id

# A payload the converter marked as text for operators (a workflow's, activity's or timer's
# summary: kruntimes.wire.summaries.Plain) is stored unencrypted, so the Temporal UI and CLI show
# it without the codec server. Only the converter sets the mark, and only for that type; the
# codec takes it off, so the stored payload is an ordinary `json/plain` one (the `temporal` CLI
# shows a payload as its text only when its metadata holds nothing but the encoding). Decoding a
# payload that is not encrypted returns it as it is either way.
PLAIN = "krt-plain"


class PlainFailure(ApplicationError):
    """A failure whose message is the platform's own words (a Run's reason, host and attempt:
    never a handler's text), stored unencrypted so that the Temporal UI and `temporal workflow
    describe` say why without the codec server; its details are payloads, encrypted as any.
    kruntimes.temporal.connect's failure converter leaves it plain."""


class EncryptionCodec(PayloadCodec):
    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._sealer = Sealer(keyring)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get(PLAIN) == b"1":
            metadata = {k: v for k, v in payload.metadata.items() if k != PLAIN}
            return Payload(metadata=metadata, data=payload.data)
        metadata, data = self._sealer.seal(payload.SerializeToString())
        return Payload(metadata=metadata, data=data)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before the codec was turned on: readable as it is
        return Payload.FromString(self._sealer.open(payload.metadata.get(KEY_ID, b""), payload.data))
