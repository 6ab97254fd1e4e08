"""The OpenAPI document of the gateway's HTTP API (served at /openapi.json).

Nothing in it is written twice: the schemas are generated from the bodies' pydantic models
(gateway/bodies.py), and the invoke operations' error answers (a Run's and a Function's alike)
from the reasons catalogue (kruntimes.wire.reasons.GatewayReason): one response per status, its
schema the ErrorBody with `reason` narrowed to the reasons answered with that status. OpenAPI
3.1, whose schemas are the JSON Schema (2020-12) that pydantic generates.

The gateway serves the committed gateway/openapi.json (the running gateway does not load
pydantic); `make openapi` writes it from here, and a test checks it is fresh.
"""

from __future__ import annotations

import json
import sys
from itertools import groupby
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from kruntimes.api.limits import MAX_INVOCATION_ID_BYTES, MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.gateway.bodies import ErrorBody, InvokeAnswer
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason

COMMITTED = Path(__file__).with_name("openapi.json")
INVOKE_PATH = "/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke"
FUNCTION_INVOKE_PATH = "/v1/namespaces/{namespace}/functions/{uid}:invoke"
_SCHEMAS = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + name}


def schemas() -> dict[str, Any]:
    """The components' schemas, generated from the models (nested models get their own)."""
    _, top = models_json_schema(
        [(InvokeAnswer, "serialization"), (ErrorBody, "serialization")], ref_template=_SCHEMAS + "{model}"
    )
    return dict(top["$defs"])


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


_INVOCATION_HEADER = {
    headers.INVOCATION_ID: {"description": "the invocation's id", "schema": {"type": "string"}}
}
_RETRY_AFTER = {
    headers.RETRY_AFTER: {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}
}


def error_responses() -> dict[str, Any]:
    """The invoke operation's error answers, one per status, from the catalogue."""
    invoke = sorted((r for r in GatewayReason if r.invoke), key=lambda r: r.status)
    responses: dict[str, Any] = {}
    for status, group in groupby(invoke, key=lambda r: r.status):
        reasons = list(group)
        answer_headers = dict(_INVOCATION_HEADER)
        if any(r.retry_after is not None for r in reasons):
            answer_headers.update(_RETRY_AFTER)
        narrowed = {"properties": {"reason": {"enum": [str(r) for r in reasons]}}}
        responses[str(status)] = {
            "description": "; ".join(f"{r}: {r.when}" for r in reasons),
            "headers": answer_headers,
            "content": _json({"allOf": [_ref(ErrorBody.__name__), narrowed]}),
        }
    return responses


def _invoke_operation(summary: str, names: tuple[str, ...], uid: str) -> dict[str, Any]:
    """An invoke operation: a Run's and a Function's differ in their path only; both answer
    from the one catalogue (the reasons only a Function's URL gives say so)."""
    return {
        "summary": summary,
        "parameters": [
            *(
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    **({"description": uid} if name == "uid" else {}),
                }
                for name in names
            ),
            {
                "name": headers.INVOCATION_ID,
                "in": "header",
                "schema": {
                    "type": "string",
                    "maxLength": MAX_INVOCATION_ID_BYTES,
                    "pattern": f"^[ -~]{{1,{MAX_INVOCATION_ID_BYTES}}}$",
                },
                "description": "printable ASCII; echoed in every answer; generated when absent",
            },
            {
                "name": headers.TIMEOUT,
                "in": "header",
                "schema": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_INVOKE_TIMEOUT_SECONDS,
                },
                "description": "seconds, in ASCII digits (30, 0.5); a Function's wait for a replica counts",
            },
        ],
        "requestBody": {
            "description": f"a JSON document of at most {MAX_PAYLOAD_BYTES} bytes",
            "content": _json({}),
        },
        "responses": {
            "200": {
                "description": "the function ran: Succeeded, HandlerError or InvalidOutput",
                "headers": _INVOCATION_HEADER,
                "content": _json(_ref(InvokeAnswer.__name__)),
            },
            **error_responses(),
        },
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "kruntimes gateway", "version": "v1"},
        "components": {
            "schemas": schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            INVOKE_PATH: {
                "post": _invoke_operation(
                    "Invoke a Ready function Run once", ("namespace", "runtime", "uid"), "the Run's uid"
                )
            },
            FUNCTION_INVOKE_PATH: {
                "post": _invoke_operation(
                    "Invoke a Function once, on one of its Ready replicas (the least loaded)",
                    ("namespace", "uid"),
                    "the Function's uid",
                )
            },
            "/healthz": {
                "get": {"summary": "liveness", "security": [], "responses": {"200": {"description": "alive"}}}
            },
            "/readyz": {
                "get": {
                    "summary": "readiness",
                    "security": [],
                    "responses": {"200": {"description": "ready"}},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {"200": {"description": "text"}},
                }
            },
        },
    }


def rendered() -> str:
    """The document as committed in gateway/openapi.json."""
    return json.dumps(document(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else COMMITTED
    out.write_text(rendered(), encoding="utf-8")
