"""The gateway's answers agree with the reasons catalogue (kruntimes.wire.reasons.GatewayReason):
its error tree, the one function that turns errors into HTTP answers, the OpenAPI document, the
status table of docs/invoke-api.md; and the 200 body it rebuilds from the owner's answer is its model's, whatever
the owner sent."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, get_args

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.api.limits import (
    MAX_INVOCATION_ERROR_MESSAGE_BYTES,
    MAX_LOG_BYTES,
    MAX_OUTPUT_KEYS,
    MAX_OUTPUT_VALUE_BYTES,
    MAX_OUTPUTS_TOTAL_BYTES,
)
from kruntimes.api.outputs import OutputsError, validate_outputs
from kruntimes.gateway import auth, errors, openapi
from kruntimes.gateway.answers import SUCCESS_STATUS, answer_body, parse_outputs
from kruntimes.gateway.app import error_answer, gateway_error_answer, router_reason
from kruntimes.gateway.bodies import ErrorBody, InvocationStatus, InvokeAnswer
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason
from tests.wire.classes import tree

INVOKE_DOC = Path(__file__).resolve().parents[2] / "docs" / "invoke-api.md"
INVOKE = [r for r in GatewayReason if r.invoke]
ROUTER = [r for r in GatewayReason if not r.invoke]

checked = settings(database=None, max_examples=200, deadline=None)


def by_status(reasons: list[GatewayReason]) -> dict[int, set[str]]:
    grouped: dict[int, set[str]] = defaultdict(set)
    for reason in reasons:
        grouped[reason.status].add(str(reason))
    return dict(grouped)


# -- the error tree ------------------------------------------------------------------------------


def test_every_invoke_reason_is_carried_by_exactly_one_error_class() -> None:
    carried = [r for cls in tree(errors.GatewayError) if "reasons" in cls.__dict__ for r in cls.reasons]
    assert sorted(map(str, carried)) == sorted(map(str, INVOKE))


def test_a_class_answers_with_the_status_of_its_reasons() -> None:
    for cls in tree(errors.GatewayError):
        assert {r.status for r in cls.reasons} == {cls.status}, cls
        assert cls.reason == cls.reasons[0]
        assert cls.retry_after == cls.reason.retry_after
        for reason in cls.reasons:
            err = cls("m", reason=reason)
            assert (err.status, err.reason, err.retry_after) == (reason.status, reason, reason.retry_after)


def test_a_class_refuses_a_reason_it_does_not_carry() -> None:
    with pytest.raises(TypeError):
        errors.RunNotReady("m", reason=GatewayReason.FUNCTION_BUSY)
    with pytest.raises(TypeError):
        errors.BadRequest("m", reason=GatewayReason.NOT_FOUND)  # the router's, not an error class's


def test_one_root_the_auth_errors_included() -> None:
    for cls in (auth.AuthError, auth.Unauthenticated, auth.Forbidden, auth.AuthUnavailable):
        assert issubclass(cls, errors.GatewayError)
        assert getattr(errors, cls.__name__) is cls
    bug = errors.GatewayError("internal error")
    assert (bug.status, bug.reason) == (500, GatewayReason.INTERNAL_ERROR)


# -- the answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", INVOKE, ids=str)
def test_each_error_answer_is_an_error_body_with_its_status(reason: GatewayReason) -> None:
    (cls,) = [c for c in tree(errors.GatewayError) if reason in c.__dict__.get("reasons", ())]
    answer = gateway_error_answer(cls("for people", reason=reason), "inv-1")
    assert answer.status == reason.status
    assert answer.body is not None
    body = ErrorBody.model_validate_json(bytes(answer.body))  # type: ignore[arg-type]
    assert body == ErrorBody(reason=str(reason), message="for people", invocationId="inv-1")
    assert answer.headers[headers.INVOCATION_ID] == "inv-1"
    if reason.retry_after is None:
        assert headers.RETRY_AFTER not in answer.headers
    else:
        assert answer.headers[headers.RETRY_AFTER] == str(reason.retry_after)


def test_a_call_site_may_say_when_to_retry() -> None:
    answer = gateway_error_answer(errors.RunNotReady("m", retry_after=5), "")
    assert answer.headers[headers.RETRY_AFTER] == "5"
    assert headers.INVOCATION_ID not in answer.headers  # no id: no header


@pytest.mark.parametrize("exc", [web.HTTPNotFound(), web.HTTPMethodNotAllowed("POST", ["GET"])])
def test_the_routers_refusals_are_catalogued(exc: web.HTTPException) -> None:
    reason = router_reason(exc)
    catalogued = [r for r in ROUTER if r == reason]
    assert catalogued and catalogued[0].status == exc.status
    assert reason == exc.reason.replace(" ", "")  # what the router's phrase says


def test_an_uncatalogued_router_refusal_keeps_its_phrase() -> None:
    assert router_reason(web.HTTPRequestEntityTooLarge(max_size=1, actual_size=2)) == "RequestEntityTooLarge"
    answer = error_answer(status=418, reason="Teapot", message="short and stout", invocation_id="")
    assert json.loads(bytes(answer.body)) == {  # type: ignore[arg-type]
        "reason": "Teapot",
        "message": "short and stout",
        "invocationId": "",
    }


# -- the OpenAPI document ------------------------------------------------------------------------


def _invoke_responses() -> dict[str, Any]:
    doc = openapi.document()
    responses: dict[str, Any] = doc["paths"][openapi.INVOKE_PATH]["post"]["responses"]
    return responses


def test_every_gateway_reason_is_documented_under_its_status_and_no_status_without_one() -> None:
    documented: dict[int, set[str]] = {}
    for status, response in _invoke_responses().items():
        if status.startswith("2"):  # 200, and 202 for an async invocation
            continue
        schema = response["content"]["application/json"]["schema"]
        ref, narrowed = schema["allOf"]
        assert ref == {"$ref": "#/components/schemas/ErrorBody"}
        documented[int(status)] = set(narrowed["properties"]["reason"]["enum"])
        has_retry_after = headers.RETRY_AFTER in response["headers"]
        assert has_retry_after == any(r.retry_after is not None for r in INVOKE if r.status == int(status))
    assert documented == by_status(INVOKE)


def test_only_the_invoke_and_invocation_operations_answer_errors() -> None:
    for path, operations in openapi.document()["paths"].items():
        for operation in operations.values():
            statuses = set(operation["responses"])
            if not path.startswith("/v1/"):
                assert statuses == {"200"}, path
            elif path not in (openapi.INVOKE_PATH, openapi.FUNCTION_INVOKE_PATH):  # async invocations
                documented = {s for s in statuses if s[0] in "45"}
                reasons = {
                    r
                    for s in documented
                    for r in operation["responses"][s]["content"]["application/json"]["schema"]["allOf"][1][
                        "properties"
                    ]["reason"]["enum"]
                }
                assert reasons <= {str(r) for r in INVOKE}, path


def test_the_schemas_are_the_models() -> None:
    schemas = openapi.document()["components"]["schemas"]
    assert {s for s in schemas if not s.startswith(openapi.ASYNC_PREFIX)} == {
        "InvokeAnswer",
        "Captured",
        "InvocationError",
        "ErrorBody",
    }
    assert "AsyncInvocationStatus" in schemas  # the async contract's, apart
    assert schemas["ErrorBody"]["required"] == ["reason", "message", "invocationId"]
    assert schemas["InvokeAnswer"]["properties"]["status"]["enum"] == list(get_args(InvocationStatus))
    assert _invoke_responses()["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InvokeAnswer"
    }
    refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', json.dumps(openapi.document()))
    assert set(refs) <= set(schemas)


def test_the_invoke_docs_status_table_is_the_catalogue() -> None:
    text = INVOKE_DOC.read_text()
    section = text[text.index("## Statuses and reasons") :]
    section = section[: section.index("\n## ", 1)]
    table: dict[int, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[0] != "200":
            table[int(cells[0])] = set(re.findall(r"`(\w+)`", cells[1]))
    assert table == by_status(INVOKE)


# -- the 200 body, rebuilt from the owner's answer -------------------------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
keys = st.text(alphabet="abcXYZ019_.-", min_size=1, max_size=20)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
captured = st.builds(
    pb.CapturedOutput,
    data=st.binary(max_size=64)
    | st.builds(  # around the bound, a multi-byte character or an undecodable byte at the cut
        lambda n, unit: unit * n,
        st.integers(MAX_LOG_BYTES // 2 - 4, MAX_LOG_BYTES + 64),
        st.sampled_from([b"a", b"\xff", b"\xc3\xa9"]),
    ),
    truncated=st.booleans(),
    total_bytes=st.integers(0, 2**64 - 1),
)
INVOCATION = "inv-7"
MALFORMED = GatewayReason.MALFORMED_OWNER_ANSWER


def response(
    *, status: int = pb.INVOCATION_STATUS_SUCCEEDED, outputs: bytes = b"{}", **fields: Any
) -> pb.InvokeFunctionResponse:
    fields.setdefault("invocation_id", INVOCATION)
    return pb.InvokeFunctionResponse(status=status, outputs_json=outputs, **fields)


def malformed(answer: pb.InvokeFunctionResponse) -> errors.GatewayError:
    with pytest.raises(errors.UpstreamFailed) as caught:
        answer_body(answer, INVOCATION)
    assert caught.value.reason is MALFORMED and caught.value.status == 502
    return caught.value


@checked
@given(
    status=st.sampled_from(sorted(SUCCESS_STATUS)),
    outputs=st.dictionaries(keys, json_values, max_size=4),
    stdout=captured,
    stderr=captured,
    duration_us=st.integers(0, 2**63),
    error=st.none() | st.tuples(texts, texts),
)
def test_the_body_is_an_invoke_answer_built_from_checked_fields(
    status: int,
    outputs: dict[str, Any],
    stdout: pb.CapturedOutput,
    stderr: pb.CapturedOutput,
    duration_us: int,
    error: tuple[str, str] | None,
) -> None:
    answer = response(
        status=status,
        outputs=json.dumps(outputs, separators=(",", ":")).encode(),
        stdout=stdout,
        stderr=stderr,
        duration_us=duration_us,
        error=None if error is None else pb.InvocationError(type=error[0], message=error[1]),
    )
    body = answer_body(answer, INVOCATION)
    parsed = InvokeAnswer.model_validate_json(body)
    assert set(json.loads(body)) <= set(InvokeAnswer.model_fields)
    assert parsed.invocationId == INVOCATION
    assert parsed.status == SUCCESS_STATUS[status]
    for got, sent in ((parsed.stdout, stdout), (parsed.stderr, stderr)):
        kept = sent.data[:MAX_LOG_BYTES]
        assert got.data == kept.decode("utf-8", "replace")
        assert got.totalBytes == min(max(sent.total_bytes, len(sent.data)), 2**53 - 1)
        assert got.truncated is (sent.truncated or got.totalBytes > len(kept))
    assert parsed.durationMs == pytest.approx(duration_us / 1000, rel=1e-9, abs=1e-3)
    if status == pb.INVOCATION_STATUS_SUCCEEDED:
        assert parsed.outputs == outputs and parsed.error is None and b'"error"' not in body
    else:  # the owner's outputs are never passed on with an error
        assert parsed.outputs is None and parsed.error is not None
        sent_type = error[0] if error else ""
        token = re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,127}", sent_type)
        assert parsed.error.type == (sent_type if token else SUCCESS_STATUS[status])
        assert len(parsed.error.message.encode()) <= MAX_INVOCATION_ERROR_MESSAGE_BYTES


@pytest.mark.parametrize(
    "outputs",
    [
        b"",
        b"null",
        b"[1]",
        b'"text"',
        b"1",
        b"{",
        b'{"a":1}{"b":2}',
        b'{"a":1},"status":"Succeeded"',
        b'{"a":1}]',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"bad key":1}',
        b'{"":1}',
        b'{"' + b"k" * 129 + b'":1}',
        b"\xff\xfe{}",
        b"\xef\xbb\xbf{}",
        b'{"a":"\\ud800"}',
        b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}",
        json.dumps({f"k{i}": i for i in range(MAX_OUTPUT_KEYS + 1)}).encode(),
        json.dumps({"big": "x" * MAX_OUTPUT_VALUE_BYTES}).encode(),
        b'{"a":"' + b"x" * MAX_OUTPUTS_TOTAL_BYTES + b'"}',
    ],
    ids=repr,
)
def test_malformed_outputs_are_a_502_never_a_body(outputs: bytes) -> None:
    err = malformed(response(outputs=outputs))
    assert "the function may have run" in err.message


def test_an_answer_for_another_invocation_or_with_an_unknown_status_is_malformed() -> None:
    malformed(response(invocation_id="inv-other"))
    malformed(response(invocation_id=""))
    for status in (pb.INVOCATION_STATUS_UNSPECIFIED, 99):
        malformed(response(status=status))


def test_the_statuses_answered_with_errors() -> None:
    with pytest.raises(errors.UpstreamTimeout) as timeout:
        answer_body(response(status=pb.INVOCATION_STATUS_TIMED_OUT), INVOCATION)
    assert timeout.value.reason is GatewayReason.INVOCATION_TIMEOUT
    with pytest.raises(errors.UpstreamFailed) as exited:
        answer_body(response(status=pb.INVOCATION_STATUS_PROCESS_EXITED), INVOCATION)
    assert exited.value.reason is GatewayReason.FUNCTION_PROCESS_EXITED


def test_outputs_sent_with_an_error_are_dropped() -> None:
    body = answer_body(
        response(status=pb.INVOCATION_STATUS_HANDLER_ERROR, outputs=b'{"a":1},"status":"Succeeded"'),
        INVOCATION,
    )
    doc = json.loads(body)
    assert doc["outputs"] is None and doc["status"] == "HandlerError"
    assert doc["error"] == {"type": "HandlerError", "message": ""}  # none sent: the status


def test_the_error_message_is_cut_and_a_non_token_type_replaced() -> None:
    answer = response(
        status=pb.INVOCATION_STATUS_INVALID_OUTPUT,
        error=pb.InvocationError(type='x","status":"Succeeded', message="é" * 5000),
    )
    doc = json.loads(answer_body(answer, INVOCATION))
    assert doc["error"]["type"] == "InvalidOutput"
    assert len(doc["error"]["message"].encode()) <= MAX_INVOCATION_ERROR_MESSAGE_BYTES
    assert doc["error"]["message"].endswith("…")


@checked
@given(data=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_outputs_are_what_the_api_rules_accept_and_nothing_else(data: bytes) -> None:
    """parse_outputs agrees with kruntimes.api.outputs: a new object equal to the document when
    the rules accept it, MalformedAnswer else."""
    try:
        expected: Any = validate_outputs(json.loads(data.decode("utf-8")))
    except (ValueError, RecursionError, OutputsError):
        expected = None
    if expected is None:
        with pytest.raises(ValueError):
            parse_outputs(data)
    else:
        assert parse_outputs(data) == expected


def test_the_statuses_answered_200_are_the_models() -> None:
    assert sorted(SUCCESS_STATUS.values()) == sorted(get_args(InvocationStatus))
    assert pb.INVOCATION_STATUS_TIMED_OUT not in SUCCESS_STATUS  # 504
    assert pb.INVOCATION_STATUS_PROCESS_EXITED not in SUCCESS_STATUS  # 502


def test_captured_data_is_bounded_as_documented() -> None:
    schema = openapi.document()["components"]["schemas"]["Captured"]
    assert str(MAX_LOG_BYTES) in schema["properties"]["data"]["description"]
