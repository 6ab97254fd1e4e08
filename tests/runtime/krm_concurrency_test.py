"""A krm registration takes several invocations at once, each its own one-shot process, up to the
host's `krm_concurrency`; past it the host answers RESOURCE_EXHAUSTED, and an unregistration past
its grace kills every one of them."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import krm as contract
from tests.runtime.conftest import Host, krm_serving, register_krm
from tests.support import gated
from tests.support.gated import HOLDER
from tests.support.locks import lock_free
from tests.support.pki import TestPKI
from tests.support.waiting import wait_until

CONCURRENCY = 2


@pytest.fixture(scope="module")
def krm_host(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, shared: Path) -> Iterator[Host]:
    with krm_serving(tmp_path_factory, pki, shared, host_id="krm-0", krm_concurrency=CONCURRENCY) as served:
        yield served


def invoke(host: Host, registration_id: str, text: str, *, timeout_ms: int = 60_000) -> bytes:
    answer = host.invoke(registration_id, contract.encode_request(text.encode()), timeout_ms=timeout_ms)
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer
    exit_code, stdout, _written = contract.decode_outputs(json.loads(answer.outputs_json))
    assert exit_code == 0
    assert stdout is not None
    return stdout


def in_threads(*calls: object) -> tuple[list[threading.Thread], dict[int, object]]:
    answers: dict[int, object] = {}

    def call(index: int, work: object) -> None:
        try:
            answers[index] = work()  # type: ignore[operator]
        except Exception as e:  # the test looks at it
            answers[index] = e

    threads = [threading.Thread(target=call, args=(i, w), daemon=True) for i, w in enumerate(calls)]
    for thread in threads:
        thread.start()
    return threads, answers


def test_a_krm_registration_takes_its_bound_at_once_and_refuses_more(krm_host: Host, scratch: Path) -> None:
    release = scratch / "release"
    reg = register_krm(krm_host, gated.GATED.format(started=str(scratch), release=str(release)))
    texts = [f"input-{i}-{uuid.uuid4().hex}" for i in range(CONCURRENCY)]
    threads, answers = in_threads(*(lambda t=t: invoke(krm_host, reg, t) for t in texts))
    try:
        assert wait_until(lambda: len(list(scratch.glob("*"))) == CONCURRENCY, within=60)
        assert krm_host.status(reg).in_flight == CONCURRENCY
        with pytest.raises(grpc.RpcError) as busy:
            invoke(krm_host, reg, "one too many")
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(list(scratch.glob("*"))) == CONCURRENCY, "the refused one never started"
    finally:
        release.touch()
        for thread in threads:
            thread.join(60)
    assert [answers[i] for i in range(CONCURRENCY)] == [t.encode() for t in texts]
    assert wait_until(lambda: krm_host.status(reg).in_flight == 0)
    assert invoke(krm_host, reg, "after") == b"after"


def test_unregistering_past_the_grace_kills_every_invocation_in_flight(krm_host: Host, scratch: Path) -> None:
    reg = register_krm(krm_host, HOLDER)
    locks = [scratch / f"lock-{i}" for i in range(CONCURRENCY)]
    threads, answers = in_threads(*(lambda p=p: invoke(krm_host, reg, str(p)) for p in locks))
    try:
        assert wait_until(lambda: all(Path(f"{p}.started").exists() for p in locks), within=60)
        assert not any(lock_free(p) for p in locks), "both hold their locks"
        krm_host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg, grace_ms=200))
        assert wait_until(lambda: all(lock_free(p) for p in locks), within=30), "every process is gone"
    finally:
        for thread in threads:
            thread.join(60)
    assert len(answers) == CONCURRENCY
