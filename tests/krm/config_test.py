"""The FunctionConfig kind and the store's binary lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from kruntimes.krm import config as fc
from kruntimes.krm import errors
from kruntimes.krm.store import Store
from tests.krm.conftest import function_config


def test_a_valid_function_config_parses_with_its_pod_executor() -> None:
    document = function_config(
        "set-labels", prefixes=["ghcr.io/fn/set-labels"], path="set-labels", tags=["^0.2"]
    )
    document["spec"]["podExecutor"] = {
        "tags": ["v0.2.1"],
        "ttl": "1h30m",
        "maxParallel": 3,
        "maxWaitlist": 2,
        "source": {"path": "/fns/set-labels", "entrypoint": ["python", "main.py"]},
    }
    config = fc.parse(document, source="f.yaml")
    assert config.spec.podExecutor is not None
    assert config.spec.podExecutor.ttl == 5400
    assert config.spec.podExecutor.maxParallel == 3
    assert config.key == "set-labels"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["spec"]["binaryExecutor"].update(tags=["not a version!"]), "spec.binaryExecutor.tags"),
        (lambda d: d["spec"]["binaryExecutor"].update(tags=[]), "spec.binaryExecutor.tags"),
        (lambda d: d["spec"]["binaryExecutor"].pop("path"), "spec.binaryExecutor.path"),
        (lambda d: d["spec"].update(prefixes=["ghcr.io/fn:v1"]), "spec.prefixes"),
        (lambda d: d["spec"].update(prefixes=[]), "spec.prefixes"),
        (lambda d: d["spec"].update(binaryExcutor={}), "spec.binaryExcutor"),
        (lambda d: d["spec"].update(podExecutor={"ttl": "soon"}), "spec.podExecutor.ttl"),
        (lambda d: d["spec"].update(podExecutor={"maxParallel": 0}), "spec.podExecutor.maxParallel"),
        (
            lambda d: d["spec"].update(podExecutor={"source": {"entrypoint": ["x"]}}),
            "spec.podExecutor.source",
        ),
        (lambda d: d.update(kind="Function"), "kind"),
        (lambda d: d["metadata"].update(name="Not_A_Name"), "metadata.name"),
    ],
)
def test_an_invalid_function_config_is_refused_naming_the_field(change, named: str) -> None:
    document = function_config("fn", prefixes=["ghcr.io/fn"], path="fn", tags=["1.x"])
    change(document)
    with pytest.raises(fc.FunctionConfigError) as caught:
        fc.parse(document, source="configs/fn.yaml")
    assert str(caught.value).startswith("configs/fn.yaml: ")
    assert named in str(caught.value)


def store_of(functions: Path | None, path: str) -> Store:
    store = Store(functions_dir=functions)
    store.put(
        "test", fc.parse(function_config("fn", prefixes=["ghcr.io/fn"], path=path, tags=["1.x"]), source="t")
    )
    return store


def test_a_relative_binary_path_is_taken_from_the_functions_directory(tmp_path: Path) -> None:
    binary = store_of(tmp_path, "sub/fn").binary("ghcr.io/fn:1.2.0", "")
    assert binary.path == tmp_path.resolve() / "sub" / "fn"
    assert (binary.config, binary.tag) == ("fn", "1.2.0")


def test_an_absolute_binary_path_is_used_as_it_is(tmp_path: Path) -> None:
    assert store_of(None, "/opt/fn").binary("ghcr.io/fn:1.2.0", "").path == Path("/opt/fn")


def test_a_relative_path_leaving_the_functions_directory_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="leaves the functions directory"):
        store_of(tmp_path, "../elsewhere/fn").binary("ghcr.io/fn:1.2.0", "")


def test_a_relative_path_without_a_functions_directory_is_not_found() -> None:
    with pytest.raises(errors.NotFound, match="no functions directory"):
        store_of(None, "fn").binary("ghcr.io/fn:1.2.0", "")


def test_an_image_no_config_names_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="no FunctionConfig"):
        store_of(tmp_path, "fn").binary("ghcr.io/other:1.2.0", "")


def test_the_requested_tag_wins_over_the_images_tag(tmp_path: Path) -> None:
    store = store_of(tmp_path, "fn")
    with pytest.raises(errors.NotFound):
        store.binary("ghcr.io/fn:1.2.0", "2.0.0")
    assert store.binary("ghcr.io/fn:2.0.0", "1.0.0").tag == "1.0.0"


SOURCE = {"inline": [{"name": "main.py", "content": "pass"}], "entrypoint": ["python", "main.py"]}


@pytest.mark.parametrize(
    ("executor", "problem"),
    [
        ({"entrypoint": ["/usr/local/bin/fn"], "source": SOURCE}, "not both"),
        ({"entrypoint": ["fn"]}, "must be an absolute path"),
        ({"entrypoint": ["/fn"], "runtime": "Not_A_Label"}, "spec.podExecutor.runtime"),
        ({"maxConcurrentEvaluations": 0}, "spec.podExecutor.maxConcurrentEvaluations"),
    ],
)
def test_a_pod_executor_names_one_program_and_a_runtime_label(executor: dict, problem: str) -> None:
    document = function_config("fn", prefixes=["ghcr.io/fn/x"], path="x", tags=["*"])
    document["spec"]["podExecutor"] = executor
    with pytest.raises(fc.FunctionConfigError) as caught:
        fc.parse(document, source="f.yaml")
    assert problem in str(caught.value)


def test_the_store_serves_a_cluster_mode_pod_executor() -> None:
    document = function_config("fn", prefixes=["ghcr.io/fn/x"], path="x", tags=["*"])
    document["spec"]["podExecutor"] = {"tags": ["v1.0.0"], "entrypoint": ["/fn"], "runtime": "krm-x"}
    store = Store()
    store.put("test", fc.parse(document, source="f.yaml"))
    target = store.pod("ghcr.io/fn/x:v1.0.0", "")
    assert target.executor.entrypoint == ["/fn"] and target.executor.runtime == "krm-x"
    document["spec"]["podExecutor"] = {"tags": ["v1.0.0"]}  # nothing to run
    store.put("test", fc.parse(document, source="f.yaml"))
    with pytest.raises(errors.NotFound):
        store.pod("ghcr.io/fn/x:v1.0.0", "")


@pytest.mark.parametrize("overrides", [{"spec": {"containers": [{"name": "function"}]}}, {}, None])
def test_template_overrides_are_refused_naming_the_field_and_where_pods_are_set(overrides: object) -> None:
    """A per-function pod override would be silently ignored (a function's pods are its runtime's
    hosts): the FunctionConfig is refused instead, saying where a function's pods are set."""
    document = function_config("fn", prefixes=["ghcr.io/fn"], path="fn", tags=["1.x"])
    document["spec"]["podExecutor"] = {
        "templateOverrides": overrides,
        "source": {"path": "/f", "entrypoint": ["x"]},
    }
    with pytest.raises(fc.FunctionConfigError) as caught:
        fc.parse(document, source="configs/fn.yaml")
    assert "spec.podExecutor.templateOverrides: Value error, not supported" in str(caught.value)
    assert "kubernetes.podTemplate" in str(caught.value) and "podExecutor.runtime" in str(caught.value)
