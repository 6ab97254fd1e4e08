"""The invoke port's cancel frame (kruntimes.wire.frames CONTROL_CANCEL) on a real host: a cancel
withdraws its request while it waits its turn (it never runs, its queue place is free at once, it
gets no answer), is ignored once the request runs, for an id the connection does not know, for
another connection's request and for a control kind the host does not know; and the gateway's
client sends it when its caller hung up (gateway/raw.py), harmlessly to a host that does not know it.

The handlers hold until the test creates a file: "waiting" and "running" are what the handlers
and the host report, never timings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.gateway.raw import CallerGone
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import frames
from tests.runtime.concurrency_test import HELD, register, request
from tests.runtime.conftest import Host
from tests.runtime.raw_invoke_test import Conn, _connected, decode
from tests.support.pki import TestPKI
from tests.support.waiting import eventually, eventually_blocking

BOUND_S = 60.0  # how long anything here may take at most; never what a test asserts


@pytest.fixture
def conns(host: Host, pki: TestPKI) -> Iterator[tuple[Conn, Conn]]:
    """Two gateway connections to the module's host."""
    assert host.runtime.invoke_address
    first = Conn(host.runtime.invoke_address, as_=pki.gateway)
    second = Conn(host.runtime.invoke_address, as_=pki.gateway)
    yield first, second
    first.close()
    second.close()


def waiting(host: Host, reg: str, count: int, what: str) -> None:
    eventually_blocking(
        lambda: host.status(reg).waiting, until=lambda w: w == count, within=BOUND_S, what=what
    )


def ran(scratch: Path) -> list[int]:
    """The invocations (their n) that started, in order."""
    order = scratch / "order"
    return [int(line) for line in order.read_text().split()] if order.exists() else []


def succeeded(payload: bytes) -> dict[str, object]:
    answer = decode(payload)
    assert isinstance(answer, pb.InvokeFunctionResponse), answer
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
    outputs: dict[str, object] = json.loads(answer.outputs_json)
    return outputs


def test_a_cancel_withdraws_a_waiting_request_and_is_ignored_once_it_runs(
    host: Host, conns: tuple[Conn, Conn], scratch: Path
) -> None:
    conn, _ = conns
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=2)
    conn.send(1, request(reg, scratch, 0, order=True, gate="go-0"))
    eventually_blocking(lambda: ran(scratch) == [0], within=BOUND_S, what="the first running")
    conn.send(2, request(reg, scratch, 1, order=True, gate="go-1"))
    conn.send(3, request(reg, scratch, 2, order=True, gate="go-2"))
    waiting(host, reg, 2, "two waiting their turn")

    conn.sock.sendall(frames.encode_cancel(2))
    waiting(host, reg, 1, "the cancelled one out of the queue while the first still runs")
    conn.sock.sendall(frames.encode_cancel(1))  # running: ignored, it answers as usual
    (scratch / "go-0").touch()
    assert conn.recv()[0] == 1
    eventually_blocking(lambda: ran(scratch) == [0, 2], within=BOUND_S, what="the third running next")
    (scratch / "go-2").touch()
    # the withdrawn request gets no answer: the next frame is the third's
    request_id, payload = conn.recv()
    assert request_id == 3 and succeeded(payload)["n"] == 2
    (scratch / "go-1").touch()  # had it stayed queued, it would run now
    conn.send(4, request(reg, scratch, 3, order=True, gate="go-1"))
    request_id, payload = conn.recv()
    assert request_id == 4 and succeeded(payload)["n"] == 3
    assert ran(scratch) == [0, 2, 3], "the withdrawn invocation never ran"
    assert host.status(reg).waiting == 0


def test_a_cancel_of_an_unknown_id_or_another_connections_request_is_ignored(
    host: Host, conns: tuple[Conn, Conn], scratch: Path
) -> None:
    mine, other = conns
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=1)
    mine.send(1, request(reg, scratch, 0, order=True, gate="go"))
    eventually_blocking(lambda: ran(scratch) == [0], within=BOUND_S, what="the first running")
    mine.send(2, request(reg, scratch, 1, order=True, gate="go"))
    waiting(host, reg, 1, "the second waiting")

    other.sock.sendall(frames.encode_cancel(2))  # the id of mine's waiting request
    other.sock.sendall(frames.encode_cancel(77))  # no request of either connection
    mine.sock.sendall(frames.encode_cancel(77))
    mine.send_frame(frames.CONTROL_ID, b"\x07\x00\x00\x00\x02")  # a control kind it does not know
    mine.send_frame(frames.CONTROL_ID, b"")  # a control without a kind
    # frames are read in order: once a later request is answered, those controls were read
    other.send(9, pb.InvokeFunctionRequest(registration_id="reg-nope"))
    assert other.recv()[0] == 9
    mine.send(9, pb.InvokeFunctionRequest(registration_id="reg-nope"))
    assert mine.recv()[0] == 9
    assert host.status(reg).waiting == 1, "no cancel withdrew the waiting request"

    (scratch / "go").touch()
    answers = dict(mine.recv() for _ in range(2))
    assert sorted(answers) == [1, 2]
    assert ran(scratch) == [0, 1]


def test_the_client_cancels_when_its_caller_hangs_up_and_an_older_host_ignores_it(pki: TestPKI) -> None:
    """A host that does not know cancels (as before this frame) reads one as a malformed request
    and answers an error with id 0; the client ignores it and the connection serves on."""

    async def run() -> None:
        seen: list[tuple[int, bytes]] = []

        async def older_host(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            def on_request(request_id: int, body: bytes) -> None:
                seen.append((request_id, body))
                if request_id == frames.CONTROL_ID:  # what an older host answers a malformed request
                    error = frames.encode_error(code="INVALID_ARGUMENT", reason="InvalidRequest", message="x")
                    writer.write(frames.encode_answer(request_id, frames.KIND_ERROR, error))
                elif len(seen) > 1:  # the request after the cancel is answered
                    answer = pb.InvokeFunctionResponse(invocation_id="later").SerializeToString()
                    writer.write(frames.encode_answer(request_id, frames.KIND_RESPONSE, answer))

            decoder = frames.RequestDecoder(on_request)
            while data := await reader.read(65536):
                decoder.feed(data)

        async with _connected(pki, older_host) as client:
            lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            held = asyncio.create_task(client.invoke(pb.InvokeFunctionRequest(), timeout=BOUND_S, lost=lost))
            await eventually(lambda: seen, within=BOUND_S, what="the request at the host")
            lost.set_result(None)
            with pytest.raises(CallerGone):
                await held
            later = await client.invoke(pb.InvokeFunctionRequest(), timeout=BOUND_S)
            assert later.invocation_id == "later"
            assert [request_id for request_id, _ in seen] == [1, frames.CONTROL_ID, 2]
            assert frames.decode_cancel(seen[1][1]) == 1

    asyncio.run(run())


def test_the_cancel_codec_takes_only_a_request_id_and_its_own_kind() -> None:
    frame = frames.encode_cancel(frames.MAX_REQUEST_ID)
    got: list[tuple[int, bytes]] = []
    frames.RequestDecoder(lambda request_id, body: got.append((request_id, body))).feed(frame)
    ((request_id, body),) = got
    assert request_id == frames.CONTROL_ID and frames.decode_cancel(body) == frames.MAX_REQUEST_ID
    for bad in (frames.CONTROL_ID, frames.MAX_REQUEST_ID + 1, -1):
        with pytest.raises(ValueError):
            frames.encode_cancel(bad)
    assert frames.decode_cancel(b"") is None
    assert frames.decode_cancel(b"\x00\x00\x00\x00\x00") is None  # id 0 is never a request's
    assert frames.decode_cancel(b"\x01\x00\x00\x00\x05") is None  # another control kind
    assert frames.decode_cancel(b"\x00\x00\x00\x00\x05\x00") is None  # a longer body
