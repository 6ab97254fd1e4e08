"""Valid manifests and models to start each test from; tests change one thing and expect one error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kruntimes.api import Condition, ConditionReason, ConditionStatus, Run, RunSpec, RunStatus

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
RUN_UID = "2c24c1f0-9f8f-4f80-82d5-3dd16a12d1e6"
CA_BUNDLE = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
ENDPOINT_URL = f"https://gateway.local/v1/namespaces/demo/runtimes/python/functions/{RUN_UID}:invoke"


def spec_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "runtime": "python",
        "mode": {"function": {"idleTimeoutSeconds": 300}},
        "source": {"inline": [{"name": "main.py", "content": "def handle(x):\n    return x\n"}]},
        "handler": "main:handle",
    }
    return {**data, **changes}


def make_spec(**changes: Any) -> RunSpec:
    return RunSpec.model_validate(spec_data(**changes))


def ready_condition(*, status: ConditionStatus = ConditionStatus.TRUE, at: datetime = T0) -> Condition:
    return Condition(
        type="Ready", status=status, reason=ConditionReason.FunctionRegistered, lastTransitionTime=at
    )


def full_run() -> Run:
    """A Run with every optional field set, status included."""
    return Run.model_validate(
        {
            "apiVersion": "kruntimes.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": "echo", "namespace": "demo", "uid": RUN_UID, "labels": {"team": "a"}},
            "spec": spec_data(
                env={"GREETING": "hi"},
                timeoutSeconds=3600,
                retryPolicy={
                    "limit": 5,
                    "backoffSeconds": 0.5,
                    "backoffMultiplier": 3,
                    "maxBackoffSeconds": 30,
                },
                ttlSecondsAfterFinished=600,
                tenant="acme",
            ),
            "status": RunStatus(
                phase="Ready",
                conditions=[ready_condition()],
                attempt=2,
                assignedHost="host-1",
                assignedHostUID="0b8c7a4e-host",
                endpoint={"protocol": "HTTPS", "url": ENDPOINT_URL, "caBundle": CA_BUNDLE},
                startTime=T0,
                completionTime=T0,
                message="registered",
                outputs={"result": [1, "two", {"three": 3.0}], "ok": True, "none": None},
            ),
        }
    )


def assert_invalid(model: type[BaseModel], data: object, *, loc: str, says: str) -> None:
    """Validating data fails at field path loc with a message containing says."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    errors = {".".join(str(p) for p in e["loc"]): e["msg"] for e in info.value.errors()}
    assert loc in errors, errors
    assert says in errors[loc], errors[loc]
