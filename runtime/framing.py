"""Length-prefixed frames on a function process's control socket.

A frame is a 4-byte big-endian length, one kind byte, then the body. The kinds are single
bytes so both sides can dispatch without parsing JSON.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">IB")

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
