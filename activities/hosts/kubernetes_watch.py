"""The pod watch: host pods of one control plane in one namespace, turned into host events.

It lists the pods (labelled as kruntimes hosts, annotated with this control plane), then watches
from the list's resourceVersion and reports each change as a ``HostEvent`` (Ready, NotReady,
Failed, Evicted, Deleted — when the pod starts deleting, and again once it is gone). A watch
that ends (its server-side timeout) resumes from the last resourceVersion seen, bookmarks
included; ``410 Gone`` relists, and pods that vanished meanwhile are reported Deleted; any other
error restarts after a backoff that doubles up to a bound, resuming when a resourceVersion is known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.activities.hosts.events import HostEvent, HostEventKind, HostEventSink
from kruntimes.activities.hosts.kubernetes import API_TIMEOUT_S, ApiFailure, PodApi
from kruntimes.api.ids import HostId, HostUid, RuntimeName
from kruntimes.system.kubewatch import WatchFailed, WatchGone, watch_events, watch_options

log = logging.getLogger(__name__)


@dataclass
class _Seen:
    name: str
    runtime: RuntimeName
    host_id: HostId
    ready: bool = False
    ended: bool = False  # Failed or Evicted reported
    deleted: bool = False  # Deleted reported


class PodWatch:
    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        control_plane: str,
        on_event: HostEventSink,
        on_pod: Callable[..., None] | None = None,
        provider: str = "kubernetes",
        watch_seconds: int = 300,
        backoff: tuple[float, float] = (0.2, 10.0),
    ) -> None:
        self.namespace = namespace
        self.control_plane = pods.check_control_plane_id(control_plane)
        self.on_event = on_event
        # told every pod of this control plane that changed, and whether it is gone (the
        # provider's waiting creates: KubernetesProvider.notify)
        self.on_pod = on_pod
        self.provider = provider
        self.watch_seconds = watch_seconds
        self.backoff = backoff
        self._api = PodApi(api_client, timeout_s=API_TIMEOUT_S)
        self._selector = pods.platform_selector(control_plane)
        self._seen: dict[str, _Seen] = {}
        self.resource_version: str | None = None  # where the next watch starts
        self.lists = 0  # how many times it listed (relists after 410 included)
        self.watches = 0  # how many watch requests it made

    # -- applying -------------------------------------------------------------------------------------

    def _emit(self, kind: HostEventKind, seen: _Seen, uid: str, message: str = "") -> None:
        event = HostEvent(
            kind=kind,
            provider=self.provider,
            runtime=seen.runtime,
            host_id=seen.host_id,
            host_uid=HostUid(uid),
            message=message,
        )
        log.info("host pod %s: %s %s", kind, seen.name, message)
        try:
            self.on_event(event)
        except Exception:
            log.exception("a host event sink failed")

    def _apply(self, kind: str, raw: dict[str, Any]) -> None:
        facts = pods.PodFacts.of(raw)
        if not facts.uid or not facts.owned_by(self.control_plane):
            return
        if self.on_pod is not None:
            self.on_pod(raw, deleted=kind == "DELETED")
        seen = self._seen.get(facts.uid)
        if seen is None:
            seen = self._seen[facts.uid] = _Seen(
                facts.name, RuntimeName(facts.runtime), HostId(facts.host_id)
            )
        if kind == "DELETED":  # reported again after "being deleted": now it is proven gone
            self._emit(HostEventKind.Deleted, seen, facts.uid, "the pod is gone")
            del self._seen[facts.uid]
            return
        if seen.deleted:
            return
        if facts.deleting:
            seen.deleted = True
            self._emit(HostEventKind.Deleted, seen, facts.uid, "the pod is being deleted")
            return
        if facts.finished and not seen.ended:
            seen.ended = True
            if facts.evicted:
                self._emit(HostEventKind.Evicted, seen, facts.uid, facts.message)
            else:
                self._emit(HostEventKind.Failed, seen, facts.uid, f"phase {facts.phase}")
            return
        ready = facts.ready and facts.phase == "Running"
        if ready and not seen.ready:
            self._emit(HostEventKind.Ready, seen, facts.uid)
        elif seen.ready and not ready and not seen.ended:
            self._emit(HostEventKind.NotReady, seen, facts.uid)
        seen.ready = ready

    def _replace_all(self, items: list[Any]) -> None:
        present = set()
        for raw in items:
            if isinstance(raw, dict):
                facts = pods.PodFacts.of(raw)
                if facts.uid and facts.owned_by(self.control_plane):
                    present.add(facts.uid)
                    self._apply("ADDED", raw)
        for uid in [u for u in self._seen if u not in present]:  # deleted while nobody watched
            self._emit(HostEventKind.Deleted, self._seen.pop(uid), uid, "the pod is gone")

    # -- talking to the API ---------------------------------------------------------------------------

    async def list(self) -> str | None:
        try:
            answer = await self._api.list_pods(self.namespace, selector=self._selector)
        except ApiFailure as e:
            raise WatchFailed(f"listing pods: {e.reason}: {e}") from e
        self.lists += 1
        self._replace_all(answer.get("items") or [])
        return _version(answer)

    async def _events(self, resource_version: str | None) -> AsyncIterator[dict[str, Any]]:
        options = watch_options(watch_seconds=self.watch_seconds, resource_version=resource_version)
        self.watches += 1
        response: Any = await self._api.core.list_namespaced_pod(self.namespace, **options)
        async for event in watch_events(response, what="pods"):
            yield event

    async def watch(self) -> None:
        """Apply events until the stream ends, keeping the last resourceVersion seen (bookmarks
        included) in ``resource_version``, so that a watch cut off mid-stream resumes there."""
        async for event in self._events(self.resource_version):
            kind, raw = event.get("type"), event["object"]  # ERROR events raise in watch_events
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(str(kind), raw)
            self.resource_version = _version(raw) or self.resource_version

    async def run(self) -> None:
        """List and watch until cancelled."""
        self.resource_version = None
        listed = False
        delay = self.backoff[0]
        while True:
            try:
                if not listed:
                    self.resource_version = await self.list()
                    listed = True
                await self.watch()
                delay = self.backoff[0]
            except WatchGone:
                log.info("pod watch %s: resourceVersion expired, listing again", self.namespace)
                listed, self.resource_version = False, None
            except (WatchFailed, aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("pod watch %s failed (retrying in %.1f s): %s", self.namespace, delay, e)
                if self.resource_version is None:
                    listed = False  # nothing to resume from: what changed meanwhile needs a list
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])


def _version(raw: dict[str, Any]) -> str | None:
    metadata = raw.get("metadata")
    value = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return str(value) if value else None
