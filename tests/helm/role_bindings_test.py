"""The hosts' role bindings (hosts.roleBindings): every host pod the provider builds from the chart
mounts them read-only where its `krt host --role-bindings` reads them, from a ConfigMap of the
pod's own namespace (or the Secret named instead: the embedded gateway's), and the host's own
reader, given the file as the kubelet writes it, grants exactly what the values say."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import yaml

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.runtime.secret_access import BindingsFile
from kruntimes.workers import host as host_main
from tests.helm.conftest import RELEASE, ROOT, Rendered, render, runtimes_file
from tests.helm.host_pods import built_pods

POD_UID = "00000000-0000-4000-8000-000000000000"


def host_args(pod: dict[str, Any]) -> argparse.Namespace:
    """The pod's `krt host` args, parsed by `krt host` (the pod's uid filled in)."""
    args = [a.replace("$(KRT_POD_UID)", POD_UID) for a in pod["spec"]["containers"][0]["args"]]
    return host_main.parse_args(args)


def mounted(pod: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The innermost mount of the host container holding `path`, and its volume."""
    container = pod["spec"]["containers"][0]
    holding = [m for m in container["volumeMounts"] if str(path).startswith(m["mountPath"].rstrip("/") + "/")]
    assert holding, f"{pod['metadata']['name']}: nothing mounted at {path}"
    mount = max(holding, key=lambda m: len(m["mountPath"]))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def runs_as_root(pod: dict[str, Any]) -> bool:
    container = pod["spec"]["containers"][0]
    user = (container.get("securityContext") or {}).get("runAsUser")
    if user is None:
        user = (pod["spec"].get("securityContext") or {}).get("runAsUser")
    return user == 0


def as_the_kubelet_writes_it(directory: Path, text: str, mode: int) -> BindingsFile:
    """The file the host reads (a root-owned file of the volume's mode) through the host's reader."""
    path = directory / "rolebindings.yaml"
    path.write_text(text)
    path.chmod(mode)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    return BindingsFile(path)


def test_every_host_pod_mounts_its_namespaces_role_bindings_where_the_host_reads_them(
    chart: Rendered, tmp_path: Path
) -> None:
    configmaps = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in chart.of("ConfigMap")}
    wanted = ((chart.values.get("hosts") or {}).get("roleBindings") or {}).get("bindings") or []
    for i, pod in enumerate(built_pods(chart)):
        name = pod["metadata"]["name"]
        path = host_args(pod).role_bindings
        assert path == Path(pods.ROLE_BINDINGS_FILE), name
        mount, volume = mounted(pod, path)
        assert mount["readOnly"] is True, name
        source = volume["configMap"]
        assert source["items"] == [{"key": "rolebindings.yaml", "path": path.name}], name
        # a root host's functions are other uids: theirs to read only where they share its user
        assert source["defaultMode"] == (0o400 if runs_as_root(pod) else 0o444), name
        # a pod mounts ConfigMaps of its own namespace: there is one in each hosts namespace
        configmap = configmaps[(pod["metadata"]["namespace"], source["name"])]
        directory = tmp_path / str(i)
        directory.mkdir()
        read = as_the_kubelet_writes_it(
            directory, configmap["data"]["rolebindings.yaml"], source["defaultMode"]
        )
        bindings = read.current()
        assert not bindings.may_use_secret("someone-else", "team-a", "db"), name
        assert not bindings.may_use_secret("admin", "default", "db"), "nobody is bound by default"
        for binding in wanted:
            namespace = "elsewhere" if binding["namespace"] == "*" else binding["namespace"]
            for user in binding["users"]:
                for secret in binding.get("secrets", ["any-secret"]):
                    assert bindings.may_use_secret(user, namespace, secret), (name, binding)
                if "secrets" in binding:
                    assert not bindings.may_use_secret(user, namespace, "not-named"), (name, binding)


def test_hosts_may_read_the_embedded_gateways_bindings_and_a_runtime_its_own() -> None:
    """hosts.roleBindings.secretName: the Secret's role-bindings.yaml, the key the embedded gateway
    reads, and only that key (not the token file); no ConfigMap. A runtime's own `role-bindings`
    volume replaces the chart's."""
    values = {
        "gateway": {"auth": {"method": "embedded", "embedded": {"secretName": "krt-auth"}}},
        "hosts": {"roleBindings": {"secretName": "krt-auth"}},
        "runtimes": [
            {"name": "python", "adapter": "python"},
            {
                "name": "own",
                "adapter": "python",
                "kubernetes": {
                    "podTemplate": {
                        "volumes": [{"name": "role-bindings", "configMap": {"name": "own-bindings"}}]
                    }
                },
            },
        ],
    }
    docs, _ = render(values)
    chart = Rendered("embedded-bindings", values, docs, "")
    assert not [c for c in chart.of("ConfigMap") if c["metadata"]["name"].endswith("-host-role-bindings")]
    gateway_keys = {
        item["key"]
        for v in chart.one("Deployment", "-gateway")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "auth-secret"
        for item in v["secret"]["items"]
    }
    config = yaml.safe_load(runtimes_file(chart))
    assert {r["name"] for r in config["runtimes"]} == {"python", "own"}
    python, own = sorted(
        built_pods(chart), key=lambda p: p["metadata"]["labels"][pods.LABEL_RUNTIME] != "python"
    )
    path = host_args(python).role_bindings
    _, volume = mounted(python, path)
    assert volume["secret"]["secretName"] == "krt-auth"
    [item] = volume["secret"]["items"]
    assert item == {"key": "role-bindings.yaml", "path": path.name} and item["key"] in gateway_keys
    mount, volume = mounted(own, host_args(own).role_bindings)
    assert volume == {"name": "role-bindings", "configMap": {"name": "own-bindings"}}
    assert mount["readOnly"] is True


def test_the_documented_secret_and_bindings_reach_the_host_where_it_reads_them(tmp_path: Path) -> None:
    """docs/kubernetes.md "Secrets for Runs": its values mount the Secret where the host of the
    pod looks for the Run's namespace's secret, and bind its creator to it; the ConfigMap and the
    flag are named as the chart names them."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    section = text.split("### Secrets for Runs\n", 1)[1].split("\n### ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    values = yaml.safe_load(block)
    docs, _ = render(values)
    chart = Rendered("documented-secrets", values, docs, "")
    [pod] = [p for p in built_pods(chart) if p["metadata"]["labels"][pods.LABEL_RUNTIME] == "python"]
    args = host_args(pod)
    mount, volume = mounted(pod, args.state_dir / "secrets" / "team-a" / "db" / "KEY")
    assert mount["mountPath"] == str(args.state_dir / "secrets" / "team-a" / "db") and mount["readOnly"]
    assert volume["secret"] == {"secretName": "team-a-db", "defaultMode": 0o400}
    _, bindings_volume = mounted(pod, args.role_bindings)
    name = bindings_volume["configMap"]["name"]
    assert f"`{name.replace(RELEASE + '-', '<release>-', 1)}`" in section
    assert f"`krt host --role-bindings {args.role_bindings}`" in section.replace("\n", " ")
    [configmap] = [c for c in chart.of("ConfigMap") if c["metadata"]["name"] == name]
    read = as_the_kubelet_writes_it(tmp_path, configmap["data"]["rolebindings.yaml"], 0o400).current()
    assert read.may_use_secret("team-a-ci", "team-a", "db")
    assert not read.may_use_secret("team-a-ci", "team-b", "db") and not read.may_use_secret(
        "x", "team-a", "db"
    )
