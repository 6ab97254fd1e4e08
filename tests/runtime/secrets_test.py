"""envFrom: a host resolves a Run's secrets from its store when it registers the function."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import grpc
import pytest

from kruntimes.config import secret_store as secrets
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, inline, reason

ENV = "import os\ndef handle(p):\n    return {k: os.environ.get(k) for k in p}\n"


def _register(
    host: Host,
    *,
    env_from: list[tuple[str, str]],
    env: dict[str, str] | None = None,
    namespace: str = "default",
) -> pb.RegisterFunctionResponse:
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace=namespace, name="fn", runtime="python")
    config = pb.FunctionConfig(
        adapter="python",
        handler="main:handle",
        env=env or {},
        inline=inline({"main.py": ENV}),
        env_from=[pb.EnvFromSecret(secret=s, prefix=p) for s, p in env_from],
    )
    return host.stub.RegisterFunction(host.register_request(run, config))


def _state(host: Host) -> Path:
    return host.runtime.options.state_dir


def test_a_secrets_keys_become_the_functions_env_and_its_own_env_wins(host: Host) -> None:
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(
        _state(host), namespace="default", name=name, values={"PASSWORD": b"hunter2", "USER": b"app"}
    )
    reg = _register(host, env_from=[(name, ""), (name, "DB_")], env={"USER": "override"})
    answer = host.invoke(
        reg.registration_id, json.dumps(["PASSWORD", "USER", "DB_PASSWORD", "DB_USER"]).encode()
    )
    assert json.loads(answer.outputs_json) == {
        "PASSWORD": "hunter2",
        "USER": "override",
        "DB_PASSWORD": "hunter2",
        "DB_USER": "app",
    }


def test_a_secret_of_another_namespace_is_not_found(host: Host) -> None:
    name = f"only-a-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="team-a", name=name, values={"K": b"v"})
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")], namespace="team-b")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(err.value) == "SecretNotFound"
    assert "v" not in (err.value.details() or "").split()


@pytest.mark.parametrize("name", ["../../tls", "UPPER", "a/b", ".hidden", ""])
def test_a_secret_name_that_is_not_a_label_is_refused_before_it_touches_a_path(host: Host, name: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_symlinked_key_is_refused(host: Host, tmp_path: Path) -> None:
    name = f"linked-{uuid.uuid4().hex[:6]}"
    directory = secrets.create(_state(host), namespace="default", name=name, values={"OK": b"1"})
    outside = tmp_path / "shadow"
    outside.write_text("root secret")
    os.symlink(outside, directory / "LEAK")
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "root secret" not in (err.value.details() or "")


def test_the_secret_store_is_invisible_to_functions(host: Host) -> None:
    name = f"hidden-{uuid.uuid4().hex[:6]}"
    directory = secrets.create(_state(host), namespace="default", name=name, values={"K": b"secret-value"})
    reg = host.register(
        f"def handle(p):\n    try:\n        return open({str(directory / 'K')!r}).read()\n    except OSError as e:\n        return type(e).__name__\n"
    )
    assert json.loads(host.invoke(reg.registration_id).outputs_json)["result"] in (
        "FileNotFoundError",
        "PermissionError",
    )


def _secret_volume(directory: Path, values: dict[str, bytes]) -> None:
    """The layout the kubelet writes for a Secret volume: KEY -> ..data/KEY, ..data -> ..timestamp."""
    stamped = directory / "..2024_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True, mode=0o700)
    for key, value in values.items():
        (stamped / key).write_bytes(value)
        os.symlink(f"..data/{key}", directory / key)
    os.symlink(stamped.name, directory / "..data")


def test_a_kubernetes_secret_volume_layout_is_read_through_its_links(host: Host) -> None:
    name = f"volume-{uuid.uuid4().hex[:6]}"
    _secret_volume(_state(host) / "secrets" / "default" / name, {"PASSWORD": b"from-a-volume"})
    reg = _register(host, env_from=[(name, "")])
    answer = host.invoke(reg.registration_id, json.dumps(["PASSWORD"]).encode())
    assert json.loads(answer.outputs_json) == {"PASSWORD": "from-a-volume"}


@pytest.mark.parametrize("target", ["../other/K", "..data/../../other/K"])
def test_a_relative_link_out_of_the_secrets_directory_is_refused(host: Host, target: str) -> None:
    name = f"escape-{uuid.uuid4().hex[:6]}"
    namespace_dir = _state(host) / "secrets" / "default"
    secrets.create(_state(host), namespace="default", name="other", values={"K": b"not-yours"})
    directory = namespace_dir / name
    _secret_volume(directory, {"OK": b"1"})
    os.symlink(target, directory / "LEAK")
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "symlink out of its secret" in (err.value.details() or "")
    assert "not-yours" not in (err.value.details() or "")


def test_a_secret_directory_linked_to_another_namespaces_secret_is_refused(host: Host) -> None:
    name = f"theirs-{uuid.uuid4().hex[:6]}"
    theirs = secrets.create(_state(host), namespace="team-a", name=name, values={"K": b"team-a-only"})
    (_state(host) / "secrets" / "team-b").mkdir(mode=0o700, exist_ok=True)
    os.symlink(theirs, _state(host) / "secrets" / "team-b" / name)
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")], namespace="team-b")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is a symlink" in (err.value.details() or "")
