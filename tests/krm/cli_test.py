"""`krt fn eval` on package directories and stdin, in-process and through the `krt` command."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from kruntimes.krm.package import INDEX, INTERNAL_INDEX, INTERNAL_PATH, PATH
from kruntimes.krm.resources import dump, dump_all, load, load_all, resource_list
from kruntimes.workers import fn_eval as cli
from tests.krm.conftest import function_config

IMAGE = "example.com/fn/set-labels:v1.2.0"


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    directory = tmp_path / "configs"
    directory.mkdir()
    for name in ("set-labels", "validator", "exit-1"):
        (directory / f"{name}.yaml").write_text(
            dump(function_config(name, prefixes=[f"example.com/fn/{name}"], path=name, tags=["^1.0.0"]))
        )
    return directory


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "app.yaml").write_text(
        dump_all(
            [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first"}},
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "second", "annotations": {"keep": "me"}},
                },
            ]
        )
    )
    (root / "sub" / "deploy.yml").write_text(
        dump({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
    )
    (root / ".hidden.yaml").write_text("not: [yaml")
    return root


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def common(functions: Path, configs: Path) -> list[str]:
    return ["--functions", str(functions), "--fn-configs", str(configs)]


def test_a_directory_is_evaluated_and_written_back_in_place(functions, configs, package) -> None:
    code, _, err = run(str(package), "--image", IMAGE, *common(functions, configs), "--", "app=web", "tier=1")
    assert code == 0, err
    assert "[PASS]" in err
    first, second = load_all((package / "app.yaml").read_text())
    assert (first["metadata"]["name"], second["metadata"]["name"]) == ("first", "second")
    assert first["metadata"]["labels"] == {"app": "web", "tier": "1"}
    assert second["metadata"]["annotations"] == {"keep": "me"}, "only the location annotations are removed"
    assert "annotations" not in first["metadata"]
    assert load((package / "sub" / "deploy.yml").read_text())["metadata"]["labels"]["app"] == "web"
    assert (package / ".hidden.yaml").read_text() == "not: [yaml", "hidden files are left alone"


def test_the_function_sees_the_file_annotations_in_both_forms(functions, configs, package) -> None:
    code, out, err = run(str(package), "--exec", str(functions / "echo"), "-o", "stdout")
    assert code == 0, err
    items = load(out)["items"]
    located = [(i["metadata"]["annotations"][PATH], i["metadata"]["annotations"][INDEX]) for i in items]
    assert located == [("app.yaml", "0"), ("app.yaml", "1"), ("sub/deploy.yml", "0")]
    for item in items:
        annotations = item["metadata"]["annotations"]
        assert (annotations[INTERNAL_PATH], annotations[INTERNAL_INDEX]) == (
            annotations[PATH],
            annotations[INDEX],
        )


def test_output_to_another_directory_keeps_the_layout(functions, configs, package, tmp_path) -> None:
    before = (package / "app.yaml").read_text()
    target = tmp_path / "out"
    code, _, err = run(
        str(package), "--image", IMAGE, *common(functions, configs), "-o", str(target), "--", "a=b"
    )
    assert code == 0, err
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*.y*ml")) == [
        "app.yaml",
        "sub/deploy.yml",
    ]
    assert (package / "app.yaml").read_text() == before


def test_unwrap_prints_the_resources_without_location_annotations(functions, configs, package) -> None:
    code, out, _ = run(
        str(package), "--image", IMAGE, *common(functions, configs), "-o", "unwrap", "--", "a=b"
    )
    assert code == 0
    documents = load_all(out)
    assert [d["metadata"]["name"] for d in documents] == ["first", "second", "d"]
    assert all(PATH not in (d["metadata"].get("annotations") or {}) for d in documents)


def test_stdin_takes_a_resource_list_and_prints_one(functions, configs) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fc"}, "data": {"x": "y"}}
    text = resource_list(
        [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}], function_config=config
    )
    code, out, _ = run("-", "--image", IMAGE, *common(functions, configs), stdin=text.decode())
    assert code == 0
    assert load(out)["items"][0]["metadata"]["labels"] == {"x": "y"}


def test_fn_config_file_is_the_function_config(functions, configs, package, tmp_path) -> None:
    fn_config = tmp_path / "fn-config.yaml"
    fn_config.write_text(
        dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}})
    )
    code, _, err = run(
        str(package), "--image", IMAGE, *common(functions, configs), "--fn-config", str(fn_config)
    )
    assert code == 0, err
    assert load_all((package / "app.yaml").read_text())[0]["metadata"]["labels"] == {"k": "v"}


def test_a_failing_validator_writes_its_results_and_leaves_the_package_alone(
    functions, configs, package, tmp_path
) -> None:
    before = (package / "app.yaml").read_text()
    results = tmp_path / "results"
    code, _, err = run(
        str(package),
        "--image",
        "example.com/fn/validator:v1.0.0",
        *common(functions, configs),
        "--results-dir",
        str(results),
    )
    assert code == cli.FAILED
    assert "[FAIL]" in err and "every resource needs an owner label" in err
    assert (package / "app.yaml").read_text() == before
    document = load((results / cli.RESULTS_FILE).read_text())
    assert (document["kind"], document["exitCode"]) == ("FunctionResultList", 1)
    (entry,) = document["items"]
    assert entry["image"] == "example.com/fn/validator:v1.0.0" and entry["exitCode"] == 1
    assert entry["stderr"] == "validation failed\n"
    files = sorted((r["file"]["path"], r["file"]["index"]) for r in entry["results"])
    assert files == [("app.yaml", 0), ("app.yaml", 1), ("sub/deploy.yml", 0)]
    assert {r["resourceRef"]["name"] for r in entry["results"]} == {"first", "second", "d"}


def test_a_successful_run_writes_exit_code_zero(functions, configs, package, tmp_path) -> None:
    code, _, _ = run(
        str(package), "--image", IMAGE, *common(functions, configs), "--results-dir", str(tmp_path / "r")
    )
    assert code == 0
    assert load((tmp_path / "r" / cli.RESULTS_FILE).read_text())["exitCode"] == 0


def test_an_image_no_evaluator_has_exits_not_found(functions, configs, package) -> None:
    code, _, err = run(str(package), "--image", "example.com/fn/unknown:v1.0.0", *common(functions, configs))
    assert code == cli.NOT_FOUND
    assert "the pod evaluator has no platform" in err


def test_a_timeout_ends_the_function(functions, configs, package) -> None:
    code, _, err = run(str(package), "--exec", str(functions / "sleeper"), "--timeout", "0.5")
    assert code == cli.FAILED and "DeadlineExceeded" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--image", "a:1", "--exec", "b"],
        [],
        ["--image", "a:1", "--fn-config", "f.yaml", "--", "k=v"],
        ["--image", "a:1", "--", "novalue"],
        ["--exec", "b", "--runner", "127.0.0.1:1"],
        ["/no/such/dir", "--image", "a:1"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    code, _, err = run(*argv)
    assert code == cli.USAGE and err.startswith("krt: ")


def test_krt_fn_eval_is_a_krt_command(functions, configs, package) -> None:
    krt = Path(sys.executable).with_name("krt")
    done = subprocess.run(
        [
            str(krt),
            "fn",
            "eval",
            str(package),
            "--image",
            IMAGE,
            *common(functions, configs),
            "--",
            "via=krt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert load_all((package / "app.yaml").read_text())[0]["metadata"]["labels"] == {"via": "krt"}
