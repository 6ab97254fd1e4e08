"""Structural schemas of the custom resources the chart renders (cert-manager's Issuer and
Certificate, the Prometheus Operator's ServiceMonitor), which the Kubernetes schemas do not
cover: each lists the fields of the upstream CRD (cert-manager.io/v1, monitoring.coreos.com/v1)
that a chart may set, with their types, so a misspelt or misplaced field fails."""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"}
LABELS = {"type": "object", "additionalProperties": STRING}


def _object(properties: dict[str, Any], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": STRING, "namespace": STRING, "labels": LABELS, "annotations": LABELS},
    "additionalProperties": False,
}
ISSUER_REF = _object(
    {"name": STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": STRING}, required=("name",)
)
USAGES = {
    "type": "array",
    "items": {
        "enum": [
            "signing",
            "digital signature",
            "content commitment",
            "key encipherment",
            "key agreement",
            "data encipherment",
            "cert sign",
            "crl sign",
            "server auth",
            "client auth",
        ]
    },
}
CERTIFICATE_SPEC = _object(
    {
        "secretName": STRING,
        "commonName": STRING,
        "dnsNames": STRINGS,
        "uris": STRINGS,
        "ipAddresses": STRINGS,
        "emailAddresses": STRINGS,
        "isCA": {"type": "boolean"},
        "duration": DURATION,
        "renewBefore": DURATION,
        "usages": USAGES,
        "issuerRef": ISSUER_REF,
        "privateKey": _object(
            {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "encoding": {"enum": ["PKCS1", "PKCS8"]},
                "rotationPolicy": {"enum": ["Never", "Always"]},
            }
        ),
        "secretTemplate": _object({"labels": LABELS, "annotations": LABELS}),
    },
    required=("secretName", "issuerRef"),
)
ISSUER_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "selfSigned": _object({"crlDistributionPoints": STRINGS}),
        "ca": _object({"secretName": STRING, "crlDistributionPoints": STRINGS}, required=("secretName",)),
    },
}
SECRET_KEY = _object({"name": STRING, "key": STRING, "optional": {"type": "boolean"}}, required=("key",))
ENDPOINT = _object(
    {
        "port": STRING,
        "targetPort": {"type": ["string", "integer"]},
        "path": STRING,
        "scheme": {"enum": ["http", "https"]},
        "interval": DURATION,
        "scrapeTimeout": DURATION,
        "tlsConfig": _object(
            {
                "serverName": STRING,
                "insecureSkipVerify": {"type": "boolean"},
                "ca": _object({"secret": SECRET_KEY, "configMap": SECRET_KEY}),
            }
        ),
    }
)
SERVICE_MONITOR_SPEC = _object(
    {
        "selector": _object({"matchLabels": LABELS, "matchExpressions": {"type": "array"}}),
        "namespaceSelector": _object({"any": {"type": "boolean"}, "matchNames": STRINGS}),
        "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
        "jobLabel": STRING,
    },
    required=("selector", "endpoints"),
)


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _object(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
        required=("apiVersion", "kind", "metadata", "spec"),
    )


SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Certificate"): _resource("cert-manager.io/v1", "Certificate", CERTIFICATE_SPEC),
    ("cert-manager.io/v1", "Issuer"): _resource("cert-manager.io/v1", "Issuer", ISSUER_SPEC),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _resource(
        "monitoring.coreos.com/v1", "ServiceMonitor", SERVICE_MONITOR_SPEC
    ),
}
