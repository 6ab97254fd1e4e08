"""The chart's gateway.callbackOrigins (issue #44): rendered into a ConfigMap the real
`krt gateway --callback-origins` loader reads, on a volume mounted where the flag points; a
change rolls the gateways (their pods' checksum); a value the schema refuses names its path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import pytest

from kruntimes.gateway.callback_origins import CallbackOrigins, parse_callback_url
from kruntimes.workers import gateway as gateway_main
from tests.helm.conftest import CASES, Rendered, args_of, render

ORIGINS = {
    "default": ["https://hooks.example.com", "https://*.example.org:8443"],
    "*": ["https://203.0.113.7"],
}


def _rendered(values: dict[str, Any]) -> Rendered:
    docs, notes = render(values)
    return Rendered("callback-origins", values, docs, notes)


def _with(origins: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    values = copy.deepcopy(base or {})
    values.setdefault("gateway", {})["callbackOrigins"] = origins
    return values


def test_the_configmap_is_the_file_the_flag_names_and_loads_with_the_gateways_loader() -> None:
    chart = _rendered(_with(ORIGINS))
    container = chart.container("Deployment", "-gateway")
    args = gateway_main.parse_args(args_of(container))
    path = Path(args.callback_origins)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent))
    volumes = chart.one("Deployment", "-gateway")["spec"]["template"]["spec"]["volumes"]
    volume = next(v for v in volumes if v["name"] == mount["name"])
    configmap = chart.one("ConfigMap", volume["configMap"]["name"])
    origins = CallbackOrigins.from_yaml(configmap["data"][path.name])
    assert origins.allows("default", parse_callback_url("https://a.example.org:8443/hook?t=x"))
    assert origins.allows("tenant", parse_callback_url("https://203.0.113.7/h"))
    assert not origins.allows("tenant", parse_callback_url("https://hooks.example.com/h"))


def test_by_default_the_file_allows_none_and_a_change_rolls_the_gateways() -> None:
    default = _rendered({})
    args = gateway_main.parse_args(args_of(default.container("Deployment", "-gateway")))
    assert args.callback_origins is not None
    text = default.one("ConfigMap", "-gateway-callback-origins")["data"]["callback-origins.yaml"]
    assert not CallbackOrigins.from_yaml(text).allows("default", parse_callback_url("https://x.example.com/"))

    def checksum(chart: Rendered) -> str:
        annotations = chart.one("Deployment", "-gateway")["spec"]["template"]["metadata"]["annotations"]
        value: str = annotations["checksum/callback-origins"]
        return value

    assert checksum(default) != checksum(_rendered(_with(ORIGINS)))


def test_without_temporal_there_is_neither_the_flag_nor_the_configmap() -> None:
    chart = _rendered({"gateway": {"knownRuns": False}})
    assert "--callback-origins" not in args_of(chart.container("Deployment", "-gateway"))
    assert not [d for d in chart.of("ConfigMap") if d["metadata"]["name"].endswith("-callback-origins")]


@pytest.mark.parametrize(
    ("origins", "named"),
    [
        ({"default": ["https://hooks.example.com/path?token=x"]}, "/gateway/callbackOrigins/default/0"),
        ({"default": ["http://hooks.example.com"]}, "/gateway/callbackOrigins/default/0"),
        ({"Not_A_Namespace": []}, "Not_A_Namespace"),
    ],
)
def test_the_schema_refuses_what_is_no_origin_naming_it(origins: dict[str, Any], named: str) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        render(_with(origins, CASES["default"]))
    assert named in str(refused.value)
