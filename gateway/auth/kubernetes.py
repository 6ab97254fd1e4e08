"""Kubernetes mode: ask the API server, with the caller's own token, whether they may `get` the Run.

One SelfSubjectAccessReview per decision (the resource's verb: get for an invocation, what an MCP
tool does for the tool; group kruntimes.io; resource runs or functions; the exact namespace and
name). The gateway's own credentials are never used: a review made with them would
answer for the gateway, not the caller. Library errors are wrapped here and never leak.
"""

from __future__ import annotations

import ssl

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from kruntimes.api.names import validate_subject
from kruntimes.gateway.auth.base import (
    AuthUnavailable,
    Forbidden,
    Principal,
    Resource,
    Unauthenticated,
    check_token,
)

RUNS_GROUP = "kruntimes.io"

MAX_GROUPS = 64  # of a caller's groups kept in its principal
# A review says "allowed", not who the caller is.
KUBERNETES_PRINCIPAL = Principal(user="(kubernetes)", uid="", groups=())


def access_review(resource: Resource) -> k8s.V1SelfSubjectAccessReview:
    return k8s.V1SelfSubjectAccessReview(
        api_version="authorization.k8s.io/v1",
        kind="SelfSubjectAccessReview",
        spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(
                verb=resource.verb,
                group=RUNS_GROUP,
                resource=resource.kind,
                namespace=resource.namespace,
                name=resource.name,
            )
        ),
    )


class KubernetesAuthorizer:
    def __init__(
        self,
        host: str,
        *,
        ca_file: str | None = None,
        verify_ssl: bool = True,
        timeout_s: float = 5.0,
        identify: bool = False,
    ) -> None:
        """`identify`: after an allowed review, ask who the caller is (a SelfSubjectReview, one
        more call per decision) so the principal names them: the MCP server's audit and the
        creator of what a caller creates. The gateway's invocations do without."""
        if ca_file is not None:
            ssl.create_default_context(cafile=ca_file)  # an unreadable CA fails here, at start
        self._configuration = k8s.Configuration(host=host.rstrip("/"))
        self._configuration.ssl_ca_cert = ca_file
        self._configuration.verify_ssl = verify_ssl
        self._timeout_s = timeout_s
        self._identify = identify
        self._api_client: k8s.ApiClient | None = None
        self._closed = False

    def _api(self) -> k8s.AuthorizationV1Api:
        if self._api_client is None:
            api_client = k8s.ApiClient(self._configuration)
            # One connection pool serves every caller, so nothing of one caller's exchange may ride
            # along on another's: swap in a session without a cookie jar, keeping the TLS connector.
            rest = api_client.rest_client
            connector = rest.pool_manager.connector
            rest.pool_manager.detach()
            rest.pool_manager = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=True
            )
            self._api_client = api_client
        return k8s.AuthorizationV1Api(self._api_client)

    async def _who(self, caller: dict[str, str]) -> Principal:
        """The caller's user name and groups as the API server authenticated them; the anonymous
        principal when it cannot say (a server before SelfSubjectReview, a name no audit may
        carry)."""
        self._api()  # the shared client
        api = k8s.AuthenticationV1Api(self._api_client)
        try:
            review, _, _ = await api.create_self_subject_review_with_http_info(
                k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"),
                _request_auth=caller,
                _request_timeout=self._timeout_s,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return KUBERNETES_PRINCIPAL
        info = review.status.user_info if review.status is not None else None
        if info is None or not isinstance(info.username, str):
            return KUBERNETES_PRINCIPAL
        try:
            user = validate_subject(info.username, field="user")
        except ValueError:
            return KUBERNETES_PRINCIPAL
        groups = tuple(g for g in (info.groups or ())[:MAX_GROUPS] if isinstance(g, str) and len(g) <= 256)
        return Principal(user=user, uid=str(info.uid or "")[:128], groups=groups)

    async def authorize(self, token: str, resource: Resource) -> Principal:
        check_token(token)
        if self._closed:
            raise AuthUnavailable("the Kubernetes authorizer is closed")
        caller = {"in": "header", "type": "api_key", "key": "authorization", "value": f"Bearer {token}"}
        try:
            review, _, _ = await self._api().create_self_subject_access_review_with_http_info(
                access_review(resource), _request_auth=caller, _request_timeout=self._timeout_s
            )
        except ApiException as e:
            if e.status == 401:
                raise Unauthenticated("the Kubernetes API did not accept the bearer token") from e
            if e.status == 403:
                raise Forbidden("the caller may not review its own access in Kubernetes") from e
            raise AuthUnavailable(f"the Kubernetes API answered {e.status} to an access review") from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise AuthUnavailable("the Kubernetes API is unreachable or did not answer in time") from e
        except ValueError as e:
            raise AuthUnavailable("the Kubernetes API sent a malformed access review") from e
        status = review.status
        if status is None or status.allowed is not True:
            raise Forbidden(
                f"the caller may not {resource.verb} {resource.kind}.{RUNS_GROUP} "
                f"{resource.namespace}/{resource.name}"
            )
        if self._identify:
            return await self._who(caller)
        return KUBERNETES_PRINCIPAL

    async def close(self) -> None:
        self._closed = True
        if self._api_client is not None:
            api_client, self._api_client = self._api_client, None
            await api_client.close()
