"""The chart selects the gateway's auth method by `gateway.auth.method`: the schema admits exactly
the registered methods, and each renders a gateway whose args select it with all its flags, every
file they name on a volume."""

from __future__ import annotations

import argparse
import json
from typing import Any

import helm_python
import pytest

from kruntimes.gateway.auth.methods import METHODS
from kruntimes.workers import gateway as gateway_main
from tests.helm.conftest import CHART, Rendered, args_of, pod_spec, render, rendered


def schema_enum() -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum: list[str] = schema["properties"]["gateway"]["properties"]["auth"]["properties"]["method"]["enum"]
    return enum


def test_the_schema_admits_exactly_the_registered_auth_methods() -> None:
    assert sorted(schema_enum()) == sorted(METHODS)


def test_the_chart_defaults_to_kubernetes_auth() -> None:
    args = gateway_main.parse_args(args_of(rendered("default").container("Deployment", "-gateway")))
    assert args.auth == "kubernetes"


def own_flags(name: str) -> list[str]:
    """The argparse destinations of the flags auth method `name` adds."""
    group = argparse.ArgumentParser().add_argument_group()
    METHODS[name].add_arguments(group)
    return [action.dest for action in group._group_actions]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_renders_a_gateway_with_its_own_flags_on_mounted_files(name: str) -> None:
    values: dict[str, Any] = {"gateway": {"auth": {"method": name, "embedded": {"secretName": "krt-auth"}}}}
    docs, _ = render(values)
    chart = Rendered(name, values, docs, "")
    gateway = chart.one("Deployment", "-gateway")
    container = chart.container("Deployment", "-gateway")
    args = gateway_main.parse_args(args_of(container))
    assert args.auth == name
    given = {dest: getattr(args, dest) for dest in own_flags(name)}
    assert all(value is not None for value in given.values()), given
    mounts = [m["mountPath"].rstrip("/") + "/" for m in container["volumeMounts"]]
    for value in given.values():
        if str(value).startswith("/"):
            assert any(str(value).startswith(m) for m in mounts), f"{value} is on no volume"
    secrets = [v["secret"]["secretName"] for v in pod_spec(gateway)["volumes"] if "secret" in v]
    assert ("krt-auth" in secrets) == (name == "embedded")


def test_the_embedded_method_needs_its_secret() -> None:
    with pytest.raises(helm_python.HelmError, match="gateway.auth.embedded.secretName"):
        render({"gateway": {"auth": {"method": "embedded"}}})


def test_a_method_that_is_not_registered_is_refused_at_install() -> None:
    with pytest.raises(helm_python.HelmError, match="method"):
        render({"gateway": {"auth": {"method": "ldap"}}})
