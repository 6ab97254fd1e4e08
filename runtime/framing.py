"""Length-prefixed frames on a function process's control socket.

A frame is a 4-byte big-endian length, one kind byte, then the body. The kinds are single
bytes so both sides can dispatch without parsing JSON. The server takes bodies of at most
MAX_FRAME bytes from a function process: the largest outputs plus room for an error envelope.
"""

from __future__ import annotations

import struct

from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES

HEADER = struct.Struct(">IB")
MAX_FRAME = MAX_OUTPUTS_TOTAL_BYTES + 64 * 1024

# child -> server
READY = ord("K")  # handler loaded
LOAD_ERROR = ord("L")  # body: JSON {"type", "message"}
RESULT = ord("R")  # body: outputs JSON object
ERROR = ord("E")  # body: JSON {"type", "message"}
# server -> child
INVOKE = ord("I")  # body: 2-byte invocation id length, id, payload JSON


def encode(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), kind) + body


def encode_invoke(invocation_id: str, payload: bytes) -> bytes:
    ident = invocation_id.encode()
    return encode(INVOKE, struct.pack(">H", len(ident)) + ident + payload)


def decode_invoke(body: bytes) -> tuple[str, bytes]:
    (size,) = struct.unpack_from(">H", body)
    return body[2 : 2 + size].decode(), body[2 + size :]


class FrameTooLarge(Exception):
    """A function process announced a body larger than MAX_FRAME."""


def pop_frame(buffer: bytearray) -> tuple[int, bytes] | None:
    """Pop one complete frame; raises FrameTooLarge before buffering an oversized one."""
    if len(buffer) < HEADER.size:
        return None
    size, kind = HEADER.unpack_from(buffer)
    if size > MAX_FRAME:
        raise FrameTooLarge
    end = HEADER.size + size
    if len(buffer) < end:
        return None
    body = bytes(buffer[HEADER.size : end])
    del buffer[:end]
    return kind, body
