"""envFrom: a host resolves a Run's secrets from its store when it registers the function, for a
Run whose creator the role bindings let use them (the host's `{state}/rolebindings.yaml`)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kruntimes.config import secret_store as secrets
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.runtime.conftest import Host, inline, reason

ENV = "import os\ndef handle(p):\n    return {k: os.environ.get(k) for k in p}\n"
OWNER = ("cli", "owner")
# the embedded platform's rule: the owner uses every namespace's secrets
OWNER_BINDINGS = "bindings:\n- namespace: '*'\n  verbs: [use-secrets]\n  users: [owner]\n"


def _register(
    host: Host,
    *,
    env_from: list[tuple[str, str]],
    env: dict[str, str] | None = None,
    namespace: str = "default",
    creator: tuple[str, str] | None = OWNER,
    uid: str | None = None,
) -> pb.RegisterFunctionResponse:
    run = pb.RunRef(
        run_uid=uid or str(uuid.uuid4()), attempt=1, namespace=namespace, name="fn", runtime="python"
    )
    config = pb.FunctionConfig(
        adapter="python",
        handler="main:handle",
        env=env or {},
        inline=inline({"main.py": ENV}),
        env_from=[pb.EnvFromSecret(secret=s, prefix=p) for s, p in env_from],
    )
    if creator is not None:
        config.creator.CopyFrom(pb.Creator(kind=creator[0], subject=creator[1]))
    return host.stub.RegisterFunction(host.register_request(run, config))


def _state(host: Host) -> Path:
    return host.runtime.options.state_dir


@pytest.fixture(autouse=True)
def bindings(host: Host) -> Iterator[Path]:
    """The host's bindings file, the owner's rule unless a test writes another (put back after)."""
    path = _state(host) / "rolebindings.yaml"
    _write(path, OWNER_BINDINGS)
    yield path
    _write(path, OWNER_BINDINGS)


def _write(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace the bindings file whole (a new inode: the host sees the change at once)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def _audits(caplog: pytest.LogCaptureFixture, run_uid: str) -> list[dict[str, object]]:
    """The audit records the host wrote about `run_uid`: each record's fields."""
    return [
        {k: getattr(r, k, None) for k in ("decision", "namespace", "secret", "creator", "why", "attempt")}
        for r in caplog.records
        if r.name == "kruntimes.audit.secrets" and getattr(r, "run_uid", None) == run_uid
    ]


def _refused(err: pytest.ExceptionInfo[grpc.RpcError]) -> str:
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert reason(err.value) == "SecretForbidden"
    return err.value.details() or ""


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


def test_a_creator_bound_to_its_namespace_gets_its_secret_and_each_use_is_audited(
    host: Host, bindings: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(bindings, "bindings:\n- namespace: team-a\n  verbs: [use-secrets]\n  users: [team-a-ci]\n")
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="team-a", name=name, values={"PASSWORD": b"team-a-pass-91"})
    uid = str(uuid.uuid4())
    reg = _register(host, env_from=[(name, "")], namespace="team-a", creator=("sdk", "team-a-ci"), uid=uid)
    answer = host.invoke(reg.registration_id, json.dumps(["PASSWORD"]).encode())
    assert json.loads(answer.outputs_json) == {"PASSWORD": "team-a-pass-91"}
    assert _audits(caplog, uid) == [
        {
            "decision": "allowed",
            "namespace": "team-a",
            "secret": name,
            "creator": "sdk:team-a-ci",
            "why": None,
            "attempt": 1,
        }
    ]
    assert "team-a-pass-91" not in caplog.text


def test_another_namespaces_secret_is_refused_with_its_reason_and_an_audit_record(
    host: Host, bindings: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack: a Run in team-b, started by team-a's identity, naming team-b's secret."""
    _write(bindings, "bindings:\n- namespace: team-a\n  verbs: [use-secrets]\n  users: [team-a-ci]\n")
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="team-b", name=name, values={"PASSWORD": b"team-b-pass-57"})
    uid = str(uuid.uuid4())
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")], namespace="team-b", creator=("sdk", "team-a-ci"), uid=uid)
    details = _refused(err)
    assert "sdk:team-a-ci" in details and repr(name) in details and "'team-b'" in details
    assert "team-b-pass-57" not in details and str(_state(host)) not in details
    [record] = _audits(caplog, uid)
    assert record["decision"] == "refused" and record["creator"] == "sdk:team-a-ci"
    assert record["namespace"] == "team-b" and record["secret"] == name
    assert "team-b-pass-57" not in caplog.text and "PASSWORD" not in caplog.text


def test_a_run_without_a_creator_gets_no_secret_even_when_the_secret_is_bound_to_everyone(
    host: Host, bindings: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="default", name=name, values={"K": b"plain-sdk-loot-3"})
    uid = str(uuid.uuid4())
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")], creator=None, uid=uid)
    assert "no creator" in _refused(err)
    assert [(r["decision"], r["creator"]) for r in _audits(caplog, uid)] == [("refused", "")]
    assert "plain-sdk-loot-3" not in caplog.text


def test_a_binding_that_names_secrets_allows_only_those(host: Host, bindings: Path) -> None:
    _write(
        bindings,
        "bindings:\n- namespace: '*'\n  verbs: [use-secrets]\n  users: [ci]\n  secrets: [db]\n",
    )
    secrets.create(_state(host), namespace="default", name="db", values={"K": b"1"})
    secrets.create(_state(host), namespace="default", name="cache", values={"K": b"2"})
    _register(host, env_from=[("db", "")], creator=("schedule", "ci"))
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[("db", ""), ("cache", "C_")], creator=("schedule", "ci"))
    assert "'cache'" in _refused(err)
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[("db", "")], creator=("schedule", "other"))
    _refused(err)


@pytest.mark.parametrize(
    ("content", "mode", "said"),
    [
        (None, 0o644, "has no role bindings"),
        (OWNER_BINDINGS, 0o666, "must not be writable by group or others"),
        ("bindings:\n- namespace: '*'\n  verbs: [use-secret]\n  users: [owner]\n", 0o644, "verbs[0]"),
        ("bindings: [", 0o644, "not valid YAML"),
    ],
    ids=["missing", "writable-by-others", "misspelt-verb", "not-yaml"],
)
def test_bindings_the_host_cannot_use_refuse_every_secret_and_say_why(
    host: Host, bindings: Path, content: str | None, mode: int, said: str
) -> None:
    if content is None:
        bindings.unlink()
    else:
        _write(bindings, content, mode=mode)
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="default", name=name, values={"K": b"v"})
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[(name, "")])
    assert said in _refused(err)
    _write(bindings, OWNER_BINDINGS)  # fixed: the next registration reads it again
    _register(host, env_from=[(name, "")])


@pytest.mark.parametrize("creator", [("sdk", "a b"), ("sdk", "\u202eadmin"), ("root", "admin"), ("sdk", "")])
def test_a_creator_out_of_bounds_is_refused_before_anything_is_decided(
    host: Host, creator: tuple[str, str]
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _register(host, env_from=[("db", "")], creator=creator)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_bindings_mounted_from_a_configmap_are_read_again_when_it_is_updated(
    host: Host, bindings: Path
) -> None:
    """The kubelet updates a ConfigMap volume by pointing `..data` at a new directory."""
    name = f"db-{uuid.uuid4().hex[:6]}"
    secrets.create(_state(host), namespace="default", name=name, values={"K": b"v"})
    root = bindings.parent
    stamps = [root / f"..2030_01_01_00_00_0{i}" for i in (1, 2)]
    for stamp, user in zip(stamps, ("nobody-yet", "owner"), strict=True):
        stamp.mkdir()
        (stamp / bindings.name).write_text(OWNER_BINDINGS.replace("owner", user))
    try:
        os.symlink(stamps[0].name, root / "..data")
        bindings.unlink()
        os.symlink(f"..data/{bindings.name}", bindings)
        with pytest.raises(grpc.RpcError) as err:
            _register(host, env_from=[(name, "")])
        _refused(err)
        os.symlink(stamps[1].name, root / "..data.new")
        (root / "..data.new").replace(root / "..data")
        _register(host, env_from=[(name, "")])
    finally:
        (root / "..data").unlink(missing_ok=True)
        for stamp in stamps:
            (stamp / bindings.name).unlink()
            stamp.rmdir()
