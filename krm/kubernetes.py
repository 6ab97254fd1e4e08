"""FunctionConfigs from Kubernetes: list, then watch from the list's resourceVersion.

The only module of krm that imports the Kubernetes client. The feed lists `functionconfigs.
kruntimes.io` (one namespace, or all), hands them to the store, then watches from the list's
resourceVersion, applying each event as it arrives. A watch that ends (its server-side timeout)
resumes from the last resourceVersion seen (bookmarks included); `410 Gone` (the version is too
old) relists; any other error restarts after a backoff that doubles up to a bound, resuming when
a resourceVersion is known. An invalid object is reported through `Store.set_errors` and its last
valid version, if any, is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from kruntimes.krm import config as fc
from kruntimes.krm import errors
from kruntimes.krm.store import Store
from kruntimes.system.kubewatch import WatchFailed, WatchGone, watch_events, watch_options

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
LIST_TIMEOUT_SECONDS = 30.0


async def connect(
    *, host: str | None = None, kubeconfig: str | None = None, in_cluster: bool = False
) -> k8s.ApiClient:
    """An API client: to `host` as it is (tests), from a kubeconfig file, or in-cluster."""
    configuration = k8s.Configuration()
    try:
        if host is not None:
            configuration.host = host.rstrip("/")
        elif in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as e:
        raise errors.SystemError_(f"cannot load the Kubernetes configuration: {e}") from e
    return k8s.ApiClient(configuration)


def _key(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    return f"{namespace}/{name}" if namespace else str(name)


def _version(raw: dict[str, Any]) -> str | None:
    value = (raw.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


class KubernetesFeed:
    def __init__(
        self,
        store: Store,
        api_client: k8s.ApiClient,
        *,
        namespace: str | None = None,
        watch_seconds: int = 300,
        backoff: tuple[float, float] = (0.2, 10.0),
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.watch_seconds = watch_seconds
        self.backoff = backoff
        self._api = k8s.CustomObjectsApi(api_client)
        self._valid: dict[str, fc.FunctionConfig] = {}
        self._problems: dict[str, str] = {}
        self.lists = 0  # how many times it listed (relists after 410 included)

    # --- applying -------------------------------------------------------------------------------

    def _accept(self, raw: Any) -> fc.FunctionConfig | None:
        if not isinstance(raw, dict):
            return None
        key = _key(raw)
        where = f"kubernetes {key}"
        try:
            config = fc.parse(raw, source=where)
        except fc.FunctionConfigError as e:
            if self._problems.get(where) != str(e):
                log.warning("FunctionConfig refused (its last valid version is kept): %s", e)
            self._problems[where] = str(e)
            return self._valid.get(key)
        self._problems.pop(where, None)
        self._valid[key] = config
        return config

    def _replace_all(self, items: list[Any]) -> None:
        previous, self._valid, self._problems = self._valid, {}, {}
        configs = []
        for raw in items:
            key = _key(raw) if isinstance(raw, dict) else ""
            if key in previous:
                self._valid[key] = previous[key]
            config = self._accept(raw)
            if config is not None:
                configs.append(config)
        self.store.replace(SOURCE, configs)
        self.store.set_errors(SOURCE, self._problems)

    def _apply(self, kind: str, raw: dict[str, Any]) -> None:
        if kind == "DELETED":
            key = _key(raw)
            self._valid.pop(key, None)
            self._problems.pop(f"kubernetes {key}", None)
            self.store.remove(SOURCE, key)
        else:
            config = self._accept(raw)
            if config is not None:
                self.store.put(SOURCE, config)
        self.store.set_errors(SOURCE, self._problems)

    # --- talking to the API ---------------------------------------------------------------------

    def _call(self, **kwargs: Any) -> Any:
        group, version, plural = fc.GROUP, fc.VERSION, fc.PLURAL
        if self.namespace is None:
            return self._api.list_cluster_custom_object(group, version, plural, **kwargs)
        return self._api.list_namespaced_custom_object(group, version, self.namespace, plural, **kwargs)

    async def list(self) -> str | None:
        """List everything, replace the store's Kubernetes configs; the list's resourceVersion."""
        try:
            answer = await self._call(_request_timeout=LIST_TIMEOUT_SECONDS)
        except ApiException as e:
            raise WatchFailed(f"listing FunctionConfigs: the API answered {e.status}") from e
        if not isinstance(answer, dict) or not isinstance(answer.get("items", []), list):
            raise WatchFailed("listing FunctionConfigs: the answer is not a list")
        self.lists += 1
        self._replace_all(answer.get("items") or [])
        return _version(answer)

    async def _events(self, resource_version: str | None) -> AsyncIterator[dict[str, Any]]:
        options = watch_options(watch_seconds=self.watch_seconds, resource_version=resource_version)
        response = await self._call(**options)
        async for event in watch_events(response, what="FunctionConfigs"):
            yield event

    async def watch(self, resource_version: str | None) -> str | None:
        """Apply events until the stream ends; the last resourceVersion seen."""
        async for event in self._events(resource_version):
            kind, raw = event.get("type"), event["object"]  # ERROR events raise in watch_events
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(kind, raw)
            resource_version = _version(raw) or resource_version
        return resource_version

    async def run(self) -> None:
        """List and watch until cancelled."""
        resource_version: str | None = None
        listed = False
        delay = self.backoff[0]
        while True:
            try:
                if not listed:
                    resource_version = await self.list()
                    listed = True
                resource_version = await self.watch(resource_version)
                delay = self.backoff[0]
            except WatchGone:
                log.info("FunctionConfig watch: resourceVersion expired, listing again")
                listed, resource_version = False, None
            except (WatchFailed, ApiException, aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("FunctionConfig watch failed (retrying in %.1f s): %s", delay, e)
                if resource_version is None:
                    listed = False  # nothing to resume from: what changed meanwhile needs a list
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
