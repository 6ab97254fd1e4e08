"""The reasons catalogue (kruntimes.wire.reasons): importable by workflow code, every gRPC code a
real one, the runtime host's errors and RunWorkflow's non-retryable errors taken from it, and the
`krt-reason` trailer written and read by its one writer and reader."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kruntimes.runtime import errors
from kruntimes.runtime.service import status_code
from kruntimes.wire import reasons
from kruntimes.wire.reasons import GatewayReason, HostReason
from kruntimes.workflows.run import REGISTRATION_ERRORS
from tests.wire.classes import tree


def test_the_catalogue_imports_nothing_workflows_may_not() -> None:
    code = (
        "import sys, kruntimes.wire.reasons\n"
        "bad = sorted(m for m in ('grpc', 'aiohttp', 'kubernetes_asyncio', 'subprocess') if m in sys.modules)\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_every_host_code_is_a_grpc_status_code_name() -> None:
    for reason in HostReason:
        assert grpc.StatusCode[reason.code].name == reason.code


def test_reasons_are_looked_up_by_their_spelling() -> None:
    for host in HostReason:
        assert reasons.host_reason(str(host)) is host
    for gateway in GatewayReason:
        assert reasons.gateway_reason(str(gateway)) is gateway
    assert reasons.host_reason("NoSuchReason") is None
    assert reasons.gateway_reason("NoSuchReason") is None


def test_each_host_reason_is_one_runtime_error_and_its_grpc_code() -> None:
    classes = tree(errors.RuntimeServerError)
    assert sorted(str(cls.reason) for cls in classes) == sorted(str(r) for r in HostReason)
    for cls in classes:
        exc = cls.__new__(cls)
        assert status_code(exc) == grpc.StatusCode[cls.reason.code]


def test_run_workflow_does_not_retry_the_registration_refusals() -> None:
    assert reasons.registration_refusals() == REGISTRATION_ERRORS
    refused = {str(r) for r in HostReason if r.refuses_registration}
    assert set(REGISTRATION_ERRORS) == refused
    assert all(type(r) is str for r in REGISTRATION_ERRORS)  # Temporal history gets plain strings
    # transport trouble and invoke-time refusals stay out: the activity retries or never sees them
    assert not refused & {"HostUnavailable", "NotReady", "ConcurrencyLimit", "FenceMismatch"}


@pytest.mark.parametrize("reason", list(HostReason))
def test_the_trailer_round_trips(reason: HostReason) -> None:
    trailer = reasons.trailer(reason)
    assert trailer == ((reasons.TRAILER_KEY, str(reason)),)
    assert type(trailer[0][1]) is str
    assert reasons.reason_of(trailer) == reason
    assert reasons.reason_of(grpc.aio.Metadata(*trailer)) == reason
    assert reasons.reason_of(grpc.aio.Metadata(("other", "x"), *trailer)) == reason


def test_no_trailer_is_no_reason() -> None:
    assert reasons.reason_of(None) == ""
    assert reasons.reason_of(()) == ""
    assert reasons.reason_of(grpc.aio.Metadata(("other", "x"))) == ""


def test_each_gateway_status_is_an_error_status() -> None:
    for reason in GatewayReason:
        assert 400 <= reason.status <= 599, reason
        assert reason.retry_after is None or reason.retry_after > 0


def test_the_runtime_server_docs_grpc_table_is_the_catalogue() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "runtime-server.md").read_text()
    section = text[text.index("| gRPC code | reason |") :]
    section = section.split("\n\n", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines()[2:]:
        code, names = (c.strip() for c in line.strip().strip("|").split("|"))
        table[code.strip("`")] = set(re.findall(r"`(\w+)`", names))
    catalogue: dict[str, set[str]] = {}
    for reason in HostReason:
        catalogue.setdefault(reason.code, set()).add(str(reason))
    assert table == catalogue


def test_an_adapter_error_class_travels_beside_its_reason_only_when_the_catalogue_names_it() -> None:
    named = reasons.trailer(HostReason.HANDLER_LOAD_FAILED, error_class="HandlerImportError")
    assert reasons.reason_of(named) == "HandlerLoadFailed"
    assert reasons.error_class_of(named) == "HandlerImportError"
    # a class the function process made up is never sent, and never read if a peer sends one
    made_up = reasons.trailer(HostReason.HANDLER_LOAD_FAILED, error_class="DROP TABLE runs")
    assert made_up == reasons.trailer(HostReason.HANDLER_LOAD_FAILED)
    forged = [(reasons.TRAILER_KEY, "HandlerLoadFailed"), (reasons.ERROR_CLASS_KEY, b"MyOwnError")]
    assert reasons.error_class_of(forged) == ""
    assert reasons.error_class_of(None) == ""
