"""A function's output read as a ResourceList: the cheap check of an output without results
agrees with building it (same answer, same error kind) on every shape, usual or not."""

from __future__ import annotations

import pytest

from kruntimes.krm import errors
from kruntimes.krm.resources import YamlError, output_results, parse_resource_list, parse_results

HEAD = "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\n"
OUTPUTS = {
    "plain": HEAD + "items:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
    "no items": HEAD,
    "null items": HEAD + "items: ~\n",
    "empty items": HEAD + "items: []\n",
    "v1alpha1": "apiVersion: config.kubernetes.io/v1alpha1\nkind: ResourceList\nitems: []\n",
    "quoted": '"apiVersion": "config.kubernetes.io/v1"\n"kind": \'ResourceList\'\nitems: []\n',
    "json": '{"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList", "items": [{}]}',
    "function config": HEAD + "items: []\nfunctionConfig: {data: {a: b}}\n",
    "null function config": HEAD + "items: []\nfunctionConfig: null\n",
    "results": HEAD + "items: []\nresults:\n- {message: hi, severity: warning}\n",
    "anchors in items": HEAD + "items:\n- &a {kind: A}\n- *a\n",
    "alias as a value": "x: &k ResourceList\n" + "apiVersion: config.kubernetes.io/v1\nkind: *k\n",
    "repeated kind": "apiVersion: config.kubernetes.io/v1\nkind: Other\nkind: ResourceList\n",
    "tagged": "!!map\napiVersion: config.kubernetes.io/v1\nkind: ResourceList\n",
    "document marker": "---\n" + HEAD + "...\n",
    "wrong kind": "apiVersion: config.kubernetes.io/v1\nkind: Other\nitems: []\n",
    "no api version": "kind: ResourceList\nitems: []\n",
    "scalar items": HEAD + "items: 3\n",
    "items of scalars": HEAD + "items: [1, 2]\n",
    "list function config": HEAD + "functionConfig: [1]\n",
    "two documents": HEAD + "---\n" + HEAD,
    "a list": "- 1\n- 2\n",
    "a scalar": "hello\n",
    "empty": "",
    "garbage": "{{{ not yaml",
    "bad results": HEAD + "results: [{severity: loud, message: x}]\n",
}


def built(data: bytes) -> tuple[object, ...] | type[Exception]:
    try:
        return parse_results(parse_resource_list(data))
    except (YamlError, errors.TooManyResults) as e:
        return type(e)


def checked(data: bytes) -> tuple[object, ...] | type[Exception]:
    try:
        return output_results(data)
    except (YamlError, errors.TooManyResults) as e:
        return type(e)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_the_cheap_check_agrees_with_building_the_output(name: str) -> None:
    data = OUTPUTS[name].encode()
    assert checked(data) == built(data)


def test_results_are_read_whole() -> None:
    (result,) = output_results(OUTPUTS["results"].encode())
    assert (result.severity, result.message) == ("warning", "hi")


@pytest.mark.parametrize("name", ["plain", "no items", "null items", "json", "quoted", "function config"])
def test_usual_outputs_without_results_are_checked_without_building_them(name: str) -> None:
    from kruntimes.krm.resources import _plainly_without_results

    assert _plainly_without_results(OUTPUTS[name].encode())
