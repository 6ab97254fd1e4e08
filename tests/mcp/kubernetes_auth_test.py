"""`krt mcp --listen --auth kubernetes` against kmock serving a fake API server on 127.0.0.1 (the
gateway's own Kubernetes authorizer, with the real kubernetes-asyncio client), over the shared
embedded platform: a tool's access review names the exact Run or Function it acts on, with the
caller's own token, so a caller granted `get` on one Run may use it and no other Run of the same
namespace.

kmock does not answer SelfSubjectAccessReviews, so `FakeRBAC` does, as RBAC with resourceNames
would (tests/gateway_auth/kubernetes_test.py does the same for the gateway alone).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2
import pytest

# kmock exports Response but leaves it out of __all__.
from kmock import KubernetesScaffold, Request, Response  # type: ignore[attr-defined]

from tests.mcp.conftest import krt_mcp_listen, refusal, structured
from tests.sdk.stack import Platform, manifest

pytestmark = pytest.mark.kmock(cls=KubernetesScaffold, strict=True)

SSAR = "post /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SSR = "post /apis/authentication.k8s.io/v1/selfsubjectreviews"
USER = "erin@example.org"
TOKEN = "krt-mcp-k8s-erin"
NAMESPACE = "team-k"


class FakeRBAC:
    """token -> the (verb, resource, namespace, name) that caller may do in group kruntimes.io;
    name "" grants every object of the namespace (a rule without resourceNames). Other tokens:
    401."""

    def __init__(self, grants: dict[str, set[tuple[str, str, str, str]]]) -> None:
        self.grants = grants

    def __call__(self, request: Request) -> Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.grants:
            return Response(status=401, payload={"kind": "Status", "code": 401, "reason": "Unauthorized"})
        a = request.data["spec"]["resourceAttributes"]
        asked = (a.get("verb"), a.get("resource"), a.get("namespace"), a.get("name") or "")
        granted = self.grants[token]
        allowed = a.get("group") == "kruntimes.io" and (asked in granted or (*asked[:3], "") in granted)
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {"creationTimestamp": None},
            "spec": request.data["spec"],
            "status": {"allowed": allowed},
        }
        return Response(status=201, payload=review)


def who_am_i(request: Request) -> Response:
    """A SelfSubjectReview: who the API server takes the caller's token for."""
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    if token != TOKEN:
        return Response(status=401, payload={"kind": "Status", "code": 401, "reason": "Unauthorized"})
    user = {"username": USER, "uid": "u-1", "groups": ["team-k", "system:authenticated"]}
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
        "status": {"userInfo": user},
    }
    return Response(status=201, payload=review)


async def test_in_a_cluster_a_tool_is_allowed_on_the_exact_run_granted_and_refused_on_another_of_its_namespace(
    platform: Platform, kmock: KubernetesScaffold, tmp_path: Path
) -> None:
    kmock[SSAR] << FakeRBAC(
        {
            TOKEN: {
                ("get", "runs", NAMESPACE, "granted"),
                ("delete", "runs", NAMESPACE, "granted"),
                ("get", "runs", NAMESPACE, "read-only"),
                ("get", "functions", NAMESPACE, "fn-granted"),
                ("create", "runs", NAMESPACE, "made"),
                ("delete", "runs", NAMESPACE, "made"),
            }
        }
    )
    kmock[SSR] << who_am_i
    auth = ["--auth", "kubernetes", "--kubernetes-api", str(kmock.url)]
    async with krt_mcp_listen(platform, tmp_path, auth) as server:
        async with server.session(TOKEN) as mcp:
            # let through to the platform, which has no such Run: the review allowed it
            for tool in ("run_get", "run_history", "run_delete"):
                allowed = refusal(await mcp.call_tool(tool, {"name": "granted", "namespace": NAMESPACE}))
                assert allowed["reason"] == "RunNotFound", (tool, allowed)
                other = refusal(await mcp.call_tool(tool, {"name": "other", "namespace": NAMESPACE}))
                assert other["reason"] == "Forbidden", (tool, other)
                assert f"runs {NAMESPACE}/other" in other["message"]
            # a mutating tool asks for what it does: `get` on a Run is not leave to delete it
            readonly = refusal(
                await mcp.call_tool("run_delete", {"name": "read-only", "namespace": NAMESPACE})
            )
            assert readonly["reason"] == "Forbidden" and "delete on runs.kruntimes.io" in readonly["message"]
            got = refusal(await mcp.call_tool("run_get", {"name": "read-only", "namespace": NAMESPACE}))
            assert got["reason"] == "RunNotFound", got
            # who the caller is comes from the API server: the audit and the Run's creator name them
            made = manifest("made")
            made["metadata"]["namespace"] = NAMESPACE
            created = structured(await mcp.call_tool("run_create", {"manifest": made}))
            assert created["metadata"]["creator"] == {"kind": "mcp", "subject": USER}
            structured(await mcp.call_tool("run_delete", {"name": "made", "namespace": NAMESPACE}))
            # a listing needs the namespace as a whole; one Run's grant is not that
            listing = refusal(await mcp.call_tool("run_list", {"namespace": NAMESPACE}))
            assert listing["reason"] == "Forbidden"
            # a Function tool reviews functions.kruntimes.io: a Run's grant is not a Function's
            fn = refusal(await mcp.call_tool("functions_get", {"name": "fn-granted", "namespace": NAMESPACE}))
            assert fn["reason"] == "FunctionNotFound", fn
            assert refusal(await mcp.call_tool("functions_get", {"name": "granted", "namespace": NAMESPACE}))[
                "reason"
            ] == ("Forbidden")
        # a token the API server does not accept: 401 before the MCP layer reads the request
        async with httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(server.ca))) as http:
            answer = await http.post(
                server.url,
                headers={"Authorization": "Bearer not-a-kubernetes-token"},
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            )
        assert answer.status_code == 401 and answer.json()["reason"] == "Unauthenticated"
        log = server.log.read_text()
    reviews = [request.data["spec"]["resourceAttributes"] for request in kmock[SSAR]]
    asked = [("get", "granted", "runs"), ("delete", "granted", "runs"), ("get", "other", "runs")]
    for verb, name, resource in [*asked, ("delete", "read-only", "runs"), ("get", "fn-granted", "functions")]:
        exact = {
            "verb": verb,
            "group": "kruntimes.io",
            "resource": resource,
            "namespace": NAMESPACE,
            "name": name,
        }
        assert exact in reviews, (exact, reviews)
    callers = {request.headers["Authorization"] for request in kmock[SSAR]}
    assert callers == {f"Bearer {TOKEN}", "Bearer not-a-kubernetes-token"}, "each review is the caller's own"
    assert TOKEN not in log
    assert f"run_create by mcp:{USER}" in log and f"run_delete by mcp:{USER}" in log
