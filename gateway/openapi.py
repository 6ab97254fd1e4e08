"""The OpenAPI document of the gateway's HTTP API (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from kruntimes.api.limits import MAX_INVOCATION_ID_BYTES, MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES

_ERROR = {
    "type": "object",
    "required": ["reason", "message", "invocationId"],
    "properties": {
        "reason": {"type": "string", "description": "stable machine-readable reason"},
        "message": {"type": "string"},
        "invocationId": {"type": "string"},
    },
}
_CAPTURED = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "truncated": {"type": "boolean"},
        "totalBytes": {"type": "integer"},
    },
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "kruntimes gateway", "version": "v1"},
        "components": {
            "schemas": {"Error": _ERROR, "Captured": _CAPTURED},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke": {
                "post": {
                    "summary": "Invoke a Ready function Run once",
                    "parameters": [
                        {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}},
                        {"name": "runtime", "in": "path", "required": True, "schema": {"type": "string"}},
                        {"name": "uid", "in": "path", "required": True, "schema": {"type": "string"}},
                        {
                            "name": "X-Kruntime-Invocation-ID",
                            "in": "header",
                            "schema": {"type": "string", "maxLength": MAX_INVOCATION_ID_BYTES},
                            "description": "echoed in every answer; generated when absent",
                        },
                        {
                            "name": "X-Kruntime-Timeout",
                            "in": "header",
                            "schema": {"type": "number", "maximum": MAX_INVOKE_TIMEOUT_SECONDS},
                        },
                    ],
                    "requestBody": {
                        "description": f"a JSON document of at most {MAX_PAYLOAD_BYTES} bytes",
                        "content": {"application/json": {"schema": {}}},
                    },
                    "responses": {
                        "200": {
                            "description": "the function ran: Succeeded, HandlerError or InvalidOutput",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "invocationId": {"type": "string"},
                                            "status": {
                                                "type": "string",
                                                "enum": ["Succeeded", "HandlerError", "InvalidOutput"],
                                            },
                                            "outputs": {"type": "object", "nullable": True},
                                            "stdout": {"$ref": "#/components/schemas/Captured"},
                                            "stderr": {"$ref": "#/components/schemas/Captured"},
                                            "durationMs": {"type": "number"},
                                            "error": {"type": "object"},
                                        },
                                    }
                                }
                            },
                        },
                        "400": _error("bad invocation id, timeout or malformed JSON"),
                        "401": _error("no or bad token"),
                        "403": _error("not allowed to get this Run"),
                        "404": _error("unknown uid, or not of this namespace/runtime"),
                        "413": _error("body over 1 MiB"),
                        "429": _error("the function's one in-flight invocation is busy (Retry-After)"),
                        "502": _error("the owner failed after dispatch; never retried"),
                        "503": _error("known Run not ready, recovering or terminating (Retry-After)"),
                        "504": _error("the function or its owner timed out after dispatch; never retried"),
                    },
                }
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
