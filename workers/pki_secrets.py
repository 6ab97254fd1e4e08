"""The Kubernetes Secret client of `krt pki init-cluster`: the three calls `ClusterPki` makes
(kruntimes.pki.cluster.SecretStore), every library error wrapped into a ClusterPkiError."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from kruntimes.pki.cluster import ClusterPkiError

API_TIMEOUT_S = 10.0


class SecretApi:
    """The three Secret calls, answering (status, JSON body); transport failures and answers that
    are not JSON become ClusterPkiError."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = API_TIMEOUT_S) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    async def _call(self, what: str, method: Any, *args: Any) -> tuple[int, dict[str, Any]]:
        try:
            response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s)
            async with response:
                status, raw = response.status, await response.read()
        except ApiException as e:
            raise ClusterPkiError(f"{what}: the Kubernetes client failed: {e.reason}") from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ClusterPkiError(f"{what}: the API server is unreachable: {type(e).__name__}: {e}") from e
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as e:
            raise ClusterPkiError(f"{what}: the API server answered {status} without JSON") from e
        return status, body if isinstance(body, dict) else {}

    @staticmethod
    def _fail(what: str, status: int, body: Mapping[str, Any]) -> ClusterPkiError:
        message = str(body.get("message") or body.get("reason") or "")[:512]
        return ClusterPkiError(f"{what}: the API server answered {status}: {message}")

    async def _answer(
        self, what: str, method: Any, *args: Any, absent: tuple[int, ...]
    ) -> dict[str, Any] | None:
        """The body of a 2xx answer; None for a status in `absent`; any other is ClusterPkiError."""
        status, body = await self._call(what, method, *args)
        if status in absent:
            return None
        if not 200 <= status < 300:
            raise self._fail(what, status, body)
        return body

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        what = f"get secret {namespace}/{name}"
        return await self._answer(what, self.core.read_namespaced_secret, name, namespace, absent=(404,))

    async def create(self, namespace: str, secret: dict[str, Any]) -> bool:
        """True if created; False when one of that name exists already."""
        what = f"create secret {namespace}/{secret['metadata']['name']}"
        created = await self._answer(
            what, self.core.create_namespaced_secret, namespace, secret, absent=(409,)
        )
        return created is not None

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """True if patched; False when it is gone or changed since it was read (the uid and
        resourceVersion in the patch are preconditions)."""
        what = f"patch secret {namespace}/{name}"
        patched = await self._answer(
            what, self.core.patch_namespaced_secret, name, namespace, patch, absent=(404, 409)
        )
        return patched is not None


async def connect(*, api_server: str | None, kubeconfig: str | None = None) -> k8s.ApiClient:
    """An API client: `api_server` as given, else the pod's service account, else a kubeconfig."""
    configuration = k8s.Configuration()
    try:
        if api_server:
            configuration.host = api_server.rstrip("/")
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and kubeconfig is None:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as e:
        raise ClusterPkiError(f"cannot load the Kubernetes configuration: {e}") from e
    return k8s.ApiClient(configuration)
