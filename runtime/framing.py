"""Length-prefixed frames on a function process's control socket.

A frame is a 4-byte big-endian length, one kind byte, then the body. The kinds are single
bytes so both sides can dispatch without parsing JSON. The server takes bodies of at most
MAX_FRAME bytes from a function process: the largest outputs plus room for an error envelope.

A process whose async handler takes several invocations at once (runtime/shared.py) is sent
tagged requests instead: each carries a tag the server chose, its answer carries the same tag
and the output the handler printed through sys.stdout and sys.stderr during that invocation
(bounded; the totals say how much there was), and a cancel names the tag of an invocation
whose timeout passed. The first tagged request switches the process to them for good.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kruntimes.api.limits import MAX_LOG_BYTES, MAX_OUTPUTS_TOTAL_BYTES

HEADER = struct.Struct(">IB")
MAX_FRAME = MAX_OUTPUTS_TOTAL_BYTES + 64 * 1024

# child -> server
READY = ord("K")  # handler loaded; body: READY_ASYNC for a coroutine function, else empty
LOAD_ERROR = ord("L")  # body: JSON {"type", "message"}
RESULT = ord("R")  # body: outputs JSON object
ERROR = ord("E")  # body: JSON {"type", "message"}
ANSWER = ord("A")  # body: tag, kind (RESULT or ERROR), stdout and stderr (`encode_answer`), body
# server -> child
INVOKE = ord("I")  # body: 2-byte invocation id length, id, payload JSON
INVOKE_TAGGED = ord("J")  # body: 4-byte tag, then as INVOKE
CANCEL = ord("C")  # body: 4-byte tag

READY_ASYNC = b'{"async":true}'
TAG = struct.Struct(">I")
_OUTPUT = struct.Struct(">QI")  # a stream's total bytes, then the bytes kept
_ANSWER = struct.Struct(">IB")
# an answer frame holds a result or an error, and each stream's kept output
MAX_ANSWER_FRAME = MAX_FRAME + 2 * (MAX_LOG_BYTES + _OUTPUT.size) + _ANSWER.size


def encode(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), kind) + body


def encode_invoke(invocation_id: str, payload: bytes) -> bytes:
    ident = invocation_id.encode()
    return encode(INVOKE, struct.pack(">H", len(ident)) + ident + payload)


def decode_invoke(body: bytes) -> tuple[str, bytes]:
    (size,) = struct.unpack_from(">H", body)
    return body[2 : 2 + size].decode(), body[2 + size :]


def encode_tagged_invoke(tag: int, invocation_id: str, payload: bytes) -> bytes:
    ident = invocation_id.encode()
    return encode(INVOKE_TAGGED, TAG.pack(tag) + struct.pack(">H", len(ident)) + ident + payload)


def encode_answer(tag: int, kind: int, out: tuple[int, bytes], err: tuple[int, bytes], body: bytes) -> bytes:
    """A tagged answer: `out` and `err` are (total bytes written, the bytes kept)."""
    return encode(
        ANSWER,
        b"".join(
            (
                _ANSWER.pack(tag, kind),
                _OUTPUT.pack(out[0], len(out[1])),
                out[1],
                _OUTPUT.pack(err[0], len(err[1])),
                err[1],
                body,
            )
        ),
    )


@dataclass(frozen=True, slots=True)
class Answer:
    tag: int
    kind: int
    out: tuple[int, bytes]
    err: tuple[int, bytes]
    body: bytes


def decode_answer(body: bytes) -> Answer:
    """A tagged answer's parts; ValueError when it is malformed (the process's fault)."""
    try:
        tag, kind = _ANSWER.unpack_from(body)
        at = _ANSWER.size
        streams = []
        for _ in range(2):
            total, kept = _OUTPUT.unpack_from(body, at)
            at += _OUTPUT.size
            if kept > MAX_LOG_BYTES or at + kept > len(body) or total < kept:
                raise ValueError("an output of a tagged answer is out of bounds")
            streams.append((total, body[at : at + kept]))
            at += kept
    except struct.error as exc:
        raise ValueError("a tagged answer is too short") from exc
    return Answer(tag, kind, streams[0], streams[1], body[at:])


class FrameTooLarge(Exception):
    """A function process announced a body larger than MAX_FRAME."""


def pop_frame(buffer: bytearray, *, limit: int = MAX_FRAME) -> tuple[int, bytes] | None:
    """Pop one complete frame; raises FrameTooLarge before buffering one larger than `limit`."""
    if len(buffer) < HEADER.size:
        return None
    size, kind = HEADER.unpack_from(buffer)
    if size > limit:
        raise FrameTooLarge
    end = HEADER.size + size
    if len(buffer) < end:
        return None
    body = bytes(buffer[HEADER.size : end])
    del buffer[:end]
    return kind, body
