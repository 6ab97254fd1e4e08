"""`krt function ...`, `krt apply -f` of a Function and `krt rollout status` as a user runs them
(subprocesses) against the whole platform: apply --wait, get, list, describe, invoke, a change
rolled out, rollback, delete, and the not-found answers. (Each `krt` is a fresh interpreter, a
few seconds each: each behaviour is checked once.)"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from kruntimes.sdk.client import Client, FunctionNotFound
from tests.cli.conftest import krt, one_error_line
from tests.sdk.stack import Platform, manifest, unique

VERSIONED = "import os\ndef handle(p):\n    return {'version': os.environ['VERSION'], 'echo': p}\n"
SECRET = "cli-env-value-never-shown-41c9"


def _manifest(name: str, version: str) -> dict[str, Any]:
    document = manifest(name, source=VERSIONED, env={"VERSION": version, "TOKEN": SECRET})
    return {**document, "kind": "Function", "spec": {**document["spec"], "scale": {"min": 1, "max": 2}}}


async def test_a_function_through_krt_apply_get_list_describe_invoke_rollout_rollback_delete(
    platform: Platform, tmp_path: Path
) -> None:
    name = unique("kfn")
    path = tmp_path / "fn.yaml"
    try:
        path.write_text(yaml.safe_dump(_manifest(name, "1")))
        applied = await krt(platform, "apply", "-f", str(path), "--wait")
        assert applied.code == 0, applied.err
        assert applied.out == f"function.kruntimes.io/{name} created\n"
        assert f"function/{name}: revision 1 rolled out (1/1 ready)" in applied.err, "progress on stderr"

        got = await krt(platform, "function", "get", name, "-o", "json")
        assert got.code == 0, got.err
        document = json.loads(got.out)
        assert list(document) == ["apiVersion", "kind", "metadata", "spec", "status"]
        assert document["kind"] == "Function" and document["status"]["phase"] == "Ready"
        uid = document["metadata"]["uid"]
        assert document["status"]["endpoint"]["url"].endswith(
            f"/v1/namespaces/default/functions/{uid}:invoke"
        )

        listed = await krt(platform, "function", "list")
        assert listed.code == 0, listed.err
        rows = [line.split() for line in listed.out.splitlines()]
        assert rows[0][:5] == ["NAME", "NAMESPACE", "RUNTIME", "READY", "REVISION"]
        assert [name, "default", "python", "1/1", "1", "Ready"] in [row[:6] for row in rows]

        invoked = await krt(platform, "function", "invoke", name, "--data", '{"x": 1}')
        assert invoked.code == 0, invoked.err
        assert json.loads(invoked.out) == {"version": "1", "echo": {"x": 1}}

        path.write_text(yaml.safe_dump(_manifest(name, "2")))
        changed = await krt(platform, "function", "apply", "-f", str(path))
        assert changed.code == 0 and changed.out == f"function.kruntimes.io/{name} configured\n", changed.err
        rollout = await krt(platform, "rollout", "status", f"function/{name}", "--timeout", "90")
        assert rollout.code == 0, rollout.err
        assert rollout.out.splitlines()[-1] == f"function/{name}: revision 2 rolled out (1/1 ready)"

        described = await krt(platform, "function", "describe", name)
        assert described.code == 0, described.err
        text = described.out
        fields = dict(line.split(":", 1) for line in text.splitlines() if line[:1].isupper() and ":" in line)
        assert fields["Revision"].strip() == "2" and fields["Phase"].strip() == "Ready"
        assert fields["Replicas"].strip() == "1 wanted, 1 ready, 1 in all"
        assert fields["Endpoint"].strip() == document["status"]["endpoint"]["url"]
        assert "TOKEN, VERSION (values not shown)" in text and SECRET not in text
        [header, row] = text.split("Replica Runs:\n", 1)[1].splitlines()
        assert header.split() == ["RUN", "REVISION", "PHASE", "UID"]
        assert row.split()[:3] == [row.split()[0], "2", "Ready"] and row.split()[0].startswith(f"{name}-r2-")

        back = await krt(platform, "function", "rollback", name, "--wait")
        assert back.code == 0, back.err
        assert back.out == f"function.kruntimes.io/{name} rolled back: revision 3\n"
        again = await krt(platform, "function", "invoke", name, "-o", "json")
        assert again.code == 0 and json.loads(again.out)["outputs"]["version"] == "1", again.err

        deleted = await krt(platform, "function", "delete", name)
        assert deleted.code == 0 and deleted.out == f"function.kruntimes.io/{name} deleted\n", deleted.err
        gone = await krt(platform, "function", "get", name)
        assert gone.code == 3
        assert one_error_line(gone.err) == (
            f"krt: function {name!r} not found in namespace 'default'; `krt function list` lists the Functions"
        )
    finally:
        async with Client(platform.config) as client:
            with contextlib.suppress(FunctionNotFound):
                await client.functions.delete(name, timeout=120)


async def test_the_function_commands_on_a_missing_function_exit_3_with_one_line(platform: Platform) -> None:
    name = unique("nokfn")
    # every verb's SDK call raises FunctionNotFound (tests/sdk/functions_test.py); these are its words
    done = await krt(platform, "rollout", "status", f"function/{name}", "-n", "elsewhere", "--timeout", "5")
    assert done.code == 3 and done.out == "", done.err
    assert one_error_line(done.err) == (
        f"krt: function {name!r} not found in namespace 'elsewhere'; "
        "`krt function list -n elsewhere` lists the Functions"
    )
    listed = await krt(platform, "function", "list", "-n", "elsewhere")
    assert (
        listed.code == 0 and listed.out == "" and listed.err == "No functions found in namespace elsewhere.\n"
    )
