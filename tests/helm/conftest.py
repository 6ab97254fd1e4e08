"""The chart rendered with embedded Helm (helm-python-sdk, no helm binary): the default values
and each helm/kruntimes/ci/*-values.yaml, once per test session."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kruntimes"
RELEASE, NAMESPACE = "krt", "kruntimes"
CASES = {"default": {}} | {
    path.name.removesuffix("-values.yaml"): yaml.safe_load(path.read_text())
    for path in sorted((CHART / "ci").glob("*-values.yaml"))
}


@dataclass(frozen=True)
class Rendered:
    case: str
    values: dict[str, Any]
    docs: list[dict[str, Any]]
    notes: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, suffix: str) -> dict[str, Any]:
        found = [d for d in self.of(kind) if d["metadata"]["name"].endswith(suffix)]
        assert len(found) == 1, f"{self.case}: {kind} *{suffix}: {len(found)} found"
        return found[0]

    def container(self, kind: str, suffix: str) -> dict[str, Any]:
        return pod_spec(self.one(kind, suffix))["containers"][0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment, StatefulSet, Job or CronJob."""
    template = workload["spec"]["jobTemplate"] if workload["kind"] == "CronJob" else workload
    spec: dict[str, Any] = template["spec"]["template"]["spec"]
    return spec


def args_of(container: dict[str, Any]) -> list[str]:
    """A container's args, each as a string."""
    return [str(a) for a in container["args"]]


def worker_args(chart: Rendered) -> list[str]:
    """The args of the worker Deployment's `krt worker`."""
    container = chart.container("Deployment", "-worker")
    assert container["command"] == ["krt", "worker"]
    return args_of(container)


def runtimes_file(chart: Rendered) -> str:
    """The runtimes.yaml the runtimes ConfigMap holds."""
    text: str = chart.one("ConfigMap", "-runtimes")["data"]["runtimes.yaml"]
    return text


def render(values: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    chart = helm_python.Chart.load(str(CHART))
    try:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    docs = [
        doc
        for name, text in sorted(files.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    notes = next((text for name, text in files.items() if name.endswith("NOTES.txt")), "")
    return docs, notes


@cache
def rendered(case: str) -> Rendered:
    docs, notes = render(CASES[case])
    return Rendered(case, CASES[case], docs, notes)


def chart_metadata() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return data


def claimed_versions() -> tuple[str, str]:
    """The oldest and newest Kubernetes minor the chart's kubeVersion admits, as x.y.0."""
    constraint = chart_metadata()["kubeVersion"]
    low = re.search(r">=\s*1\.(\d+)", constraint)
    high = re.search(r"<\s*1\.(\d+)", constraint)
    assert low and high, f"kubeVersion {constraint!r} names no range"
    return f"1.{low.group(1)}.0", f"1.{int(high.group(1)) - 1}.0"


@pytest.fixture(params=sorted(CASES))
def chart(request: pytest.FixtureRequest) -> Rendered:
    return rendered(request.param)
