"""What the chart's NOTES and docs/kubernetes.md's "Install on Kubernetes" tell a user is true:
its `helm install` command lines, with only the values they set, render and lint cleanly; the
commands NOTES prints are valid shell, reach the worker's Temporal namespace with its codec keys
through the client's own configuration loader, parse with the real `krt` parser, and invoke the
URL a Run's endpoint carries."""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest

from kruntimes.cli.parser import parse as parse_krt
from kruntimes.contracts.names import invoke_url
from kruntimes.runtime.discovery import split_target
from kruntimes.sdk import config as clientconfig
from kruntimes.temporal import connect as temporal
from kruntimes.temporal.codec import Keyring
from kruntimes.workers import host as host_main
from kruntimes.workers import worker as worker_main
from tests.helm.conftest import CHART, NAMESPACE, RELEASE, ROOT, Rendered, claimed_versions, pod_spec, render
from tests.helm.host_pods import built_pods

KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
SHELL_TIMEOUT_S = 30.0


def install_section() -> str:
    text = KUBERNETES_DOC.read_text()
    match = re.search(r"^## Install on Kubernetes\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, 'docs/kubernetes.md has no "Install on Kubernetes" section'
    return match.group(1)


def shell_blocks(text: str) -> list[str]:
    """The ```sh blocks, continuation lines joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def set_value(values: dict[str, Any], assignment: str) -> None:
    """One `--set a.b=c` the way Helm reads it: true/false are booleans, digits an integer."""
    path, _, raw = assignment.partition("=")
    value: Any = {"true": True, "false": False}.get(raw, int(raw) if raw.isdigit() else raw)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def documented_installs() -> list[tuple[str, str, dict[str, Any]]]:
    """Each `helm install RELEASE CHART -n NAMESPACE --set ...` of the section: release,
    namespace, values."""
    installs = []
    for block in shell_blocks(install_section()):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] != ["helm", "install"]:
                continue
            release, chart = words[2], words[3]
            assert ROOT / chart == CHART, chart
            namespace = words[words.index("-n") + 1]
            values: dict[str, Any] = {}
            for i, word in enumerate(words):
                if word == "--set":
                    set_value(values, words[i + 1])
            installs.append((release, namespace, values))
    return installs


def test_the_documented_installs_render_and_lint_with_only_the_values_they_set() -> None:
    installs = documented_installs()
    assert len(installs) >= 2  # with cert-manager, and without
    for release, namespace, values in installs:
        assert (release, namespace) == (RELEASE, NAMESPACE)  # the names the tests render with
        for version in claimed_versions():
            result = helm_python.lint(
                str(CHART), values, strict=True, namespace=namespace, kube_version=version
            )
            assert result["errors"] == [] and result["messages"] == [], (values, version, result)
        docs, _ = render(values)
        chart = Rendered("docs", values, docs, "")
        image = chart.container("Deployment", "-worker")["image"]
        assert image.startswith(values["image"]["repository"] + ":")
        args = worker_main.parse_args([str(a) for a in chart.container("Deployment", "-worker")["args"]])
        assert temporal.settings_from(args, env={}).address == values["temporal"]["address"]


def test_the_docs_name_the_objects_and_flags_the_chart_renders() -> None:
    section = install_section()
    _, _, values = documented_installs()[0]
    docs, _ = render(values)
    chart = Rendered("docs", values, docs, "")
    args = worker_main.parse_args([str(a) for a in chart.container("Deployment", "-worker")["args"]])
    (heartbeat,) = args.gateway_heartbeat
    said = re.search(r"`--gateway (dns\+all://\S+)`", section)
    assert said, "docs/kubernetes.md shows the hosts' --gateway"
    shown = said.group(1).replace("<release>", RELEASE).replace("<namespace>", NAMESPACE)
    assert shown == heartbeat and split_target(shown)
    resolve = re.search(r"`krt host (--gateway-resolve-interval)`", section)
    assert resolve, "docs/kubernetes.md names the hosts' re-resolve flag"
    (pod, *_) = built_pods(chart)
    host_args = [
        a.replace("$(KRT_POD_UID)", "00000000-0000-4000-8000-000000000000")
        for a in pod["spec"]["containers"][0]["args"]
    ]
    assert host_main.parse_args([*host_args, resolve.group(1), "10"]).gateway_resolve_interval == 10
    # the invoke example: the gateway Service's URL and the gateway's path, the uid a variable
    # of its own ($UID is the shell's user id)
    curl = next(b for b in shell_blocks(section) if "curl " in b)
    url = next(w for w in shlex.split(curl, comments=True) if w.startswith("https://"))
    service = chart.one("Service", "-gateway")["metadata"]["name"]
    gateway_url = f"https://{service}.{NAMESPACE}.svc"
    assert args.gateway_url == gateway_url
    variable = re.search(r"/functions/\$(\w+):invoke$", url)
    assert variable and variable.group(1) != "UID", url
    assert url == invoke_url(
        gateway_url, namespace="default", runtime="python", run_uid=f"${variable.group(1)}"
    )
    assert "kruntimes-invoker" in curl and "/var/run/secrets/kubernetes.io/serviceaccount/token" in curl
    # from outside the cluster through a port-forward: the same URL, connected to the forwarded port
    forward = next(b for b in shell_blocks(section) if "port-forward" in b)
    words = shlex.split(forward.replace("&", " "), comments=True)
    assert f"svc/{service}" in words and words[words.index("-n") + 1] == NAMESPACE
    local, remote = next(w for w in words if re.fullmatch(r"\d+:\d+", w)).split(":")
    service_port = chart.one("Service", "-gateway")["spec"]["ports"][0]["port"]
    assert int(remote) == service_port == 443
    assert words[words.index("--connect-to") + 1] == f"{service}.{NAMESPACE}.svc:443:127.0.0.1:{local}"
    assert next(w for w in words if w.startswith("https://")) == url


# --- NOTES ------------------------------------------------------------------------------------------


def notes_commands(notes: str) -> list[str]:
    """The command lines NOTES shows (indented five spaces), continuation lines joined."""
    commands: list[str] = []
    pending = ""
    for line in notes.splitlines():
        if not line.startswith("     "):
            continue
        text = line[5:]
        if text.endswith("\\"):
            pending += text[:-1]
            continue
        commands.append(pending + text)
        pending = ""
    assert not pending
    return commands


def fake_kubectl(directory: Path, *, namespace: str, secret: dict[str, Any]) -> Path:
    """A `kubectl` that answers `get secret -n NAMESPACE NAME -o go-template=...` as kubectl
    would for that template: a line `key base64` for each key of the Secret."""
    name = secret["metadata"]["name"]
    lines = "".join(f"{k} {v}\n" for k, v in sorted(secret["data"].items()))
    script = directory / "kubectl"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1 $2 $3 $4 $5" = "get secret -n {namespace} {name}" ] || exit 3\n'
        f"printf '%s' {shlex.quote(lines)}\n"
    )
    script.chmod(0o755)
    return directory


def test_notes_tell_how_to_create_and_invoke_a_run(chart: Rendered, tmp_path: Path) -> None:
    commands = notes_commands(chart.notes)
    syntax = subprocess.run(
        ["bash", "-n"], input="\n".join(commands), capture_output=True, text=True, timeout=SHELL_TIMEOUT_S
    )
    assert syntax.returncode == 0, syntax.stderr

    # 1. the client reaches the worker's Temporal namespace, with the worker's codec keys
    env: dict[str, str] = {"KRT_STATE_DIR": str(tmp_path / "state")}
    for command in commands:
        if command.startswith("export ") and "$" not in command:
            for assignment in shlex.split(command)[1:]:
                key, _, value = assignment.partition("=")
                env[key] = value
    assert set(env) - {"KRT_STATE_DIR"} <= set(clientconfig.ENV.values())
    client = clientconfig.load(env).temporal_settings()
    worker = temporal.settings_from(
        worker_main.parse_args([str(a) for a in chart.container("Deployment", "-worker")["args"]]), env={}
    )
    assert (client.address, client.namespace) == (worker.address, worker.namespace)
    assert client.uses_tls == worker.uses_tls
    if worker.uses_tls:
        assert client.tlsServerName == (worker.tlsServerName or worker.address.rpartition(":")[0])
    for field in ("tlsCa", "tlsCert", "tlsKey", "apiKeyFile"):
        assert (getattr(client, field) is None) == (getattr(worker, field) is None), field

    volumes = pod_spec(chart.one("Deployment", "-worker"))["volumes"]
    codec_secret = next(v for v in volumes if v["name"] == "codec-keys")["secret"]["secretName"]
    (fetch,) = [c for c in commands if "codec-keys" in c and "kubectl" in c]
    assert f"kubectl get secret -n {NAMESPACE} {codec_secret} " in fetch
    if not chart.values.get("codec", {}).get("existingSecret"):  # the chart's own Secret: run it
        bin_dir = fake_kubectl(tmp_path, namespace=NAMESPACE, secret=chart.one("Secret", "-codec-keys"))
        ran = subprocess.run(
            ["bash", "-c", fetch],
            cwd=tmp_path,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
        )
        assert ran.returncode == 0, ran.stderr
        data = chart.one("Secret", "-codec-keys")["data"]
        mounted = {k: base64.b64decode(base64.b64decode(v)) for k, v in data.items()}
        assert Keyring.load(tmp_path / "codec-keys").keys == mounted

    (create,) = [shlex.split(c) for c in commands if c.startswith("krt run create ")]
    parsed = parse_krt(create[1:])
    runtimes = [r["name"] for r in chart.values.get("runtimes", [{"name": "python"}, {"name": "bash"}])]
    assert parsed.runtime in runtimes

    # 2. the role the gateway's access review asks for, 3. the URL of the Run's endpoint
    (binding,) = [shlex.split(c) for c in commands if c.startswith("kubectl create rolebinding ")]
    assert binding[binding.index("--clusterrole") + 1] == "kruntimes-invoker"
    (curl,) = [shlex.split(c) for c in commands if c.startswith("curl ")]
    (url,) = [w for w in curl if w.startswith("https://")]
    base = worker_main.parse_args(
        [str(a) for a in chart.container("Deployment", "-worker")["args"]]
    ).gateway_url
    assert url == invoke_url(base, namespace="default", runtime=parsed.runtime, run_uid="RUN_UID")
    assert "TOKEN=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)" in commands


@pytest.mark.parametrize("port", [443, 8443])
def test_the_notes_url_keeps_the_services_port(port: int) -> None:
    _, notes = render({"gateway": {"service": {"port": port}}})
    suffix = "" if port == 443 else f":{port}"
    assert f"https://krt-kruntimes-gateway.{NAMESPACE}.svc{suffix}/v1/namespaces/" in notes
