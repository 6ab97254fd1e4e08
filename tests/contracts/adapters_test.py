"""The language adapters are one list (kruntimes.api.adapters.ADAPTERS): the platform config, the
Run API, the Helm values schema and the Runtime Server's adapters all hold to it, and no module
outside the adapters branches on an adapter's name."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from kruntimes.api import RunSpec
from kruntimes.api.adapters import ADAPTERS, validate_handler
from kruntimes.config.runtimes import PlatformConfigError, RuntimeConfig, parse_config
from kruntimes.runtime.adapters.registered import HOST_ADAPTERS, host_adapter
from kruntimes.runtime.errors import InvalidRequest
from tests.api.builders import spec_data

ROOT = Path(__file__).resolve().parents[2]
NAMES = list(ADAPTERS)
# Where an adapter's own behaviour is written; everywhere else asks the adapter object.
ADAPTER_MODULES = (ROOT / "kruntimes" / "api" / "adapters.py", ROOT / "runtime" / "adapters")
PACKAGE_FOLDERS = ("kruntimes", "workflows", "activities", "workers", "gateway", "runtime", "krm")


def test_every_adapter_is_registered_under_its_own_name():
    assert NAMES and all(adapter.name == name for name, adapter in ADAPTERS.items())


def test_the_helm_values_schema_offers_exactly_the_registered_adapters():
    schema = json.loads((ROOT / "helm" / "kruntimes" / "values.schema.json").read_text())
    adapter = schema["properties"]["runtimes"]["items"]["properties"]["adapter"]
    assert adapter == {"type": "string", "enum": NAMES}


def test_the_config_model_schema_offers_exactly_the_registered_adapters():
    assert RuntimeConfig.model_json_schema()["properties"]["adapter"]["enum"] == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_the_config_model_takes_every_registered_adapter(name):
    (runtime,) = parse_config({"runtimes": [{"name": "fn", "adapter": name}]}).runtimes
    assert runtime.adapter == name


def test_the_config_model_refuses_an_unknown_adapter_naming_the_known_ones():
    with pytest.raises(PlatformConfigError) as e:
        parse_config({"runtimes": [{"name": "fn", "adapter": "ruby"}]})
    (problem,) = e.value.problems
    assert problem.startswith("runtimes.0.adapter: ")
    assert all(repr(name) in problem for name in NAMES), problem


def test_the_api_refuses_an_unknown_adapter_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown handler adapter 'ruby'") as e:
        validate_handler("ruby", "main.rb")
    assert str(e.value).endswith("known: " + ", ".join(sorted(NAMES)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("handler", ["main:handle", "main.sh", "/bin/fn --flag", "bin/", "a:b:c", "'"])
def test_a_run_of_a_runtime_named_after_an_adapter_takes_the_handlers_its_adapter_takes(name, handler):
    try:
        ADAPTERS[name].validate_handler(handler)
        adapter_takes = True
    except ValueError:
        adapter_takes = False
    try:
        RunSpec.model_validate(spec_data(runtime=name, handler=handler))
        run_takes = True
    except ValidationError:
        run_takes = False
    assert run_takes == adapter_takes


def test_the_runtime_server_has_a_host_side_for_every_adapter_and_no_other():
    assert list(HOST_ADAPTERS) == NAMES
    assert all(HOST_ADAPTERS[name].described is ADAPTERS[name] for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_host_adapter_is_warm_exactly_when_its_description_says_so(name):
    assert host_adapter(name).warm is ADAPTERS[name].warm


def test_the_runtime_server_refuses_an_adapter_it_does_not_have_naming_those_it_has():
    with pytest.raises(InvalidRequest, match="this host has no adapter 'ruby'; it has: ") as e:
        host_adapter("ruby")
    assert all(name in str(e.value) for name in NAMES)


def _sources() -> Iterator[Path]:
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):  # rglob does not follow the symlinks
            if not any(path == own or own in path.parents for own in ADAPTER_MODULES):
                yield path


def _names_an_adapter(node: ast.expr) -> bool:
    """`adapter`, `config.adapter`, `reg.config.adapter`, ...: a value that holds an adapter's name."""
    return (isinstance(node, ast.Name) and node.id == "adapter") or (
        isinstance(node, ast.Attribute) and node.attr == "adapter"
    )


def _adapter_branches(path: Path) -> Iterator[str]:
    """Comparisons of an adapter's name: `config.adapter == "bash"`, `adapter != krm.ADAPTER`,
    `adapter in ("bash", "krm")`."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Compare)
            and any(_names_an_adapter(o) for o in [node.left, *node.comparators])
            and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops)
        ):
            yield f"{path.relative_to(ROOT)}:{node.lineno}"


def test_no_module_outside_the_adapters_branches_on_an_adapter_name():
    branches = [where for path in _sources() for where in _adapter_branches(path)]
    assert branches == []
