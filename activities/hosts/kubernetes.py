"""The kubernetes provider: every host a pod (activities/hosts/kubernetes_pods.py builds it).

The host uid is the pod's uid. ``create`` is idempotent per (runtime, hostId): a pod of this
control plane with the same template hash is adopted, another one is replaced; it returns once the
pod is Running and Ready and the Runtime Server at the pod's IP answers as that pod, within the
runtime's ``startTimeoutSeconds``, and deletes the pod on every failure and on cancellation.
``delete`` carries the pod's uid as a precondition, so a stale request never deletes a newer pod
of the same name. ``gone`` is the fence for recovery: the pod of that uid no longer exists, or it
is deleting and out of routing. Orphans (pods of this control plane that no pool knows) are found
and deleted by ``OrphanCollector``; the pod watch lives in kubernetes_watch.py.

The API calls made, and so the RBAC the worker needs (``VERBS``, ``SECRET_VERBS``): pods get,
list, watch, create, delete, and secrets get, create, patch, delete in the runtimes' namespaces.

Every host pod mounts a certificate directory (tls.crt, tls.key, ca.crt, assignments.pub) from a
Secret: the runtime's ``certificateSecret`` when it names one (the operator provisions it, e.g.
with cert-manager), else ``{pod}-tls``, which the provider issues from the platform CA for each
new pod, owned by that pod (so the garbage collector removes it with the pod; the provider
deletes it too, and never one owned by a newer pod); ``renew_certificates`` re-issues in place
those due (two thirds of their validity passed) or not of the CA's current key and bundle (a CA
rotation: kruntimes.pki.rotation). Every library error is wrapped here into a
``ProviderError``: RBAC refusals are ``Forbidden``, quota ``QuotaExceeded``, admission and schema
refusals ``AdmissionDenied``, an unreachable or overloaded API ``ApiUnavailable``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import re
import time
import weakref
from collections.abc import Awaitable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
from cryptography import x509
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.activities.hosts._rpc import HostRpcError, identify, serves
from kruntimes.activities.hosts.base import Fenced, ProviderConfigError, provider_error
from kruntimes.api.names import validate_dns1123_label
from kruntimes.config.runtimes import KUBERNETES_PROVIDER, KubernetesRuntime, PlatformConfig
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation
from kruntimes.pki import CA_CERT, TLS_CERT, HostIssuer

__all__ = [
    "SECRET_VERBS",
    "VERBS",
    "KubernetesAccess",
    "KubernetesConfigError",
    "KubernetesProvider",
    "OrphanCollector",
    "Sweep",
    "check_access",
    "check_certificates",
    "connect",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Every verb the provider and its watch use on pods, and on the certificate Secrets it issues for
# them: the worker's RBAC (docs/kubernetes.md).
VERBS = frozenset({"get", "list", "watch", "create", "delete"})
SECRET_VERBS = frozenset({"get", "create", "patch", "delete"})
API_TIMEOUT_S = 10.0
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 1.0
# A pod that never served, or is replaced, gets a short grace: 0 would remove it from the API at
# once, before its kubelet stopped the container; 1 lets the kubelet stop it first.
_DISCARD_GRACE_S = 1
_DISCARD_WAIT_S = 30.0  # how long a cancelled create waits for its POST to answer
# How long a fence looks for the pod it deleted with no grace to be gone from the API (at once,
# unless a finalizer holds it).
_FENCE_WAIT_S = 5.0
_RBAC_REFUSAL = re.compile(r"cannot [a-z]+ resource")
_MAX_MESSAGE = 1024
_SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class KubernetesConfigError(ProviderConfigError):
    """The worker cannot use Kubernetes as configured (bad kubeconfig, no access, bad template)."""


@dataclass(frozen=True)
class KubernetesAccess:
    """How the worker reaches the API server: ``host`` as it is (tests), a kubeconfig file (and
    context), or the in-cluster service account."""

    host: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service account (the in-cluster defaults apply)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(_SERVICE_ACCOUNT_TOKEN)


async def connect(access: KubernetesAccess) -> k8s.ApiClient:
    """An API client, or KubernetesConfigError saying what is wrong with the configuration."""
    configuration = k8s.Configuration()
    try:
        if access.host is not None:
            configuration.host = access.host.rstrip("/")
        elif access.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(
                config_file=access.kubeconfig, context=access.context, client_configuration=configuration
            )
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as e:
        raise KubernetesConfigError(f"cannot load the Kubernetes configuration: {e}") from e
    return k8s.ApiClient(configuration)


async def check_access(api_client: k8s.ApiClient, namespaces: Iterable[str]) -> None:
    """List pods once in each namespace: the API answers and the worker may read there."""
    api = PodApi(api_client)
    for namespace in sorted(set(namespaces)):
        try:
            await api.list_pods(namespace, selector=pods.SELECTOR, limit=1)
        except ApiFailure as e:
            raise KubernetesConfigError(f"namespace {namespace}: cannot list pods: {e.reason}: {e}") from e


def runtimes_of(config: PlatformConfig) -> dict[str, KubernetesRuntime]:
    """The kubernetes settings of every `provider: kubernetes` runtime."""
    return {
        r.name: r.kubernetes
        for r in config.runtimes
        if r.provider == KUBERNETES_PROVIDER and r.kubernetes is not None
    }


def check_certificates(runtimes: Mapping[str, KubernetesRuntime], *, can_issue: bool) -> None:
    """Every runtime's host pods get a certificate: the provider issues them (it needs the platform
    CA) unless the runtime names a Secret of its own."""
    missing = sorted(name for name, s in runtimes.items() if s.certificateSecret is None)
    if missing and not can_issue:
        raise KubernetesConfigError(
            f"runtimes {', '.join(missing)}: host pods need certificates: give the worker the platform "
            "CA (--platform-ca) to issue them, or name each runtime's kubernetes.certificateSecret"
        )


def validate_templates(runtimes: Mapping[str, KubernetesRuntime], *, control_plane: str) -> None:
    """Build a sample pod of every runtime and check it against the Kubernetes schema;
    KubernetesConfigError naming the runtime and the template's field if one is wrong."""
    problems = []
    for name, settings in runtimes.items():
        sample = HostSpec(
            runtime=name, hostId=f"{name}-0", adapter="python", provider="kubernetes", stateDir="/"
        )
        pod = pods.build_pod(sample, settings, control_plane=control_plane)
        problems += [f"runtimes[{name}].kubernetes.{p}" for p in pods.schema_problems(pod)]
    if problems:
        raise KubernetesConfigError("invalid pod template:\n" + "\n".join(f"  {p}" for p in problems))


# --- the API, with every library error turned into a reason ---------------------------------------


class ApiFailure(Exception):
    def __init__(self, reason: FailureReason, message: str, *, status: int = 0) -> None:
        super().__init__(message[:_MAX_MESSAGE])
        self.reason = reason
        self.status = status


def classify(status: int, body: Mapping[str, Any]) -> tuple[FailureReason, str]:
    """The reason of an API error answer, and its message (from the Status object)."""
    message = str(body.get("message") or body.get("reason") or f"HTTP {status}")
    if status == 401:
        return FailureReason.Forbidden, f"the API server did not accept the worker's credentials: {message}"
    if status == 403:
        if "exceeded quota" in message:
            return FailureReason.QuotaExceeded, message
        if _RBAC_REFUSAL.search(message):
            return FailureReason.Forbidden, message
        return FailureReason.AdmissionDenied, message  # PodSecurity, LimitRange, webhooks
    if status == 422:
        return FailureReason.AdmissionDenied, message
    if status == 429 or status >= 500:
        return FailureReason.ApiUnavailable, f"the API server answered {status}: {message}"
    return FailureReason.OperationRejected, f"the API server answered {status}: {message}"


class PodApi:
    """The pod calls the provider makes, answering (status, JSON body); transport errors and
    answers that are not JSON become ApiFailure."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = API_TIMEOUT_S) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        kwargs.update(_preload_content=False, _request_timeout=self.timeout_s)
        try:
            response = await method(*args, **kwargs)
            async with response:
                status, raw = response.status, await response.read()
        except ApiException as e:  # the client refused to build the request
            raise ApiFailure(
                FailureReason.UnexpectedError, f"the Kubernetes client failed: {e.reason}"
            ) from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiFailure(
                FailureReason.ApiUnavailable, f"the API server is unreachable: {type(e).__name__}: {e}"
            ) from e
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as e:
            raise ApiFailure(
                FailureReason.InvalidResponse, f"the API server answered {status} without JSON"
            ) from e
        return status, body if isinstance(body, dict) else {}

    @staticmethod
    def _fail(status: int, body: Mapping[str, Any]) -> ApiFailure:
        reason, message = classify(status, body)
        return ApiFailure(reason, message, status=status)

    async def _answer(
        self, method: Any, *args: Any, absent: tuple[int, ...], **kwargs: Any
    ) -> dict[str, Any] | None:
        """The body of a 2xx answer; None for a status in `absent`; any other status is ApiFailure."""
        status, body = await self._call(method, *args, **kwargs)
        if status in absent:
            return None
        if not 200 <= status < 300:
            raise self._fail(status, body)
        return body

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._answer(self.core.read_namespaced_pod, name, namespace, absent=(404,))

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The created pod, or None when one of that name exists already (409)."""
        return await self._answer(self.core.create_namespaced_pod, namespace, pod, absent=(409,))

    async def delete_pod(self, namespace: str, name: str, *, uid: str, grace_s: int) -> bool:
        """True if the pod of that uid is being deleted now; False if absent or another uid."""
        options = {"gracePeriodSeconds": grace_s, "preconditions": {"uid": uid}}
        # 404 absent, 409 the uid precondition failed: a newer pod, not ours.
        deleting = await self._answer(
            self.core.delete_namespaced_pod, name, namespace, body=options, absent=(404, 409)
        )
        return deleting is not None

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._answer(self.core.read_namespaced_secret, name, namespace, absent=(404,))

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> bool:
        """True if created; False when one of that name exists already (409)."""
        created = await self._answer(self.core.create_namespaced_secret, namespace, secret, absent=(409,))
        return created is not None

    async def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """True if patched; False when absent or changed meanwhile (its uid and resourceVersion
        in the patch are preconditions)."""
        patched = await self._answer(
            self.core.patch_namespaced_secret, name, namespace, patch, absent=(404, 409)
        )
        return patched is not None

    async def delete_secret(self, namespace: str, name: str, *, uid: str) -> bool:
        options = {"preconditions": {"uid": uid}}
        deleted = await self._answer(
            self.core.delete_namespaced_secret, name, namespace, body=options, absent=(404, 409)
        )
        return deleted is not None

    async def list_pods(self, namespace: str, *, selector: str, limit: int | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"label_selector": selector}
        if limit is not None:
            kwargs["limit"] = limit
        body = await self._answer(self.core.list_namespaced_pod, namespace, absent=(), **kwargs)
        if body is None or not isinstance(body.get("items", []), list):
            raise ApiFailure(FailureReason.InvalidResponse, "the pod list has no items")
        return body


# --- the provider ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRef:
    """One pod of this control plane as the provider lists it."""

    runtime: str
    host_id: str
    name: str
    namespace: str
    uid: str
    phase: str
    deleting: bool


class KubernetesProvider:
    """Hosts as pods, for the runtimes whose settings it is given, owned by ``control_plane``."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        runtimes: Mapping[str, KubernetesRuntime],
        control_plane: str,
        issuer: HostIssuer | None = None,
        name: str = KUBERNETES_PROVIDER,
        rpc_timeout_s: float = 5.0,
        api_timeout_s: float = API_TIMEOUT_S,
    ) -> None:
        check_certificates(runtimes, can_issue=issuer is not None)
        self._collectors: dict[str, OrphanCollector] = {}
        self.name = name
        self.issuer = issuer
        self.control_plane = pods.check_control_plane_id(control_plane)
        self.runtimes = dict(runtimes)
        self.rpc_timeout_s = rpc_timeout_s
        self._api = PodApi(api_client, timeout_s=api_timeout_s)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._changed: dict[str, asyncio.Event] = {}
        self._seen: dict[str, dict[str, Any] | None] = {}  # the last pod the watch saw, by name
        self._uid_lock = asyncio.Lock()
        self._reserved_slots: set[int] = set()  # uid slots of pods being posted now
        # Where the search for a free uid slot starts: random, so two workers rarely pick one
        # slot at once, and moving on, so a slot just freed is not handed out again at once.
        self._next_slot = random.randrange(pods.UID_SLOTS)

    @property
    def namespaces(self) -> set[str]:
        return {settings.namespace for settings in self.runtimes.values()}

    def pod_name(self, runtime: str, host_id: str) -> str:
        return pods.pod_name(control_plane=self.control_plane, runtime=runtime, host_id=host_id)

    def notify(self, pod: dict[str, Any], *, deleted: bool = False) -> None:
        """The watch saw this pod change: a create waiting for it decides on it at once (a
        deleted pod is read again, so its end is confirmed by the API)."""
        name = pods.PodFacts.of(pod).name
        event = self._changed.get(name)
        if event is not None:
            self._seen[name] = None if deleted else pod
            event.set()

    # -- create --------------------------------------------------------------------------------------

    async def create(self, spec: HostSpec) -> CreatedHost:
        settings = self._settings(spec.runtime, ProviderOperation.Create, spec.hostId, spec.tenant)
        desired = pods.build_pod(spec, settings, control_plane=self.control_plane)
        name, namespace = desired["metadata"]["name"], settings.namespace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.startTimeoutSeconds
        failing = _Context(self, ProviderOperation.Create, spec.hostId, spec.tenant)
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        async with lock:
            self._changed[name] = asyncio.Event()
            self._seen.pop(name, None)
            try:
                pod = await failing.api(self._existing_or_new(desired, namespace, deadline, spec))
                uid = pods.PodFacts.of(pod).uid
                try:
                    await failing.api(self._ensure_certificate(spec, settings, pod))
                    ready = await self._await_serving(pod, spec, settings, deadline, failing)
                except BaseException:
                    await self._discard(spec, namespace, name, uid)
                    raise
            finally:
                self._changed.pop(name, None)
                self._seen.pop(name, None)
        facts = pods.PodFacts.of(ready)
        address = facts.address()
        assert address is not None  # _await_serving returns a pod that answered at its address
        log.info("host pod ready", extra={"host": spec.hostId, "pod": name, "uid": uid, "address": address})
        return CreatedHost(
            provider=self.name,
            runtime=spec.runtime,
            hostId=spec.hostId,
            hostUid=uid,
            address=address,
            pid=None,
            createdAt=_created_at(ready),
        )

    async def _existing_or_new(
        self, desired: dict[str, Any], namespace: str, deadline: float, spec: HostSpec
    ) -> dict[str, Any]:
        """The pod to wait for: the existing one if it is this pod as built now, else a new one."""
        name = desired["metadata"]["name"]
        want = desired["metadata"]["annotations"][pods.ANNOTATION_TEMPLATE_HASH]
        for _ in range(3):  # a pod created or deleted by someone else meanwhile: look again
            existing = await self._api.read_pod(namespace, name)
            if existing is not None:
                facts = pods.PodFacts.of(existing)
                if not facts.owned_by(self.control_plane):
                    raise ApiFailure(
                        FailureReason.OperationRejected,
                        f"pod {namespace}/{name} exists and is not this control plane's",
                    )
                if (
                    facts.annotations.get(pods.ANNOTATION_TEMPLATE_HASH) == want
                    and not facts.deleting
                    and not facts.finished
                    and facts.uid
                ):
                    log.info("adopting host pod", extra={"host": spec.hostId, "pod": name, "uid": facts.uid})
                    return existing
                log.info("replacing host pod", extra={"host": spec.hostId, "pod": name, "uid": facts.uid})
                await self._delete_and_wait(namespace, name, facts.uid, deadline)
            created = await self._create_with_uids(spec, namespace, desired)
            if created is not None:
                if not pods.PodFacts.of(created).uid:
                    raise ApiFailure(
                        FailureReason.InvalidResponse, f"pod {namespace}/{name} was created without a uid"
                    )
                return created
        raise ApiFailure(
            FailureReason.OperationFailed, f"pod {namespace}/{name} kept changing under the create"
        )

    async def _create_with_uids(
        self, spec: HostSpec, namespace: str, desired: dict[str, Any]
    ) -> dict[str, Any] | None:
        """POST the pod with a uid range no other host pod of the runtimes' namespaces holds
        (kubernetes_pods.uid_range); None when the name is taken, or when another worker gave
        another pod the same range meanwhile: once its pod exists, a creator that sees another
        pod holding its range deletes its own, so two pods never keep one."""
        async with self._uid_lock:
            slot = self._free_slot(await self._slots_held() | self._reserved_slots)
            self._reserved_slots.add(slot)
        try:
            created = await self._create_or_discard(spec, namespace, pods.with_uid_slot(desired, slot))
            uid = pods.PodFacts.of(created).uid if created is not None else ""
            if created is None or not uid:
                return created
            try:
                shared = slot in await self._slots_held(besides=uid)
            except BaseException:
                await self._discard(spec, namespace, desired["metadata"]["name"], uid)
                raise
            if not shared:
                return created
            log.warning("uid range taken by another pod meanwhile", extra={"host": spec.hostId, "slot": slot})
            await self._discard(spec, namespace, desired["metadata"]["name"], uid)
            return None
        finally:
            self._reserved_slots.discard(slot)

    async def _slots_held(self, *, besides: str = "") -> set[int]:
        """The uid slots of the host pods (of any control plane) in the runtimes' namespaces, but
        the pod of uid `besides`: every pod holds its slot until it is gone from the API."""
        held = set()
        for namespace in sorted(self.namespaces):
            answer = await self._api.list_pods(namespace, selector=pods.SELECTOR)
            for item in answer.get("items") or []:
                if isinstance(item, dict) and pods.PodFacts.of(item).uid != besides:
                    slot = pods.uid_slot(item)
                    if slot is not None:
                        held.add(slot)
        return held

    def _free_slot(self, taken: set[int]) -> int:
        for step in range(pods.UID_SLOTS):
            slot = (self._next_slot + step) % pods.UID_SLOTS
            if slot not in taken:
                self._next_slot = (slot + 1) % pods.UID_SLOTS
                return slot
        raise ApiFailure(
            FailureReason.OperationFailed, f"all {pods.UID_SLOTS} uid ranges of host pods are held"
        )

    async def _create_or_discard(
        self, spec: HostSpec, namespace: str, desired: dict[str, Any]
    ) -> dict[str, Any] | None:
        """POST the pod; cancelled mid-request, wait for the answer and delete what it created, so
        a cancel between the POST and its reply leaves no pod behind."""
        creating = asyncio.ensure_future(self._api.create_pod(namespace, desired))
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                created = await asyncio.wait_for(creating, timeout=_DISCARD_WAIT_S)
                uid = pods.PodFacts.of(created).uid if created is not None else None
                if uid:
                    await self._discard(spec, namespace, desired["metadata"]["name"], uid)
            raise

    async def _ensure_certificate(
        self, spec: HostSpec, settings: KubernetesRuntime, pod: dict[str, Any]
    ) -> None:
        """The pod's certificate Secret, issued for this pod (owned by its uid) unless the runtime
        names a Secret of its own. The pod waits in ContainerCreating until it exists."""
        if settings.certificateSecret is not None:
            return
        assert self.issuer is not None  # check_certificates
        uid = pods.PodFacts.of(pod).uid
        name = pods.certificate_secret(spec, settings, control_plane=self.control_plane)
        for _ in range(3):
            existing = await self._api.read_secret(settings.namespace, name)
            if existing is not None:
                if _owner_uids(existing) == {uid}:
                    return  # an adopted pod's, or a create retried after a crash
                if not _ours(existing, self.control_plane):
                    raise ApiFailure(
                        FailureReason.OperationRejected,
                        f"secret {settings.namespace}/{name} exists and is not this control plane's",
                    )
                await self._api.delete_secret(settings.namespace, name, uid=_uid(existing))
            files = await asyncio.to_thread(self.issuer.files, runtime=spec.runtime, host_id=spec.hostId)
            secret = pods.build_secret(
                spec, control_plane=self.control_plane, namespace=settings.namespace, pod=pod, files=files
            )
            if await self._api.create_secret(settings.namespace, secret):
                log.info("issued a host certificate", extra={"host": spec.hostId, "secret": name})
                return
        raise ApiFailure(FailureReason.OperationFailed, f"secret {settings.namespace}/{name} kept changing")

    async def renew_certificates(self, *, now: datetime | None = None) -> int:
        """Re-issue the certificate Secrets this provider issued whose certificate is stale (due for
        renewal, or its ca.crt not the CA's current bundle, or not signed by the current CA key:
        a CA rotation's steps); how many. The kubelet updates the mounted
        files and the host takes them up; failures are logged and tried again next time."""
        if self.issuer is None:
            return 0
        renewed = 0
        for ref in await self.list_pods():
            settings = self.runtimes.get(ref.runtime)
            if settings is None or settings.certificateSecret is not None or ref.deleting:
                continue
            try:
                renewed += await self._renew_certificate(ref, settings, now=now or datetime.now(UTC))
            except (ApiFailure, ValueError) as e:
                log.warning("cannot renew a host certificate", extra={"pod": ref.name, "error": str(e)})
        return renewed

    async def _renew_certificate(self, ref: PodRef, settings: KubernetesRuntime, *, now: datetime) -> int:
        assert self.issuer is not None
        name = self.pod_name(ref.runtime, ref.host_id) + "-tls"
        secret = await self._api.read_secret(settings.namespace, name)
        if secret is None or _owner_uids(secret) != {ref.uid} or not _ours(secret, self.control_plane):
            return 0
        data = secret.get("data") or {}
        pem = base64.b64decode(data.get(TLS_CERT, ""), validate=True)
        bundle = base64.b64decode(data.get(CA_CERT, ""), validate=True)
        authority = self.issuer.authority
        if not authority.stale(x509.load_pem_x509_certificate(pem), bundle, now=now):
            return 0
        files = await asyncio.to_thread(self.issuer.files, runtime=ref.runtime, host_id=ref.host_id)
        metadata = secret.get("metadata") or {}
        patch = {
            "metadata": {"uid": metadata.get("uid"), "resourceVersion": metadata.get("resourceVersion")},
            "data": {key: base64.b64encode(files[key]).decode() for key in pods.CERT_KEYS},
        }
        if not await self._api.patch_secret(settings.namespace, name, patch):
            return 0
        log.info("renewed a host certificate", extra={"host": ref.host_id, "secret": name})
        return 1

    async def _delete_certificate(self, runtime: str, host_id: str, *, pod_uid: str) -> None:
        """Delete the certificate Secret issued for pod `pod_uid` (the garbage collector does too;
        this makes it prompt). A newer pod's Secret is never touched; failures are only logged."""
        settings = self.runtimes.get(runtime)
        if settings is None or settings.certificateSecret is not None:
            return
        name = self.pod_name(runtime, host_id) + "-tls"
        try:
            existing = await self._api.read_secret(settings.namespace, name)
            if (
                existing is not None
                and _owner_uids(existing) == {pod_uid}
                and _ours(existing, self.control_plane)
            ):
                await self._api.delete_secret(settings.namespace, name, uid=_uid(existing))
        except ApiFailure as e:
            log.warning("could not delete a host certificate secret", extra={"secret": name, "error": str(e)})

    async def _delete_and_wait(self, namespace: str, name: str, uid: str, deadline: float) -> None:
        await self._api.delete_pod(namespace, name, uid=uid, grace_s=_DISCARD_GRACE_S)
        loop = asyncio.get_running_loop()
        while True:
            pod = await self._api.read_pod(namespace, name)
            if pod is None or pods.PodFacts.of(pod).uid != uid:
                return
            if loop.time() >= deadline:
                raise ApiFailure(
                    FailureReason.ReadinessTimeout, f"pod {namespace}/{name} ({uid}) is still being deleted"
                )
            await asyncio.sleep(_POLL_FIRST_S)

    async def _await_serving(
        self,
        pod: dict[str, Any],
        spec: HostSpec,
        settings: KubernetesRuntime,
        deadline: float,
        failing: _Context,
    ) -> dict[str, Any]:
        """Wait until the pod is Running and Ready and its Runtime Server answers as that pod."""
        loop = asyncio.get_running_loop()
        facts = pods.PodFacts.of(pod)
        name, uid = facts.name, facts.uid
        wake = self._changed[name]
        poll = _POLL_FIRST_S
        problem = pods.Verdict("starting", FailureReason.ReadinessTimeout, "not looked at yet")
        while True:
            verdict = pods.assess(pod)
            if verdict.failed:
                assert verdict.reason is not None
                raise failing.error(verdict.reason, f"pod {settings.namespace}/{name}: {verdict.message}")
            if verdict.state == "ready":
                address = pods.PodFacts.of(pod).address()
                if address is None:
                    problem = pods.Verdict(
                        "starting", FailureReason.ReadinessTimeout, "Ready without an IP and grpc port"
                    )
                else:
                    remaining = max(deadline - loop.time(), 0.05)
                    try:
                        identity = await identify(address, timeout_s=min(self.rpc_timeout_s, remaining))
                    except HostRpcError as e:
                        problem = pods.Verdict("starting", FailureReason.ReadinessTimeout, f"Ready, but {e}")
                    else:
                        if (identity.host_uid, identity.host_id, identity.runtime) == (
                            uid,
                            spec.hostId,
                            spec.runtime,
                        ):
                            return pod
                        raise failing.error(
                            FailureReason.OperationFailed,
                            f"{address} serves host {identity.host_id!r} ({identity.runtime}, uid "
                            f"{identity.host_uid}), not pod {name} ({uid})",
                        )
            else:
                problem = verdict
            remaining = deadline - loop.time()
            if remaining <= 0:
                assert problem.reason is not None
                raise failing.error(
                    problem.reason,
                    f"pod {settings.namespace}/{name} was not serving within "
                    f"{settings.startTimeoutSeconds:g}s: {problem.message}",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(poll, remaining))
            woken = wake.is_set()
            wake.clear()
            poll = min(poll * 1.5, _POLL_MAX_S)
            seen = self._seen.pop(name, None)
            if woken and seen is not None and pods.PodFacts.of(seen).uid == uid:
                pod = seen  # what the watch just saw: no need to read it again
                continue
            try:
                current = await self._api.read_pod(settings.namespace, name)
            except ApiFailure as e:
                if e.reason is not FailureReason.ApiUnavailable:
                    raise failing.error(e.reason, str(e)) from e
                problem = pods.Verdict("starting", e.reason, str(e))  # until the deadline
                continue
            if current is None or pods.PodFacts.of(current).uid != uid:
                raise failing.error(
                    FailureReason.HostLost, f"pod {settings.namespace}/{name} ({uid}) was deleted"
                )
            pod = current

    async def _discard(self, spec: HostSpec, namespace: str, name: str, uid: str) -> None:
        """Delete a pod whose create failed or was cancelled, even while being cancelled."""

        async def deleting() -> None:
            await self._api.delete_pod(namespace, name, uid=uid, grace_s=_DISCARD_GRACE_S)
            await self._delete_certificate(spec.runtime, spec.hostId, pod_uid=uid)

        task = asyncio.ensure_future(deleting())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await task
            raise
        except ApiFailure as e:
            # The orphan collector deletes it later: it is this control plane's and no pool knows it.
            log.warning(
                "could not delete a host pod that did not start", extra={"pod": name, "error": str(e)}
            )

    # -- delete, probe, gone --------------------------------------------------------------------------

    async def delete(self, *, runtime: str, host_id: str, host_uid: str) -> bool:
        failing = _Context(self, ProviderOperation.Delete, host_id, None)
        try:
            validate_dns1123_label(host_id, field="hostId")
        except ValueError as e:
            raise failing.error(FailureReason.OperationRejected, str(e)) from e
        settings = self._settings(runtime, ProviderOperation.Delete, host_id, None)
        if not host_uid:
            raise failing.error(FailureReason.OperationRejected, "delete needs the pod's uid")
        name = self.pod_name(runtime, host_id)
        deleted = await failing.api(
            self._api.delete_pod(settings.namespace, name, uid=host_uid, grace_s=settings.deleteGraceSeconds)
        )
        log.info("host pod delete", extra={"pod": name, "uid": host_uid, "deleted": deleted})
        await self._delete_certificate(runtime, host_id, pod_uid=host_uid)
        return deleted

    async def probe(self, host: CreatedHost) -> bool:
        """The pod of that uid exists, is not deleting, is Ready, and its Runtime Server serves as it."""
        failing = _Context(self, ProviderOperation.Status, host.hostId, None)
        settings = self._settings(host.runtime, ProviderOperation.Status, host.hostId, None)
        pod = await failing.api(
            self._api.read_pod(settings.namespace, self.pod_name(host.runtime, host.hostId))
        )
        if pod is None:
            return False
        facts = pods.PodFacts.of(pod)
        if facts.uid != host.hostUid or facts.deleting or facts.finished or not facts.ready:
            return False
        return await serves(host, timeout_s=self.rpc_timeout_s)

    async def verdict(self, *, runtime: str, host_id: str, host_uid: str, address: str | None) -> bool | None:
        """Fencing: True when that pod is proven gone (its uid no longer exists, it ended, or it is
        deleting and out of routing), False when it may still run, None when the API cannot say."""
        settings = self.runtimes.get(runtime)
        if settings is None:
            return None
        try:
            pod = await self._api.read_pod(settings.namespace, self.pod_name(runtime, host_id))
        except ApiFailure:
            return None
        if pod is None:
            return True
        facts = pods.PodFacts.of(pod)
        if facts.uid != host_uid or facts.finished:
            return True
        if not facts.deleting:
            return False
        if not facts.ready or not address:
            return True
        try:
            identity = await identify(address, timeout_s=self.rpc_timeout_s)
        except HostRpcError:
            return True  # deleting and no longer serving: out of routing
        return identity.host_uid != host_uid

    async def gone(self, host: CreatedHost) -> bool:
        """Whether that pod is proven unable to serve (no side effects); False when unsure."""
        return await self._verdict_of(host) is True

    async def fence(self, host: CreatedHost) -> Fenced:
        """Delete that pod at once (no grace: a frozen host cannot handle SIGTERM, and a dead one
        needs none) and see it gone from the API — a pod that failed or crashed too, so no ended
        pod is left behind; or, where it stays (a finalizer), see it ended or deleting and out of
        routing. Its certificate Secret goes with it. Not fenced while it still answers as that
        incarnation, or while the API cannot say."""
        settings = self._settings(host.runtime, ProviderOperation.Fence, host.hostId, None)
        pod_name = self.pod_name(host.runtime, host.hostId)
        name = f"{settings.namespace}/{pod_name}"
        failing = _Context(self, ProviderOperation.Fence, host.hostId, None)
        gone = await failing.api(self._gone_from_api(settings.namespace, pod_name, host.hostUid))
        how = "gone"
        if not gone:
            await failing.api(self._api.delete_pod(settings.namespace, pod_name, uid=host.hostUid, grace_s=0))
            gone = await failing.api(
                self._gone_from_api(settings.namespace, pod_name, host.hostUid, wait_s=_FENCE_WAIT_S)
            )
            how = "deleted with no grace and gone"
        if not gone:
            verdict = await self._verdict_of(host)
            if verdict is not True:
                why = (
                    "still answers as that incarnation" if verdict is False else "cannot be read from the API"
                )
                return Fenced(False, f"pod {name} ({host.hostUid}) was deleted but {why}")
            how = "deleted with no grace; it stays (a finalizer), ended or out of routing"
        await self._delete_certificate(host.runtime, host.hostId, pod_uid=host.hostUid)
        return Fenced(True, f"pod {name} ({host.hostUid}): {how}")

    async def _gone_from_api(self, namespace: str, name: str, uid: str, *, wait_s: float = 0.0) -> bool:
        """Whether the pod of that uid no longer exists (absent, or its name is another pod's),
        looking again for up to `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        poll = _POLL_FIRST_S
        while True:
            pod = await self._api.read_pod(namespace, name)
            if pod is None or pods.PodFacts.of(pod).uid != uid:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(poll, remaining))
            poll = min(poll * 2, _POLL_MAX_S)

    async def collect_orphans(
        self, *, runtime: str, known: Collection[str], creating: Collection[str], grace_s: float
    ) -> list[str]:
        """Delete this runtime's pods that no pool knows once they stayed unknown for `grace_s`
        (in this process); the host ids deleted. Not this provider's runtime: nothing."""
        if runtime not in self.runtimes:
            return []
        collector = self._collectors.get(runtime)
        if collector is None:
            collector = self._collectors[runtime] = OrphanCollector(self, grace_s=grace_s)
        collector.grace_s = grace_s
        swept = await collector.sweep(known=known, runtime=runtime, creating=creating)
        return [ref.host_id for ref in swept.deleted]

    async def _verdict_of(self, host: CreatedHost) -> bool | None:
        return await self.verdict(
            runtime=host.runtime, host_id=host.hostId, host_uid=host.hostUid, address=host.address
        )

    # -- listing --------------------------------------------------------------------------------------

    async def list_pods(self) -> list[PodRef]:
        """Every pod of this control plane in the runtimes' namespaces (other control planes'
        pods and pods without our labels are never listed)."""
        found = []
        for namespace in sorted(self.namespaces):
            answer = await _Context(self, ProviderOperation.Status, None, None).api(
                self._api.list_pods(namespace, selector=pods.platform_selector(self.control_plane))
            )
            for item in answer.get("items") or []:
                facts = pods.PodFacts.of(item) if isinstance(item, dict) else None
                if facts is None or not facts.owned_by(self.control_plane) or not facts.uid:
                    continue
                found.append(
                    PodRef(
                        runtime=facts.runtime,
                        host_id=facts.host_id,
                        name=facts.name,
                        namespace=facts.namespace or namespace,
                        uid=facts.uid,
                        phase=facts.phase,
                        deleting=facts.deleting,
                    )
                )
        return found

    async def lost(self, hosts: Iterable[tuple[str, str, str]]) -> set[str]:
        """Of (runtime, hostId, hostUid) triples, the host uids whose pod no longer exists or ended:
        one list per namespace instead of one read per host."""
        wanted = list(hosts)
        if not wanted:
            return set()
        alive = {ref.uid for ref in await self.list_pods() if ref.phase not in ("Failed", "Succeeded")}
        return {uid for runtime, _, uid in wanted if runtime in self.runtimes and uid not in alive}

    async def delete_pod(self, ref: PodRef) -> bool:
        settings = self.runtimes.get(ref.runtime)
        grace = settings.deleteGraceSeconds if settings is not None else 30
        failing = _Context(self, ProviderOperation.Delete, ref.host_id or None, None)
        deleted = await failing.api(self._api.delete_pod(ref.namespace, ref.name, uid=ref.uid, grace_s=grace))
        await self._delete_certificate(ref.runtime, ref.host_id, pod_uid=ref.uid)
        return deleted

    # -- helpers --------------------------------------------------------------------------------------

    def _settings(
        self, runtime: str, operation: ProviderOperation, host: str | None, tenant: str | None
    ) -> KubernetesRuntime:
        settings = self.runtimes.get(runtime)
        if settings is None:
            raise _Context(self, operation, host, tenant).error(
                FailureReason.OperationRejected,
                f"runtime {runtime!r:.80} has no kubernetes settings (provider: kubernetes, kubernetes: ...)",
            )
        return settings


@dataclass(frozen=True)
class _Context:
    """What a failure of one provider operation is reported with."""

    provider: KubernetesProvider
    operation: ProviderOperation
    host: str | None
    tenant: str | None

    def error(self, reason: FailureReason, message: str) -> ProviderError:
        return provider_error(
            reason,
            provider=self.provider.name,
            operation=self.operation,
            host=self.host,
            tenant=self.tenant,
            message=message[:_MAX_MESSAGE],
        )

    async def api(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except ApiFailure as e:
            raise self.error(e.reason, str(e)) from e


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(o.get("uid")) for o in owners if isinstance(o, dict) and o.get("kind") == "Pod"}


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _ours(obj: Mapping[str, Any], control_plane: str) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(pods.ANNOTATION_CONTROL_PLANE) == control_plane)


def _created_at(pod: dict[str, Any]) -> datetime:
    text = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(UTC)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# --- orphans ---------------------------------------------------------------------------------------


@dataclass
class Sweep:
    deleted: list[PodRef] = field(default_factory=list)
    waiting: list[PodRef] = field(default_factory=list)  # unknown, within their grace period


class OrphanCollector:
    """Deletes pods of this control plane that no pool knows, once they stayed unknown for
    ``grace_s`` (longer than a create takes, so a pod being created is never collected).

    The caller says which host uids the pools know; pods of other control planes are never
    listed, so never touched.
    """

    def __init__(self, provider: KubernetesProvider, *, grace_s: float) -> None:
        self.provider = provider
        self.grace_s = grace_s
        self._unknown_since: dict[str, float] = {}

    async def sweep(
        self, *, known: Collection[str], runtime: str | None = None, creating: Collection[str] = ()
    ) -> Sweep:
        """`runtime`: only that runtime's pods; `creating`: host ids a scale-out is creating now
        (their pods may exist before any pool knows them)."""
        now = time.monotonic()
        result = Sweep()
        seen = set()
        for ref in await self.provider.list_pods():
            if ref.uid in known or (runtime is not None and ref.runtime != runtime):
                continue
            if ref.host_id in creating:
                continue
            seen.add(ref.uid)
            since = self._unknown_since.setdefault(ref.uid, now)
            if ref.deleting:
                continue
            if now - since >= self.grace_s:
                if await self.provider.delete_pod(ref):
                    log.warning("deleted an orphan host pod", extra={"pod": ref.name, "uid": ref.uid})
                    result.deleted.append(ref)
            else:
                result.waiting.append(ref)
        self._unknown_since = {uid: t for uid, t in self._unknown_since.items() if uid in seen}
        return result
