"""The Kubernetes authorizer against kmock serving a fake API server on 127.0.0.1.

kmock does not answer SelfSubjectAccessReviews, so each test scripts them: `FakeRBAC` reads the
caller's token from the Authorization header and the review from the body, and answers as RBAC
would. The handler is kmock's stateless KubernetesScaffold: the default KubernetesEmulator stores
every created object, and a review has no name, so a second review would be refused with 409.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator

import pytest

# kmock exports Response but leaves it out of __all__.
from kmock import KubernetesScaffold, Request, Response  # type: ignore[attr-defined]

from kruntimes.gateway.auth import (
    AuthUnavailable,
    CachingAuthorizer,
    Forbidden,
    KubernetesAuthorizer,
    Resource,
    Unauthenticated,
)
from tests.gateway_auth.helpers import issue
from tests.support.ports import refusing_port

pytestmark = pytest.mark.kmock(cls=KubernetesScaffold, strict=True)

SSAR = "post /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
ALICE = issue("alice")
BOB = issue("bob")


class FakeRBAC:
    """token -> namespaces where that caller may `get` runs.kruntimes.io; other tokens get 401."""

    def __init__(self, grants: dict[str, set[str]]) -> None:
        self.grants = grants

    def __call__(self, request: Request) -> Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.grants:
            return Response(status=401, payload={"kind": "Status", "code": 401, "reason": "Unauthorized"})
        attributes = request.data["spec"]["resourceAttributes"]
        allowed = (attributes.get("verb"), attributes.get("group"), attributes.get("resource")) == (
            "get",
            "kruntimes.io",
            "runs",
        ) and attributes.get("namespace") in self.grants[token]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {"creationTimestamp": None},
            "spec": request.data["spec"],
            "status": {"allowed": allowed, "reason": "RBAC: allowed" if allowed else ""},
        }
        return Response(status=201, payload=review)


def run_in(namespace: str, name: str = "hello") -> Resource:
    return Resource(namespace=namespace, name=name, run_uid=f"uid-{namespace}-{name}")


@pytest.fixture
async def authorizer(kmock: KubernetesScaffold) -> AsyncIterator[KubernetesAuthorizer]:
    authorizer = KubernetesAuthorizer(str(kmock.url), timeout_s=2)
    yield authorizer
    await authorizer.close()


async def test_a_caller_allowed_to_get_the_run_is_allowed(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    principal = await authorizer.authorize(ALICE, run_in("team-a"))
    assert principal.user == "(kubernetes)"


async def test_a_caller_not_allowed_in_that_namespace_is_forbidden(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    with pytest.raises(Forbidden) as caught:
        await authorizer.authorize(ALICE, run_in("team-b"))
    assert caught.value.status == 403
    assert "team-b/hello" in str(caught.value)


async def test_decisions_follow_each_callers_own_grants(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}, BOB: {"team-b"}})
    await authorizer.authorize(ALICE, run_in("team-a"))
    await authorizer.authorize(BOB, run_in("team-b"))
    with pytest.raises(Forbidden):
        await authorizer.authorize(BOB, run_in("team-a"))
    with pytest.raises(Forbidden):
        await authorizer.authorize(ALICE, run_in("team-b"))
    assert len(kmock[SSAR]) == 4, "every review is a new POST; none is refused as a duplicate"


async def test_the_review_asks_exactly_to_get_this_run_with_the_callers_token(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}, BOB: {"team-a"}})
    await authorizer.authorize(ALICE, run_in("team-a", "hello"))
    await authorizer.authorize(BOB, run_in("team-a", "other"))

    first, second = kmock[SSAR][0], kmock[SSAR][1]
    assert first.data == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": "get",
                "group": "kruntimes.io",
                "resource": "runs",
                "namespace": "team-a",
                "name": "hello",
            }
        },
    }
    assert first.headers["Authorization"] == f"Bearer {ALICE}"
    assert second.data["spec"]["resourceAttributes"]["name"] == "other"
    assert second.headers["Authorization"] == f"Bearer {BOB}"


async def test_a_token_the_api_rejects_is_unauthenticated(kmock, authorizer) -> None:
    stranger = issue("stranger")
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    with pytest.raises(Unauthenticated) as caught:
        await authorizer.authorize(stranger, run_in("team-a"))
    assert caught.value.status == 401
    assert stranger not in "".join(traceback.format_exception(caught.value))


async def test_a_caller_who_may_not_even_review_itself_is_forbidden(kmock, authorizer) -> None:
    kmock[SSAR] << Response(status=403, payload={"kind": "Status", "code": 403, "reason": "Forbidden"})
    with pytest.raises(Forbidden):
        await authorizer.authorize(ALICE, run_in("team-a"))


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_api_errors_make_authorization_unavailable(kmock, authorizer, status: int) -> None:
    kmock[SSAR] << Response(status=status, payload={"kind": "Status", "code": status})
    with pytest.raises(AuthUnavailable) as caught:
        await authorizer.authorize(ALICE, run_in("team-a"))
    assert caught.value.status == 503
    assert caught.value.reason == "AuthorizationUnavailable"
    assert ALICE not in "".join(traceback.format_exception(caught.value))


async def test_a_review_without_a_status_is_not_an_allow(kmock, authorizer) -> None:
    kmock[SSAR] << (lambda request: Response(status=201, payload={"spec": request.data["spec"]}))
    with pytest.raises(Forbidden):
        await authorizer.authorize(ALICE, run_in("team-a"))


async def test_a_garbled_answer_makes_authorization_unavailable(kmock, authorizer) -> None:
    kmock[SSAR] << Response(status=201, payload={"status": {"allowed": True}})
    with pytest.raises(AuthUnavailable):
        await authorizer.authorize(ALICE, run_in("team-a"))


async def test_an_api_that_is_down_makes_authorization_unavailable() -> None:
    with refusing_port() as port:
        authorizer = KubernetesAuthorizer(f"http://127.0.0.1:{port}", timeout_s=2)
        try:
            with pytest.raises(AuthUnavailable) as caught:
                await authorizer.authorize(ALICE, run_in("team-a"))
            assert ALICE not in "".join(traceback.format_exception(caught.value))
        finally:
            await authorizer.close()


async def test_an_api_that_does_not_answer_in_time_makes_authorization_unavailable(kmock) -> None:
    async def slow(request: Request) -> Response:
        await asyncio.sleep(1)
        return FakeRBAC({ALICE: {"team-a"}})(request)

    kmock[SSAR] << slow
    authorizer = KubernetesAuthorizer(str(kmock.url), timeout_s=0.2)
    try:
        with pytest.raises(AuthUnavailable):
            await authorizer.authorize(ALICE, run_in("team-a"))
    finally:
        await authorizer.close()


async def test_malformed_tokens_are_refused_before_anything_is_sent(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    with pytest.raises(Unauthenticated):
        await authorizer.authorize("two\r\nwords", run_in("team-a"))
    assert len(kmock[SSAR]) == 0


async def test_cookies_set_by_the_api_never_reach_another_callers_review(kmock) -> None:
    rbac = FakeRBAC({ALICE: {"team-a"}, BOB: {"team-a"}})

    def with_cookie(request: Request) -> Response:
        answer = rbac(request)
        return Response(
            status=answer.status, payload=answer.payload, headers={"Set-Cookie": "session=alice; Path=/"}
        )

    kmock[SSAR] << with_cookie
    # A host name, not an IP address: aiohttp's cookie jar ignores cookies from IP addresses.
    authorizer = KubernetesAuthorizer(f"http://localhost:{kmock.servers[0].port}")
    try:
        await authorizer.authorize(ALICE, run_in("team-a"))
        await authorizer.authorize(BOB, run_in("team-a"))
    finally:
        await authorizer.close()
    assert [request.headers.get("Cookie") for request in kmock[SSAR]] == [None, None]


async def test_a_closed_authorizer_decides_nothing(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    await authorizer.close()
    with pytest.raises(AuthUnavailable):
        await authorizer.authorize(ALICE, run_in("team-a"))
    assert len(kmock[SSAR]) == 0


async def test_cached_decisions_spare_the_api(kmock, authorizer) -> None:
    kmock[SSAR] << FakeRBAC({ALICE: {"team-a"}})
    cached = CachingAuthorizer(authorizer)
    for _ in range(3):
        await cached.authorize(ALICE, run_in("team-a"))
        with pytest.raises(Forbidden):
            await cached.authorize(ALICE, run_in("team-b"))
    assert len(kmock[SSAR]) == 2
    assert (cached.stats.hits, cached.stats.misses) == (4, 2)


def test_an_unreadable_ca_file_fails_at_construction(tmp_path) -> None:
    with pytest.raises(OSError):
        KubernetesAuthorizer("https://127.0.0.1:6443", ca_file=str(tmp_path / "missing-ca.crt"))
