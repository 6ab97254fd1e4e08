"""The Kubernetes definitions values.schema.json carries (its "definitions"), for the values the
chart passes on as Kubernetes objects: the worker's and gateways' tolerations and affinity, the
NetworkPolicy peers and the hosts' egress rules, and the host pod template's resources, security
contexts, tolerations, affinity, env, volumes and volume mounts. They are kubernetes-validate's
strict definitions (no unknown field) of the newest Kubernetes the chart claims, with their
descriptions dropped, so `helm install` refuses an unknown key or a wrong type in one of them,
naming it — also in a host pod template, which only the worker reads (from the runtimes
ConfigMap) and which no API server sees at install.

tests/helm/chart_test.py holds the schema to what `generate` makes. After a kubeVersion change or
a kubernetes-validate upgrade, write it again with:

    .venv/bin/python -m tests.helm.kubernetes_definitions
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import kubernetes_validate

from tests.helm.conftest import CHART, claimed_versions

SCHEMA = CHART / "values.schema.json"
CORE = "io.k8s.api.core.v1."
NETWORKING = "io.k8s.api.networking.v1."
_TEMPLATE = {
    ("resources",): CORE + "ResourceRequirements",
    ("securityContext",): CORE + "PodSecurityContext",
    ("containerSecurityContext",): CORE + "SecurityContext",
    ("tolerations", "[]"): CORE + "Toleration",
    ("affinity",): CORE + "Affinity",
    ("env", "[]"): CORE + "EnvVar",
    ("volumes", "[]"): CORE + "Volume",
    ("volumeMounts", "[]"): CORE + "VolumeMount",
}
# values path ("[]": every item of a list) → the Kubernetes definition of the value there
KINDS: dict[tuple[str, ...], str] = {
    **{
        (part, *path): CORE + kind
        for part in ("worker", "gateway")
        for path, kind in {("tolerations", "[]"): "Toleration", ("affinity",): "Affinity"}.items()
    },
    ("networkPolicy", "gatewayIngressFrom", "[]"): NETWORKING + "NetworkPolicyPeer",
    ("networkPolicy", "metricsFrom", "[]"): NETWORKING + "NetworkPolicyPeer",
    ("networkPolicy", "temporalTo", "[]"): NETWORKING + "NetworkPolicyPeer",
    ("networkPolicy", "hostEgress", "[]"): NETWORKING + "NetworkPolicyEgressRule",
    **{("hosts", "podTemplate", *path): kind for path, kind in _TEMPLATE.items()},
    **{("runtimes", "[]", "kubernetes", "podTemplate", *path): kind for path, kind in _TEMPLATE.items()},
}
_DROPPED = frozenset(
    {
        "description",
        "x-kubernetes-group-version-kind",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-unions",
    }
)


def _upstream(version: str) -> dict[str, Any]:
    root = os.path.dirname(kubernetes_validate.__file__)
    path = os.path.join(root, "kubernetes-json-schema", f"v{version}-local-strict", "_definitions.json")
    with open(path) as f:
        definitions: dict[str, Any] = json.load(f)["$defs"]
    return definitions


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _local(node: Any) -> Any:
    """The node without descriptions, its references pointing into the values schema."""
    if isinstance(node, dict):
        return {
            key: ("#/definitions/" + value.rsplit("/", 1)[-1] if key == "$ref" else _local(value))
            for key, value in node.items()
            if key not in _DROPPED
        }
    if isinstance(node, list):
        return [_local(value) for value in node]
    return node


def generate() -> dict[str, Any]:
    """Every definition KINDS needs, with the ones they refer to, of the newest claimed version."""
    upstream = _upstream(claimed_versions()[1])
    needed: set[str] = set()
    pending = list(KINDS.values())
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending += _refs(upstream[name])
    return {name: _local(upstream[name]) for name in sorted(needed)}


def node_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    for part in path:
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def write() -> None:
    schema = json.loads(SCHEMA.read_text())
    for path, kind in KINDS.items():
        *parents, last = path
        parent = node_at(schema, tuple(parents))
        holder = parent if last == "[]" else parent["properties"]
        key = "items" if last == "[]" else last
        described = {"description": holder[key]["description"]} if "description" in holder[key] else {}
        holder[key] = {"$ref": f"#/definitions/{kind}", **described}
    schema["definitions"] = generate()
    SCHEMA.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write()
