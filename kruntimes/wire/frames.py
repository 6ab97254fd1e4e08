"""The invoke port's frames: the one encoder and decoder of both ends (the gateway's client in
gateway/raw.py, the host's listener in runtime/invoke.py).

One TCP connection carries many requests at once; every frame is

    [u32 length][u32 request id][payload]          big-endian; length counts the id and the payload

Requests (gateway → host): the payload is a serialized `InvokeFunctionRequest`. A message with
every field at its default serializes to zero bytes, so a request frame's length is at least 4
(`MIN_REQUEST_LENGTH`: the id alone).

Answers (host → gateway, with the request's id): the payload is one kind byte, then
    KIND_RESPONSE   a serialized `InvokeFunctionResponse`
    KIND_ERROR      UTF-8 JSON {"code": "<gRPC status name>", "reason": "<krt reason>",
                    "message": "<gRPC details>"}: what the gRPC InvokeFunction would have answered
so an answer frame's length is at least 5 (`MIN_ANSWER_LENGTH`: the id and the kind).

A control frame (gateway → host) is a request frame with request id 0 (`CONTROL_ID`, never a
request's); its payload is one control kind byte, then that kind's body:
    CONTROL_CANCEL  u32 request id: the gateway's caller hung up, so the gateway stopped waiting
                    for that request's answer. The host withdraws the invocation if it still
                    waits its turn (it never runs; its queue place is free at once) and ignores
                    the cancel otherwise (running, answered, or an id it does not know on this
                    connection). A withdrawn request gets no answer.
The id is scoped by the connection: a gateway can only cancel what it sent on it. A host that
does not know control frames reads one as a malformed request (the kind byte 0 is no valid
protobuf tag) and answers an error with id 0, which the gateway ignores after the accept: the
frame is ignorable, so a newer gateway works with an older host (its invocations then still run).
A host ignores a control kind it does not know, so kinds may be added the same way.

The host's first frame on a connection is the accept frame (`encode_accepted`): request id 0
(`ACCEPTED_ID`), KIND_RESPONSE, no body, sent once the TLS peer was checked. A request written
before it arrives could be refused unseen, so the gateway writes none until then, and a
connection that ends before it never carried a request. Requests use ids 1..2^32-1.

Either way the length is at most `MAX_LENGTH`, the host's gRPC max message size: the port takes
what gRPC InvokeFunction takes. The encoders refuse to build a frame outside these bounds; a
decoder that reads a length outside its direction's bounds raises `FrameError`, and its reader
closes that connection: the stream can no longer be trusted.

Nothing here does I/O: a decoder is fed the bytes its transport received and hands each whole
frame to the handler it was made with, with no allocation per frame beyond the payload's bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import ClassVar

from kruntimes.api.limits import MAX_PAYLOAD_BYTES

# the payload bound plus room for the rest of the message (the same as the host's gRPC bound)
MAX_LENGTH = MAX_PAYLOAD_BYTES + 512 * 1024
MIN_REQUEST_LENGTH = 4  # the request id; an all-default InvokeFunctionRequest has no bytes
MIN_ANSWER_LENGTH = 5  # the request id and the kind byte
MAX_REQUEST_BODY = MAX_LENGTH - MIN_REQUEST_LENGTH  # the largest serialized request that fits

KIND_RESPONSE = 0
KIND_ERROR = 1
ACCEPTED_ID = 0  # the request id of the accept frame; never a request's
MAX_REQUEST_ID = 0xFFFFFFFF
CONTROL_ID = 0  # the request id of a control frame (gateway → host); never a request's
CONTROL_CANCEL = 0  # a control kind: withdraw a request still waiting its turn

_REQUEST = struct.Struct(">II")  # length, request id
_CANCEL = struct.Struct(">BI")  # control kind, the request id it cancels
_ANSWER = struct.Struct(">IIB")  # length, request id, kind
_LENGTH_FIELD = 4  # the u32 length, before what it counts
_ID = 4  # the u32 request id, counted by the length


class FrameError(ValueError):
    """A frame length outside its direction's bounds."""

    def __init__(self, length: int, *, direction: str) -> None:
        super().__init__(f"{direction} frame length {length} is outside its bounds")
        self.length = length


def encode_request(request_id: int, body: bytes) -> bytes:
    """A request frame; FrameError if `body` is larger than MAX_REQUEST_BODY."""
    length = _ID + len(body)
    if length > MAX_LENGTH:
        raise FrameError(length, direction="request")
    return _REQUEST.pack(length, request_id) + body


def encode_cancel(request_id: int) -> bytes:
    """The control frame that cancels request `request_id` (1..MAX_REQUEST_ID) on its connection."""
    if not 0 < request_id <= MAX_REQUEST_ID:
        raise ValueError(f"request id {request_id} is outside [1, {MAX_REQUEST_ID}]")
    return encode_request(CONTROL_ID, _CANCEL.pack(CONTROL_CANCEL, request_id))


def decode_cancel(body: bytes) -> int | None:
    """The request id a control frame's body cancels; None for any other or malformed control
    (ignored: a later gateway may send kinds this host does not know)."""
    if len(body) != _CANCEL.size or body[0] != CONTROL_CANCEL:
        return None
    request_id: int = _CANCEL.unpack(body)[1]
    return request_id if request_id != CONTROL_ID else None


def encode_answer(request_id: int, kind: int, body: bytes) -> bytes:
    """An answer frame of `kind` (KIND_RESPONSE or KIND_ERROR); FrameError if it is too long."""
    length = _ID + 1 + len(body)
    if length > MAX_LENGTH:
        raise FrameError(length, direction="answer")
    return _ANSWER.pack(length, request_id, kind) + body


def encode_accepted() -> bytes:
    """The host's first frame on a connection: the connection is accepted."""
    return encode_answer(ACCEPTED_ID, KIND_RESPONSE, b"")


def encode_error(*, code: str, reason: str, message: str) -> bytes:
    """The body of a KIND_ERROR answer."""
    return json.dumps({"code": code, "reason": reason, "message": message}, separators=(",", ":")).encode()


def decode_error(body: bytes) -> tuple[str, str, str]:
    """(code name, reason, message) of a KIND_ERROR answer's body; "" for what is missing or
    malformed (the caller maps an unknown code as it would an unknown gRPC status)."""
    try:
        error = json.loads(body)
    except (ValueError, RecursionError):
        return "", "", ""
    if not isinstance(error, dict):
        return "", "", ""
    code = error.get("code")
    return (
        code if isinstance(code, str) else "",
        str(error.get("reason") or ""),
        str(error.get("message") or ""),
    )


class _Decoder:
    """Reassembles the frames of one direction, length in [min_length, max_length], from the
    bytes of one connection; each whole frame goes to `_hand_on`, which unpacks its header,
    takes its body out of the buffer and hands both to the handler bound at construction (so
    feeding allocates nothing per frame but the body)."""

    __slots__ = ("buffer", "max_length")
    _min_length: ClassVar[int]
    _direction: ClassVar[str]

    def __init__(self, *, max_length: int) -> None:
        self.buffer = bytearray()
        self.max_length = max_length

    def feed(self, data: bytes) -> None:
        """Hands on every frame `data` completes, in order; raises FrameError (the buffer
        emptied) after the frames before a length out of bounds."""
        buffer = self.buffer
        buffer += data
        min_length, max_length, hand_on = self._min_length, self.max_length, self._hand_on
        while len(buffer) >= _LENGTH_FIELD:
            length = int.from_bytes(buffer[:_LENGTH_FIELD], "big")
            if length < min_length or length > max_length:
                buffer.clear()
                raise FrameError(length, direction=self._direction)
            end = _LENGTH_FIELD + length
            if len(buffer) < end:
                return
            hand_on(buffer, end)

    def _hand_on(self, buffer: bytearray, end: int) -> None:
        raise NotImplementedError


class RequestDecoder(_Decoder):
    """The host's side: hands each request frame to `on_request(request_id, body)`."""

    __slots__ = ("on_request",)
    _min_length = MIN_REQUEST_LENGTH
    _direction = "request"

    def __init__(self, on_request: Callable[[int, bytes], None], *, max_length: int = MAX_LENGTH) -> None:
        super().__init__(max_length=max_length)
        self.on_request = on_request

    def _hand_on(self, buffer: bytearray, end: int) -> None:
        _, request_id = _REQUEST.unpack_from(buffer)
        body = bytes(buffer[_REQUEST.size : end])  # after the length and the id
        del buffer[:end]
        self.on_request(request_id, body)


class AnswerDecoder(_Decoder):
    """The gateway's side: hands each answer frame to `on_answer(request_id, kind, body)`."""

    __slots__ = ("on_answer",)
    _min_length = MIN_ANSWER_LENGTH
    _direction = "answer"

    def __init__(self, on_answer: Callable[[int, int, bytes], None], *, max_length: int = MAX_LENGTH) -> None:
        super().__init__(max_length=max_length)
        self.on_answer = on_answer

    def _hand_on(self, buffer: bytearray, end: int) -> None:
        _, request_id, kind = _ANSWER.unpack_from(buffer)
        body = bytes(buffer[_ANSWER.size : end])  # after the length, the id and the kind
        del buffer[:end]
        self.on_answer(request_id, kind, body)
