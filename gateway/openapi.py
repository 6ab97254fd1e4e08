"""The OpenAPI document of the gateway's HTTP API (served at /openapi.json).

Nothing in it is written twice: the schemas are generated from the bodies' pydantic models
(gateway/bodies.py) and, for async invocations, from their contract
(kruntimes.contracts.invocation.InvocationStatus, its schemas prefixed `Async`), and the
operations' error answers (a Run's and a Function's alike) from the reasons catalogue
(kruntimes.wire.reasons.GatewayReason): one response per status, its schema the ErrorBody with
`reason` narrowed to the reasons answered with that status. OpenAPI 3.1, whose schemas are the
JSON Schema (2020-12) that pydantic generates.

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
from kruntimes.contracts.invocation import InvocationStatus
from kruntimes.gateway.async_invoke import DEFAULT_LIST, MAX_LIST
from kruntimes.gateway.bodies import ErrorBody, InvokeAnswer
from kruntimes.gateway.callback_origins import MAX_HEADER_BYTES
from kruntimes.wire import headers
from kruntimes.wire import invocations as names
from kruntimes.wire.reasons import GatewayReason
from kruntimes.wire.reasons import GatewayReason as R

COMMITTED = Path(__file__).with_name("openapi.json")
RUN_PATH = "/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}"
FUNCTION_PATH = "/v1/namespaces/{namespace}/functions/{uid}"
INVOKE_PATH = RUN_PATH + ":invoke"
FUNCTION_INVOKE_PATH = FUNCTION_PATH + ":invoke"
_SCHEMAS = "#/components/schemas/"
ASYNC_PREFIX = "Async"  # the async contract's schemas, apart from the bodies' (both have an InvocationError)
# the async invocation paths under a target's URL
INVOCATIONS = "/invocations"
INVOCATION = "/invocations/{id}"
RESUBMIT = "/invocations/{id}:resubmit"
# The answers of the reads (the accept and resubmit answer an invoke's, and 409/429 of their own).
_READ_REASONS = (
    R.INVALID_INVOCATION_ID,
    R.INVALID_REQUEST,
    R.UNAUTHENTICATED,
    R.FORBIDDEN,
    R.INVOCATION_NOT_FOUND,
    R.INTERNAL_ERROR,
    R.AUTHORIZATION_UNAVAILABLE,
    R.ASYNC_UNAVAILABLE,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + name}


def schemas() -> dict[str, Any]:
    """The components' schemas, generated from the models (nested models get their own)."""
    _, top = models_json_schema(
        [(InvokeAnswer, "serialization"), (ErrorBody, "serialization")], ref_template=_SCHEMAS + "{model}"
    )
    _, status = models_json_schema(
        [(InvocationStatus, "serialization")], ref_template=_SCHEMAS + ASYNC_PREFIX + "{model}"
    )
    return {**top["$defs"], **{ASYNC_PREFIX + name: schema for name, schema in status["$defs"].items()}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


_INVOCATION_HEADER = {
    headers.INVOCATION_ID: {"description": "the invocation's id", "schema": {"type": "string"}}
}
_RETRY_AFTER = {
    headers.RETRY_AFTER: {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}
}


def error_responses(only: tuple[GatewayReason, ...] | None = None) -> dict[str, Any]:
    """An operation's error answers (`only` those reasons; the invoke operation's: every one the
    catalogue answers), one per status, from the catalogue."""
    invoke = sorted(
        (r for r in GatewayReason if r.invoke and (only is None or r in only)), key=lambda r: r.status
    )
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


_ACCEPTED = {
    "type": "object",
    "required": ["invocationId", "state", "location"],
    "properties": {
        "invocationId": {"type": "string"},
        "state": {"enum": list(names.STATES)},
        "location": {"type": "string", "description": "the invocation's path (GET it for its status)"},
    },
}
_ACCEPTED_HEADERS = {
    **_INVOCATION_HEADER,
    headers.LOCATION: {"description": "the invocation's path", "schema": {"type": "string"}},
    headers.PREFERENCE_APPLIED: {"description": headers.RESPOND_ASYNC, "schema": {"type": "string"}},
}


def _path_parameters(names_: tuple[str, ...], uid: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            **({"description": uid} if name == "uid" else {}),
            **({"description": "the invocation id, percent-encoded"} if name == "id" else {}),
        }
        for name in names_
    ]


def _async_invoke(operation: dict[str, Any]) -> dict[str, Any]:
    """The invoke operation, with its async answer (`Prefer: respond-async`)."""
    return {
        **operation,
        "parameters": [
            *operation["parameters"],
            {
                "name": headers.PREFER,
                "in": "header",
                "schema": {"type": "string"},
                "description": f"`{headers.RESPOND_ASYNC}`: an async invocation, answered 202 once "
                "recorded (RFC 7240; other preferences are ignored)",
            },
            {
                "name": headers.CALLBACK_URL,
                "in": "header",
                "schema": {"type": "string", "maxLength": MAX_HEADER_BYTES},
                "description": "an async invocation's own callback URL (https, no user), in place of "
                "its target's; its origin must be one the gateway's --callback-origins allows the "
                "namespace (403 CallbackNotAllowed); 400 InvalidCallbackURL on a sync invoke",
            },
        ],
        "responses": {
            **operation["responses"],
            "202": {
                "description": "Prefer: respond-async: recorded (or the same id with the same body "
                "again: the same invocation, never run again)",
                "headers": _ACCEPTED_HEADERS,
                "content": _json(_ACCEPTED),
            },
        },
    }


def _invocation_operations(names_: tuple[str, ...], uid: str, kind: str) -> dict[str, Any]:
    """The async invocation paths under a target's URL, by path suffix."""
    status = _json(_ref(ASYNC_PREFIX + InvocationStatus.__name__))
    listed = {
        "type": "object",
        "required": ["items", "continue"],
        "properties": {
            "items": {
                "type": "array",
                "items": _ref(ASYNC_PREFIX + InvocationStatus.__name__),
                "description": "newest first; each without its `result` (GET the invocation for it)",
            },
            "continue": {"type": "string", "description": "the next page's token; empty at the end"},
        },
    }
    return {
        INVOCATIONS: {
            "get": {
                "summary": f"List a {kind}'s async invocations still remembered (of one state: "
                "state=Failed is the dead-letter view)",
                "parameters": [
                    *_path_parameters(names_, uid),
                    {"name": "state", "in": "query", "schema": {"enum": list(names.STATES)}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIST,
                            "default": DEFAULT_LIST,
                        },
                    },
                    {"name": "continue", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "a page of invocations", "content": _json(listed)},
                    **error_responses(_READ_REASONS),
                },
            }
        },
        INVOCATION: {
            "get": {
                "summary": f"An async invocation of a {kind}: its state, attempts and result",
                "parameters": _path_parameters((*names_, "id"), uid),
                "responses": {
                    "200": {"description": "its status", "headers": _INVOCATION_HEADER, "content": status},
                    **error_responses(_READ_REASONS),
                },
            }
        },
        RESUBMIT: {
            "post": {
                "summary": f"Submit an async invocation of a {kind} again, under a new id, with its body",
                "parameters": [
                    *_path_parameters((*names_, "id"), uid),
                    {
                        "name": headers.INVOCATION_ID,
                        "in": "header",
                        "schema": {"type": "string", "maxLength": MAX_INVOCATION_ID_BYTES},
                        "description": "the new invocation's id; generated when absent",
                    },
                ],
                "responses": {
                    "202": {
                        "description": "recorded",
                        "headers": _ACCEPTED_HEADERS,
                        "content": _json(_ACCEPTED),
                    },
                    **error_responses(),
                },
            }
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
                "post": _async_invoke(
                    _invoke_operation(
                        "Invoke a Ready function Run once", ("namespace", "runtime", "uid"), "the Run's uid"
                    )
                )
            },
            FUNCTION_INVOKE_PATH: {
                "post": _async_invoke(
                    _invoke_operation(
                        "Invoke a Function once, on one of its Ready replicas (the least loaded)",
                        ("namespace", "uid"),
                        "the Function's uid",
                    )
                )
            },
            **{
                RUN_PATH + suffix: operation
                for suffix, operation in _invocation_operations(
                    ("namespace", "runtime", "uid"), "the Run's uid", "Run"
                ).items()
            },
            **{
                FUNCTION_PATH + suffix: operation
                for suffix, operation in _invocation_operations(
                    ("namespace", "uid"), "the Function's uid", "Function"
                ).items()
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
