"""The invoke port's frame codec (kruntimes.wire.frames), tested once for both ends: round trips
through any split of the stream, each direction's size rules, and the error answer's body."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.server import MAX_MESSAGE_BYTES
from kruntimes.wire import frames
from kruntimes.wire.frames import (
    MAX_LENGTH,
    MAX_REQUEST_BODY,
    MIN_ANSWER_LENGTH,
    MIN_REQUEST_LENGTH,
    AnswerDecoder,
    FrameError,
    RequestDecoder,
)

# No example database: tests must not write outside the tree they own.
checked = settings(database=None, max_examples=200, deadline=None)

request_ids = st.integers(0, 2**32 - 1)
bodies = st.binary(max_size=600)
kinds = st.sampled_from([frames.KIND_RESPONSE, frames.KIND_ERROR]) | st.integers(0, 255)
requests = st.lists(st.tuples(request_ids, bodies), max_size=6)
answers = st.lists(st.tuples(request_ids, kinds, bodies), max_size=6)
cuts = st.lists(st.integers(0, 4000), max_size=12)
too_long = st.integers(MAX_LENGTH + 1, 2**32 - 1)


def split(stream: bytes, at: list[int]) -> list[bytes]:
    """`stream` cut at the given offsets (clamped, sorted): what reads of a socket may return."""
    points = sorted({min(a, len(stream)) for a in at} | {0, len(stream)})
    return [stream[a:b] for a, b in zip(points, points[1:], strict=False)]


class Requests:
    """A RequestDecoder and the frames it handed on."""

    def __init__(self, *, max_length: int = MAX_LENGTH) -> None:
        self.got: list[tuple[int, bytes]] = []
        self.decoder = RequestDecoder(lambda i, body: self.got.append((i, body)), max_length=max_length)

    def feed(self, pieces: list[bytes]) -> list[tuple[int, bytes]]:
        for piece in pieces:
            self.decoder.feed(piece)
        return self.got


class Answers:
    """An AnswerDecoder and the frames it handed on."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int, bytes]] = []
        self.decoder = AnswerDecoder(lambda i, kind, body: self.got.append((i, kind, body)))

    def feed(self, pieces: list[bytes]) -> list[tuple[int, int, bytes]]:
        for piece in pieces:
            self.decoder.feed(piece)
        return self.got


@checked
@given(requests, cuts)
def test_requests_round_trip_through_any_split(sent: list[tuple[int, bytes]], at: list[int]) -> None:
    stream = b"".join(frames.encode_request(request_id, body) for request_id, body in sent)
    reader = Requests()
    assert reader.feed(split(stream, at)) == sent
    assert not reader.decoder.buffer


@checked
@given(answers, cuts)
def test_answers_round_trip_through_any_split(sent: list[tuple[int, int, bytes]], at: list[int]) -> None:
    stream = b"".join(frames.encode_answer(request_id, kind, body) for request_id, kind, body in sent)
    reader = Answers()
    assert reader.feed(split(stream, at)) == sent
    assert not reader.decoder.buffer


@checked
@given(requests, st.integers(0, 7))
def test_a_partial_request_waits_for_the_rest(sent: list[tuple[int, bytes]], missing: int) -> None:
    stream = b"".join(frames.encode_request(request_id, body) for request_id, body in sent)
    tail = frames.encode_request(1, b"tail")
    reader = Requests()
    assert reader.feed([stream + tail[: len(tail) - 1 - missing]]) == sent
    assert reader.feed([tail[len(tail) - 1 - missing :]]) == [*sent, (1, b"tail")]


def test_a_request_may_be_empty_an_answer_never_is() -> None:
    """An all-default InvokeFunctionRequest serializes to no bytes: its frame is the id alone
    (length 4). An answer always has its kind byte (length >= 5)."""
    assert pb.InvokeFunctionRequest().SerializeToString() == b""
    empty = frames.encode_request(7, b"")
    assert empty == struct.pack(">II", MIN_REQUEST_LENGTH, 7)
    assert Requests().feed([empty]) == [(7, b"")]
    with pytest.raises(FrameError) as err:
        Answers().feed([empty])
    assert err.value.length == MIN_REQUEST_LENGTH == MIN_ANSWER_LENGTH - 1
    kind_only = frames.encode_answer(7, frames.KIND_RESPONSE, b"")
    assert kind_only == struct.pack(">IIB", MIN_ANSWER_LENGTH, 7, frames.KIND_RESPONSE)
    assert Answers().feed([kind_only]) == [(7, frames.KIND_RESPONSE, b"")]


def refused_after(reader: Requests | Answers, good: bytes, length: int, at: list[int]) -> list[Any]:
    """Feeds `good`, then a frame whose length is out of bounds, split at `at`: the decoder raises
    FrameError naming that length with its buffer emptied. The frames it handed on before."""
    stream = good + struct.pack(">I", length) + b"\x00" * 16
    with pytest.raises(FrameError) as err:
        reader.feed(split(stream, at))
    assert err.value.length == length
    assert not reader.decoder.buffer
    return reader.got


@checked
@given(requests, st.integers(0, MIN_REQUEST_LENGTH - 1) | too_long, cuts)
def test_a_request_length_out_of_bounds_raises_after_the_frames_before_it(
    sent: list[tuple[int, bytes]], length: int, at: list[int]
) -> None:
    good = b"".join(frames.encode_request(request_id, body) for request_id, body in sent)
    assert refused_after(Requests(), good, length, at) == sent


@checked
@given(answers, st.integers(0, MIN_ANSWER_LENGTH - 1) | too_long, cuts)
def test_an_answer_length_out_of_bounds_raises_after_the_frames_before_it(
    sent: list[tuple[int, int, bytes]], length: int, at: list[int]
) -> None:
    good = b"".join(frames.encode_answer(request_id, kind, body) for request_id, kind, body in sent)
    assert refused_after(Answers(), good, length, at) == sent


def test_the_longest_frame_is_max_length_either_way() -> None:
    body = b"x" * MAX_REQUEST_BODY
    frame = frames.encode_request(1, body)
    assert len(frame) == 4 + MAX_LENGTH
    assert Requests().feed([frame]) == [(1, body)]
    with pytest.raises(FrameError):
        frames.encode_request(1, body + b"x")
    answer = frames.encode_answer(2, frames.KIND_RESPONSE, body[:-1])
    assert len(answer) == 4 + MAX_LENGTH
    assert Answers().feed([answer]) == [(2, frames.KIND_RESPONSE, body[:-1])]
    with pytest.raises(FrameError):
        frames.encode_answer(2, frames.KIND_RESPONSE, body)


def test_a_decoder_takes_a_lower_bound() -> None:
    reader = Requests(max_length=100)
    assert reader.feed([frames.encode_request(1, b"x" * 96)]) == [(1, b"x" * 96)]
    with pytest.raises(FrameError) as err:
        reader.feed([frames.encode_request(2, b"x" * 97)])
    assert err.value.length == 101


def test_the_bound_is_the_hosts_grpc_max_message_size() -> None:
    """The invoke port takes what gRPC InvokeFunction takes."""
    assert MAX_LENGTH == MAX_MESSAGE_BYTES


@checked
@given(st.text(), st.text(), st.text())
def test_error_bodies_round_trip(code: str, reason: str, message: str) -> None:
    body = frames.encode_error(code=code, reason=reason, message=message)
    assert frames.decode_error(body) == (code, reason, message)


@checked
@given(st.binary(max_size=200) | st.sampled_from([b"[" * 100_000, b"[]", b"null", b'"x"', b"\xff"]))
def test_any_error_body_decodes_to_three_strings(body: bytes) -> None:
    decoded = frames.decode_error(body)
    assert all(isinstance(part, str) for part in decoded)


@pytest.mark.parametrize(
    ("body", "decoded"),
    [
        (b'{"code": 5, "reason": "R", "message": "m"}', ("", "R", "m")),
        (b'{"code": "NOT_FOUND"}', ("NOT_FOUND", "", "")),
        (b'{"code": "X", "reason": null, "message": 7}', ("X", "", "7")),
        (b"[1, 2]", ("", "", "")),
        (b"not json", ("", "", "")),
    ],
)
def test_error_bodies_of_other_shapes(body: bytes, decoded: tuple[str, str, str]) -> None:
    assert frames.decode_error(body) == decoded


def test_the_accept_frame_is_id_zero_a_response_and_no_body() -> None:
    accepted = frames.encode_accepted()
    assert accepted == struct.pack(">IIB", MIN_ANSWER_LENGTH, frames.ACCEPTED_ID, frames.KIND_RESPONSE)
    assert Answers().feed([accepted]) == [(0, frames.KIND_RESPONSE, b"")]


@pytest.mark.parametrize(
    ("encode", "direction"),
    [
        (lambda: frames.encode_request(1, b"x" * (MAX_REQUEST_BODY + 1)), "request"),
        (lambda: frames.encode_answer(1, frames.KIND_RESPONSE, b"x" * MAX_REQUEST_BODY), "answer"),
        (lambda: Requests().feed([struct.pack(">I", MAX_LENGTH + 1)]), "request"),
        (lambda: Answers().feed([struct.pack(">I", MAX_LENGTH + 1)]), "answer"),
    ],
    ids=["encode-request", "encode-answer", "decode-request", "decode-answer"],
)
def test_a_frame_out_of_bounds_is_refused_naming_its_direction_and_length(
    encode: Any, direction: str
) -> None:
    """What the reader logs when it closes the connection says which way and how long."""
    with pytest.raises(FrameError) as err:
        encode()
    assert err.value.length == MAX_LENGTH + 1
    assert str(err.value) == f"{direction} frame length {MAX_LENGTH + 1} is outside its bounds"


@pytest.mark.parametrize("reader", [Requests, Answers])
def test_a_length_out_of_bounds_is_refused_as_soon_as_its_four_bytes_arrive(reader: Any) -> None:
    """Nothing more has to come (a peer may send a bad length and stall): the connection closes."""
    decoder = reader()
    with pytest.raises(FrameError):
        decoder.feed([struct.pack(">I", 0)])
    assert not decoder.decoder.buffer


def test_an_error_body_is_the_compact_json_the_port_describes() -> None:
    body = frames.encode_error(code="NOT_FOUND", reason="FunctionNotRegistered", message="no such function")
    assert body == b'{"code":"NOT_FOUND","reason":"FunctionNotRegistered","message":"no such function"}'
