from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from kruntimes.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    Endpoint,
    EndpointProtocol,
    RunPhase,
    RunStatus,
)
from kruntimes.api.limits import (
    MAX_CA_BUNDLE_BYTES,
    MAX_CONDITIONS,
    MAX_ENDPOINT_URL_BYTES,
    MAX_STATUS_MESSAGE_BYTES,
)

from .builders import CA_BUNDLE, ENDPOINT_URL, T0, assert_invalid, ready_condition


def condition_data(**changes: object) -> dict[str, object]:
    return {"type": "Ready", "status": "False", "reason": "Registering", "lastTransitionTime": T0, **changes}


def test_a_new_status_is_pending_and_empty():
    status = RunStatus()
    assert (status.phase, status.conditions, status.attempt, status.message) == (RunPhase.Pending, [], 0, "")
    assert status.endpoint is None
    assert status.outputs is None


def test_endpoint_accepts_https_with_a_pem_bundle():
    endpoint = Endpoint(protocol=EndpointProtocol.HTTPS, url=ENDPOINT_URL, caBundle=CA_BUNDLE)
    assert endpoint.caBundle == CA_BUNDLE


@pytest.mark.parametrize(
    ("protocol", "url"),
    [("HTTPS", "http://gw/x"), ("HTTP", "https://gw/x"), ("HTTPS", "gw/x"), ("HTTPS", "https://")],
)
def test_endpoint_url_scheme_matches_the_protocol(protocol, url):
    assert_invalid(Endpoint, {"protocol": protocol, "url": url}, loc="", says="endpoint.url must start with")


def test_endpoint_url_is_bounded():
    fits = "https://gw/" + "x" * (MAX_ENDPOINT_URL_BYTES - len("https://gw/"))
    assert Endpoint(protocol=EndpointProtocol.HTTPS, url=fits)
    data = {"protocol": "HTTPS", "url": fits + "x"}
    assert_invalid(Endpoint, data, loc="", says=f"endpoint.url exceeds {MAX_ENDPOINT_URL_BYTES} bytes")


@pytest.mark.parametrize("url", ["https://gw/a b", "https://gw/\n"])
def test_endpoint_url_has_no_whitespace_or_controls(url):
    assert_invalid(Endpoint, {"protocol": "HTTPS", "url": url}, loc="", says="whitespace or control")


def test_endpoint_protocol_is_http_or_https():
    assert_invalid(
        Endpoint, {"protocol": "GRPC", "url": "grpc://x"}, loc="protocol", says="'HTTP' or 'HTTPS'"
    )


def test_ca_bundle_must_be_pem():
    data = {"protocol": "HTTPS", "url": ENDPOINT_URL, "caBundle": "MIIB"}
    assert_invalid(Endpoint, data, loc="caBundle", says="must be PEM")


def test_ca_bundle_is_bounded():
    big = CA_BUNDLE + "x" * MAX_CA_BUNDLE_BYTES
    data = {"protocol": "HTTPS", "url": ENDPOINT_URL, "caBundle": big}
    assert_invalid(Endpoint, data, loc="caBundle", says=f"exceeds {MAX_CA_BUNDLE_BYTES} bytes")


def test_condition_status_values():
    assert [s.value for s in ConditionStatus] == ["True", "False", "Unknown"]


def test_condition_reasons_are_camel_case_constants():
    for reason in ConditionReason:
        assert reason.value == reason.name
        assert Condition.model_validate(condition_data(reason=reason)).reason == reason


@pytest.mark.parametrize("reason", ["", "registering", "Not ok", "Bad-Reason", "R" * 129])
def test_condition_reason_is_a_camel_case_identifier(reason):
    assert_invalid(Condition, condition_data(reason=reason), loc="reason", says="CamelCase identifier")


def test_condition_type_is_a_camel_case_identifier():
    assert_invalid(Condition, condition_data(type="ready"), loc="type", says="CamelCase identifier")


@pytest.mark.parametrize(
    ("value", "expected"), [(True, ConditionStatus.TRUE), (False, ConditionStatus.FALSE)]
)
def test_unquoted_yaml_booleans_are_condition_statuses(value, expected):
    assert Condition.model_validate(condition_data(status=value)).status == expected


def test_condition_times_must_be_timezone_aware():
    naive = datetime(2025, 1, 1)
    assert_invalid(
        Condition, condition_data(lastTransitionTime=naive), loc="lastTransitionTime", says="timezone"
    )


@pytest.mark.parametrize("field", ["startTime", "completionTime"])
def test_status_times_must_be_timezone_aware(field):
    assert_invalid(RunStatus, {field: "2025-01-01T00:00:00"}, loc=field, says="timezone")


def test_long_messages_are_truncated_on_a_utf8_boundary():
    status = RunStatus(message="é" * MAX_STATUS_MESSAGE_BYTES)
    encoded = status.message.encode()
    assert len(encoded) <= MAX_STATUS_MESSAGE_BYTES
    assert status.message.endswith("…")
    assert set(status.message[:-1]) == {"é"}


def test_message_truncation_is_stable_across_round_trips():
    status = RunStatus(message="x" * (MAX_STATUS_MESSAGE_BYTES * 2))
    assert RunStatus.model_validate(status.model_dump()) == status
    assert RunStatus(message="short").message == "short"


def test_condition_messages_are_truncated_too():
    cond = Condition.model_validate(condition_data(message="y" * (MAX_STATUS_MESSAGE_BYTES + 1)))
    assert len(cond.message.encode()) <= MAX_STATUS_MESSAGE_BYTES


def test_lone_surrogates_in_messages_are_replaced():
    assert RunStatus(message="bad \udcff name").message == "bad ? name"


def test_conditions_are_bounded_in_count():
    conditions = [condition_data(type=f"T{i}") for i in range(MAX_CONDITIONS + 1)]
    assert_invalid(RunStatus, {"conditions": conditions}, loc="conditions", says=f"at most {MAX_CONDITIONS}")


def test_conditions_hold_one_per_type():
    conditions = [condition_data(), condition_data(status="True")]
    assert_invalid(RunStatus, {"conditions": conditions}, loc="conditions", says="one condition per type")


def test_attempt_is_not_negative():
    assert_invalid(RunStatus, {"attempt": -1}, loc="attempt", says="greater than or equal to 0")


@pytest.mark.parametrize("data", [{"assignedHost": "h"}, {"assignedHostUID": "u"}])
def test_assigned_host_and_its_uid_go_together(data):
    assert_invalid(RunStatus, data, loc="", says="set and cleared together")


def test_outputs_are_validated_with_the_outputs_rules():
    assert_invalid(RunStatus, {"outputs": {"a b": 1}}, loc="outputs", says="outputs.a b: InvalidKey")
    assert_invalid(RunStatus, {"outputs": [1]}, loc="outputs", says="NotAnObject")


def test_outputs_are_stored_in_canonical_json_form():
    assert RunStatus(outputs={"pair": (1, 2)}).outputs == {"pair": [1, 2]}


def test_with_condition_appends_a_new_type():
    status = RunStatus().with_condition(ready_condition())
    assert status.conditions == [ready_condition()]


def test_with_condition_replaces_the_same_type_in_place():
    other = Condition.model_validate(condition_data(type="Scheduled", status="True", reason="Scheduled"))
    status = RunStatus(conditions=[ready_condition(status=ConditionStatus.FALSE), other])
    later = T0 + timedelta(minutes=1)
    updated = status.with_condition(ready_condition(at=later))
    assert updated.conditions == [ready_condition(at=later), other]
    assert status.conditions[0].status == ConditionStatus.FALSE


def test_with_condition_keeps_the_transition_time_when_status_is_unchanged():
    status = RunStatus(conditions=[ready_condition()])
    later = T0 + timedelta(minutes=1)
    new = Condition(
        type="Ready", status=ConditionStatus.TRUE, reason="Recovering", message="m", lastTransitionTime=later
    )
    (cond,) = status.with_condition(new).conditions
    assert (cond.reason, cond.message, cond.lastTransitionTime) == ("Recovering", "m", T0)


def test_with_condition_respects_the_condition_bound():
    full = RunStatus.model_validate(
        {"conditions": [condition_data(type=f"T{i}") for i in range(MAX_CONDITIONS)]}
    )
    with pytest.raises(ValueError, match=f"at most {MAX_CONDITIONS}"):
        full.with_condition(ready_condition())
