"""values.schema.json against every value the chart has: for each value of values.yaml and of each
helm/kruntimes/ci/*-values.yaml (each place in the values once), Helm refuses a wrong type there,
naming its path, and every object there is closed — an unknown key is refused, named — unless it
is a map by design (labels, annotations, node selectors, resource quantities). The Kubernetes
objects among the values are checked against the Kubernetes definitions the schema carries,
which are those tests/helm/kubernetes_definitions.py generates."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from tests.helm import kubernetes_definitions
from tests.helm.conftest import CASES, CHART, render

UNKNOWN = "bogusKey"


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return data


def values_of(case: str) -> dict[str, Any]:
    if case == "default":
        defaults: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
        return defaults
    return CASES[case]


def places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from places(item, (*path, i))


def resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = root["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def node_at(root: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    node = resolve(root, root)
    for part in path:
        if isinstance(part, int):
            node = node["items"]
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            node = node["additionalProperties"]
        node = resolve(root, node)
    return node


def takes_strings(node: dict[str, Any]) -> bool:
    """Whether a string is a value of the node's type (an int-or-string port, a quantity)."""
    kinds = node.get("type", [])
    return "string" in ([kinds] if isinstance(kinds, str) else kinds) or any(
        takes_strings(n) for n in node.get("oneOf", []) + node.get("anyOf", [])
    )


def pointer(path: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def replaced(values: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    copied = copy.deepcopy(values)
    node: Any = copied
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = new
    return copied


def refusal(values: dict[str, Any]) -> str:
    try:
        render(values)
    except helm_python.HelmError as e:
        return str(e)
    return ""


def checked_places() -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(case, path) for each place in the values, the first case that has it."""
    seen: set[tuple[Any, ...]] = set()
    for case in ["default", *sorted(set(CASES) - {"default"})]:
        for path, _ in places(values_of(case)):
            general = tuple("[]" if isinstance(p, int) else p for p in path)
            if path and general not in seen:
                seen.add(general)
                yield case, path


@pytest.mark.parametrize("case", ["default", *sorted(set(CASES) - {"default"})])
def test_a_wrong_type_and_an_unknown_key_are_refused_naming_them_everywhere(case: str) -> None:
    root = schema()
    values = values_of(case)
    current = dict(places(values))
    problems = []
    for _, path in [p for p in checked_places() if p[0] == case]:
        value = current[path]
        wrong: Any = [1] if isinstance(value, str) or takes_strings(node_at(root, path)) else "wrong"
        named = f"'{pointer(path)}'"
        if named not in refusal(replaced(values, path, wrong)):
            problems.append(f"{pointer(path)}: {wrong!r} instead of {value!r} not refused by name")
        if isinstance(value, dict):
            closed = node_at(root, path).get("additionalProperties")
            if closed is False:
                if UNKNOWN not in refusal(replaced(values, path, {**value, UNKNOWN: 1})):
                    problems.append(f"{pointer(path)}: an unknown key not refused by name")
            elif not isinstance(closed, dict):  # a map by design has a schema for its values
                problems.append(f"{pointer(path)}: an open object in the schema")
    assert problems == []


def test_every_place_of_the_values_is_checked() -> None:
    checked = {path for _, path in checked_places()}
    assert ("hosts", "podTemplate", "securityContext", "runAsNonRoot") in checked
    assert ("runtimes", 0, "kubernetes", "podTemplate", "containerSecurityContext", "capabilities") in checked
    assert ("networkPolicy", "hostEgress", 0, "to", 0, "ipBlock", "except") in checked
    assert len(checked) > 150


def test_the_schemas_kubernetes_definitions_are_the_generated_ones() -> None:
    root = schema()
    assert root["definitions"] == kubernetes_definitions.generate(), (
        "regenerate: .venv/bin/python -m tests.helm.kubernetes_definitions"
    )
    for path, kind in kubernetes_definitions.KINDS.items():
        assert kubernetes_definitions.node_at(root, path)["$ref"] == f"#/definitions/{kind}", path


def test_a_host_pod_templates_misspelt_security_field_is_refused_at_install() -> None:
    message = refusal({"hosts": {"podTemplate": {"securityContext": {"runAsNonroot": True}}}})
    assert "runAsNonroot" in message and "/hosts/podTemplate/securityContext" in message
    message = refusal(
        {
            "runtimes": [
                {"name": "python", "adapter": "python", "kubernetes": {"podTemplate": {"volumes": [{}]}}}
            ]
        }
    )
    assert "/runtimes/0/kubernetes/podTemplate/volumes/0" in message and "name" in message
