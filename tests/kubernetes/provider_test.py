"""The kubernetes provider against the test cluster: real pods of real `krt host` processes."""

from __future__ import annotations

import asyncio
import base64
import signal
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.activities.hosts._rpc import identify
from kruntimes.config.runtimes import KubernetesPodTemplate
from kruntimes.decisions.scheduling.failures import DEFAULT_RETRYABLE, FailureReason, ProviderError
from kruntimes.pki import CA_CERT, CA_KEY, AuthorityWatch, HostIssuer, Identity, identity_of, renewal_due
from kruntimes.pki import rotation as ca_rotation
from kruntimes.runtime.sandbox.identity import UidRange
from tests.kubernetes.conftest import IMAGE, NAMESPACE, spec
from tests.support.waiting import eventually


async def test_create_makes_one_pod_whose_uid_is_the_host_uid_and_which_serves(env) -> None:
    provider = env.provider()
    host = await provider.create(spec())
    [pod] = env.pods()
    assert host.hostUid == pod["metadata"]["uid"]
    assert (
        host.address
        == f"{pod['status']['podIP']}:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"
    )
    identity = await identify(host.address, timeout_s=2)
    assert (identity.host_uid, identity.host_id, identity.runtime) == (host.hostUid, "python-0", "python")
    assert await provider.probe(host)
    assert pod["metadata"]["labels"][pods.LABEL_HOST_ID] == "python-0"

    assert await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
    await eventually(lambda: not env.pods(), what="the pod is gone after its grace")
    assert env.kubelet.running() == []
    assert not await provider.probe(host)
    assert await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid) is False


async def test_a_second_create_adopts_the_pod_as_a_restarted_worker_would(env) -> None:
    first = await env.provider().create(spec())
    again = await env.provider().create(spec())  # another provider: what a restarted worker has
    assert again.hostUid == first.hostUid and again.address == first.address
    assert len(env.pods()) == 1 and env.kubelet.started == [env.pods()[0]["metadata"]["name"]]


async def test_a_pod_of_another_template_is_replaced(env) -> None:
    first = await env.provider().create(spec())
    changed = env.provider(deleteGraceSeconds=7)  # another template hash
    second = await changed.create(spec())
    assert second.hostUid != first.hostUid
    [pod] = env.pods()
    assert pod["metadata"]["uid"] == second.hostUid
    await eventually(lambda: len(env.kubelet.running()) == 1, what="the old process is stopped")


async def test_a_stale_delete_with_another_uid_deletes_nothing(env) -> None:
    provider = env.provider()
    host = await provider.create(spec())
    stale = "00000000-0000-4000-8000-000000000000"
    assert await provider.delete(runtime="python", host_id="python-0", host_uid=stale) is False
    [pod] = env.pods()
    assert pod["metadata"]["uid"] == host.hostUid and "deletionTimestamp" not in pod["metadata"]
    assert await provider.probe(host)


@pytest.mark.parametrize(
    ("fault", "reason", "words"),
    [
        ("image-pull", FailureReason.ImagePullFailed, "ImagePullBackOff"),
        ("unschedulable", FailureReason.Unschedulable, "Insufficient cpu"),
        ("crash", FailureReason.HostCrashed, "exit code 137"),
        ("crashloop", FailureReason.HostCrashed, "CrashLoopBackOff; last exit: exit code 1"),
        ("evict", FailureReason.HostLost, "evicted: The node was low on resource: memory"),
    ],
)
async def test_a_pod_that_cannot_start_fails_the_create_precisely_and_is_deleted(env, fault, reason, words):
    env.kubelet.faults["python"] = fault
    with pytest.raises(ProviderError) as caught:
        await env.provider(startTimeoutSeconds=2.0).create(spec())
    failure = caught.value.failure
    assert failure.reason is reason, failure
    assert failure.retryable is DEFAULT_RETRYABLE[reason]
    assert words in failure.message
    await eventually(lambda: not env.pods(), what="no pod left behind")
    await eventually(lambda: not env.kubelet.running(), what="no process left behind")


@pytest.mark.parametrize(
    ("status", "api_reason", "message", "reason"),
    [
        (
            403,
            "Forbidden",
            'pods "p" is forbidden: exceeded quota: hosts, requested: pods=1, used: pods=4, limited: pods=4',
            FailureReason.QuotaExceeded,
        ),
        (
            403,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:krt:worker" cannot create resource "pods" in API group "" in the namespace "krt-hosts"',
            FailureReason.Forbidden,
        ),
        (
            403,
            "Forbidden",
            'pods "p" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true',
            FailureReason.AdmissionDenied,
        ),
        (
            422,
            "Invalid",
            'admission webhook "policy.example" denied the request: no latest tags',
            FailureReason.AdmissionDenied,
        ),
        (
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            FailureReason.ApiUnavailable,
        ),
        (401, "Unauthorized", "Unauthorized", FailureReason.Forbidden),
    ],
)
async def test_refused_creates_report_the_reason_and_leave_no_pod(env, status, api_reason, message, reason):
    env.cluster.refuse(runtime="python", status=status, reason=api_reason, message=message)
    with pytest.raises(ProviderError) as caught:
        await env.provider().create(spec())
    assert caught.value.failure.reason is reason
    assert caught.value.failure.retryable is DEFAULT_RETRYABLE[reason]
    assert env.pods() == [] and len(env.cluster.refused) == 1


async def test_an_unreachable_api_is_api_unavailable(env) -> None:
    from kruntimes.activities.hosts.kubernetes import KubernetesAccess, KubernetesProvider, connect
    from tests.kubernetes.conftest import runtime
    from tests.support.ports import refusing_port

    with refusing_port() as port:
        api = await connect(KubernetesAccess(host=f"http://127.0.0.1:{port}"))
        try:
            provider = KubernetesProvider(
                api, runtimes={"python": runtime()}, control_plane="cp-a", issuer=env.pki.issuer()
            )
            with pytest.raises(ProviderError) as caught:
                await provider.create(spec())
            assert caught.value.failure.reason is FailureReason.ApiUnavailable
            assert caught.value.failure.retryable
        finally:
            await api.close()


async def test_a_cancelled_create_deletes_its_pod(env) -> None:
    env.kubelet.faults["python"] = "unschedulable"  # it waits for the scheduler until cancelled
    task = asyncio.create_task(env.provider().create(spec()))
    await eventually(lambda: env.pods(), what="the pod exists")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.pods() == []


async def test_a_create_cancelled_before_the_api_answered_deletes_the_pod_it_made(env) -> None:
    env.cluster.create_replies = asyncio.Event()  # the pod is stored; its reply is held
    task = asyncio.create_task(env.provider().create(spec()))
    await eventually(lambda: env.pods(), what="the pod exists")
    task.cancel()
    env.cluster.create_replies.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.pods() == []
    assert env.cluster.secrets(NAMESPACE) == []


async def test_a_create_for_a_runtime_without_settings_is_rejected(env) -> None:
    with pytest.raises(ProviderError) as caught:
        await env.provider().create(spec("other-0", runtime="other"))
    assert caught.value.failure.reason is FailureReason.OperationRejected
    assert env.pods() == []


async def test_gone_is_proven_only_by_the_pods_own_record(env) -> None:
    provider = env.provider()
    host = await provider.create(spec())
    args = {"runtime": "python", "host_id": "python-0", "host_uid": host.hostUid, "address": host.address}
    assert await provider.verdict(**args) is False
    process = env.kubelet.process(env.pods()[0]["metadata"]["name"])
    process.kill()  # the container died: phase Failed (restartPolicy Never)
    await eventually(
        lambda: env.pods()[0]["status"]["phase"] == "Failed", what="the kubelet reports it", within=30
    )
    assert await provider.verdict(**args) is True
    assert await provider.verdict(**{**args, "host_uid": "00000000-0000-4000-8000-000000000000"}) is True

    again = await provider.create(spec())  # replaces the failed pod: never reused
    assert again.hostUid != host.hostUid
    assert await provider.verdict(**args) is True, "the old uid is gone, a newer pod has the name"
    assert await provider.delete(runtime="python", host_id="python-0", host_uid=again.hostUid)
    await eventually(lambda: not env.pods())
    assert await provider.verdict(**{**args, "host_uid": again.hostUid}) is True


async def test_a_deleting_pod_is_gone_once_it_no_longer_serves(env) -> None:
    provider = env.provider(deleteGraceSeconds=30)
    host = await provider.create(spec())
    name = env.pods()[0]["metadata"]["name"]
    process = env.kubelet.process(name)
    process.send_signal(signal.SIGSTOP)  # it cannot stop within the grace period: still there
    try:
        assert await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
        await eventually(lambda: env.pods() and env.pods()[0]["metadata"].get("deletionTimestamp"))
        args = {"runtime": "python", "host_id": "python-0", "host_uid": host.hostUid, "address": host.address}
        # deleting, still Ready by its last status, and a stopped process does not answer
        assert await provider.verdict(**args) is True
    finally:
        process.send_signal(signal.SIGCONT)


async def test_a_fence_deletes_the_pod_at_once_and_proves_it_gone(env) -> None:
    provider = env.provider(deleteGraceSeconds=30)
    host = await provider.create(spec())
    [pod] = env.pods()
    process = env.kubelet.process(pod["metadata"]["name"])
    process.send_signal(signal.SIGSTOP)  # frozen: it could not handle a graceful stop
    try:
        assert not await provider.gone(host)
        fenced = await provider.fence(host)
        assert fenced.fenced, fenced.how
        assert await provider.gone(host)
        assert env.cluster.secrets(NAMESPACE) == [], "its certificate went with it"
        deletes = [r for r in env.cluster["delete"] if r.resource is not None and r.resource.plural == "pods"]
        assert [r.data.get("gracePeriodSeconds") for r in deletes] == [0]
        assert (await provider.fence(host)).fenced, "fencing again is proven at once"
    finally:
        process.send_signal(signal.SIGCONT)


async def test_a_fence_deletes_a_pod_whose_host_died_and_proves_it_gone(env) -> None:
    """A crashed host's pod (phase Failed) is deleted by the fence with no grace, and is gone from
    the API when the fence returns: ended pods never pile up under a crash loop."""
    provider = env.provider(deleteGraceSeconds=30)
    host = await provider.create(spec())
    env.kubelet.process(env.pods()[0]["metadata"]["name"]).kill()
    await eventually(
        lambda: env.pods()[0]["status"]["phase"] == "Failed", what="the kubelet reports it", within=30
    )
    assert await provider.gone(host), "a pod that ended is proven unable to serve"
    fenced = await provider.fence(host)
    assert fenced.fenced and "deleted with no grace and gone" in fenced.how, fenced.how
    assert env.pods() == [] and env.cluster.secrets(NAMESPACE) == []
    deletes = [r for r in env.cluster["delete"] if r.resource is not None and r.resource.plural == "pods"]
    assert [r.data.get("gracePeriodSeconds") for r in deletes] == [0]


async def test_a_fence_of_an_older_incarnation_leaves_the_newer_pod_alone(env) -> None:
    provider = env.provider()
    old = await provider.create(spec())
    env.kubelet.process(env.pods()[0]["metadata"]["name"]).kill()
    await eventually(
        lambda: env.pods()[0]["status"]["phase"] == "Failed", what="the kubelet reports it", within=30
    )
    new = await provider.create(spec())
    assert new.hostUid != old.hostUid
    assert (await provider.fence(old)).fenced
    assert [p["metadata"]["uid"] for p in env.pods()] == [new.hostUid]
    assert await provider.probe(new)


async def _serving_as(env, address: str, host_id: str) -> bool:
    expect = Identity.host(runtime="python", host_id=host_id)
    async with env.pki.aio_channel(address, as_=env.pki.control_plane, host=expect) as channel:
        try:
            await channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError:
            return False
    return True


def _secret_of(env, pod: dict) -> dict | None:
    return env.cluster.secret(pod["metadata"]["namespace"], pod["metadata"]["name"] + "-tls")


async def test_each_pod_gets_a_certificate_of_its_own_identity_owned_by_it(env) -> None:
    """The host pod's certificate names that host (the control plane's channel checks it) and its
    Secret is owned by the pod; deleting the host deletes the Secret."""
    provider = env.provider()
    host = await provider.create(spec())
    [pod] = env.pods()
    secret = _secret_of(env, pod)
    assert secret is not None
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [host.hostUid]
    assert sorted(secret["data"]) == ["assignments.pub", "ca.crt", "tls.crt", "tls.key"]
    # a channel that insists on host python-0's identity reaches it; one expecting another host fails
    assert await _serving_as(env, host.address, "python-0")
    assert not await _serving_as(env, host.address, "python-9")
    assert await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
    assert _secret_of(env, pod) is None


async def test_a_leftover_secret_of_an_older_pod_is_replaced_and_a_foreign_one_refused(env) -> None:
    provider = env.provider()
    first = await provider.create(spec())
    [pod] = env.pods()
    old_secret = _secret_of(env, pod)
    # the pod dies without its Secret being cleaned up (no garbage collector ran)
    env.cluster.collect_garbage = False
    changed = env.provider(deleteGraceSeconds=7)  # another template: the pod is replaced
    second = await changed.create(spec())
    [new_pod] = env.pods()
    new_secret = _secret_of(env, new_pod)
    assert new_secret["metadata"]["uid"] != old_secret["metadata"]["uid"]
    assert (
        [o["uid"] for o in new_secret["metadata"]["ownerReferences"]] == [second.hostUid] != [first.hostUid]
    )

    # a Secret of that name that this control plane did not make is never overwritten
    assert await changed.delete(runtime="python", host_id="python-0", host_uid=second.hostUid)
    await eventually(lambda: not env.pods(), what="the pod is gone")
    name = new_pod["metadata"]["name"] + "-tls"
    async with env.kubelet._session.post(
        f"{env.url}/api/v1/namespaces/{NAMESPACE}/secrets",
        json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {}},
    ) as answer:
        assert answer.status in (200, 201)
    with pytest.raises(ProviderError) as caught:
        await changed.create(spec())
    assert caught.value.failure.reason is FailureReason.OperationRejected
    assert "not this control plane's" in caught.value.failure.message
    await eventually(lambda: not env.pods(), what="the pod that could not get its certificate is deleted")
    assert env.cluster.secret(NAMESPACE, name)["data"] == {}, "the foreign Secret is left as it was"


def _certificate(secret: dict) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))


async def test_a_host_certificate_due_for_renewal_is_reissued_in_its_secret(env) -> None:
    provider = env.provider()
    host = await provider.create(spec())
    [secret] = env.cluster.secrets(NAMESPACE)
    old = _certificate(secret)
    assert await provider.renew_certificates() == 0, "not due yet"
    due = renewal_due(old) + timedelta(seconds=1)

    assert await provider.renew_certificates(now=due) == 1

    [renewed] = env.cluster.secrets(NAMESPACE)
    new = _certificate(renewed)
    assert new.serial_number != old.serial_number and new.not_valid_before_utc >= old.not_valid_before_utc
    lifetime = old.not_valid_after_utc - old.not_valid_before_utc
    assert new.not_valid_after_utc - new.not_valid_before_utc == lifetime, "a whole lifetime again"
    assert identity_of(new) == Identity.host(runtime="python", host_id="python-0")
    assert renewed["metadata"]["uid"] == secret["metadata"]["uid"], "renewed in place"
    assert [o["uid"] for o in renewed["metadata"]["ownerReferences"]] == [host.hostUid]
    assert await provider.probe(host)


async def test_a_host_secret_whose_ca_bundle_differs_is_reissued_through_a_ca_rotation(env, tmp_path) -> None:
    """The worker's issuer reads a CA directory that is rotated (the session CA's copy): its
    host Secret is re-issued with the two-CA bundle in phase 1, and by the new CA after the switch,
    each once."""
    ca_dir = tmp_path / "platform-ca"
    ca_dir.mkdir(mode=0o700)
    for name in (CA_CERT, CA_KEY):
        (ca_dir / name).write_bytes((env.pki.root / "ca" / name).read_bytes())
    ca_rotation.ensure(ca_dir, max_leaf_lifetime=timedelta(days=30))
    issuer = HostIssuer(AuthorityWatch(ca_dir), env.pki.signer.public_pem)
    provider = env.provider(issuer=issuer)
    host = await provider.create(spec())
    [secret] = env.cluster.secrets(NAMESPACE)
    assert await provider.renew_certificates() == 0

    published, _ = ca_rotation.ensure(ca_dir, max_leaf_lifetime=timedelta(days=30), start=True)
    assert await provider.renew_certificates() == 1
    [renewed] = env.cluster.secrets(NAMESPACE)
    assert base64.b64decode(renewed["data"][CA_CERT]) == published.bundle_pem()
    _certificate(renewed).verify_directly_issued_by(env.pki.authority.cert)  # the current CA still signs
    assert renewed["metadata"]["uid"] == secret["metadata"]["uid"], "renewed in place"
    assert await provider.renew_certificates() == 0, "once"
    assert await provider.probe(host)

    assert published.switch_after is not None and published.next is not None
    ca_rotation.ensure(ca_dir, max_leaf_lifetime=timedelta(days=30), now=published.switch_after)
    assert await provider.renew_certificates() == 1
    [switched] = env.cluster.secrets(NAMESPACE)
    _certificate(switched).verify_directly_issued_by(published.next.cert)
    assert x509.load_pem_x509_certificates(base64.b64decode(switched["data"][CA_CERT])) == [
        published.next.cert,
        env.pki.authority.cert,
    ]
    assert await provider.renew_certificates() == 0


async def test_a_runtimes_own_certificate_secret_is_never_renewed_by_the_worker(env) -> None:
    provider = env.provider(certificateSecret="own-{hostId}")
    assert await provider.renew_certificates(now=datetime.now(UTC) + timedelta(days=3650)) == 0


async def test_a_host_injected_into_a_pod_of_another_image_serves(env) -> None:
    """The template's image has no kruntimes: the init container installs the host into the
    emptyDir and the host container runs it from there."""
    template = KubernetesPodTemplate(image="registry.example/fn/set-labels:v0.2.1")
    provider = env.provider(podTemplate=template, hostInjection={"image": IMAGE})
    host = await provider.create(spec())
    [pod] = env.pods()
    [init] = pod["spec"]["initContainers"]
    assert init["image"] == IMAGE and init["command"][:2] == ["krt", "install-host"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == template.image
    assert container["command"] == [f"{pods.HOST_MOUNT}/bin/krt", "host"]
    assert env.kubelet.initialized == [(pod["metadata"]["name"], pods.INSTALL_CONTAINER, 0)]
    directory = env.kubelet.root / f"{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}"
    installed = directory / "volumes" / pods.HOST_VOLUME / "bin" / "krt"
    assert installed.is_file(), "the host process runs what the init container installed"
    identity = await identify(host.address, timeout_s=2)
    assert (identity.host_uid, identity.runtime) == (host.hostUid, "python")
    assert await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
    await eventually(lambda: not env.pods(), what="the pod is gone after its grace")


async def test_an_init_container_that_fails_fails_the_create(env) -> None:
    template = KubernetesPodTemplate(image="registry.example/fn/set-labels:v0.2.1")
    provider = env.provider(podTemplate=template, hostInjection={"image": IMAGE})
    env.kubelet.faults["python"] = "init-error"
    with pytest.raises(ProviderError):
        await provider.create(spec())
    assert [code for _, _, code in env.kubelet.initialized] == [1]
    assert env.kubelet.started == []


def _uid_range(pod: dict) -> UidRange:
    return UidRange.parse(pod["metadata"]["annotations"][pods.ANNOTATION_UID_RANGE])


async def test_host_pods_of_every_control_plane_get_uid_ranges_no_other_holds(env) -> None:
    """Uids are the node's: two host pods on one node must never hand out the same one. Each pod
    gets a range no other host pod of its namespace holds (two creates at once of one worker, and
    another control plane's), and its host runs on it."""
    ours, theirs = env.provider(), env.provider(control_plane="cp-b")
    await asyncio.gather(ours.create(spec("python-0")), ours.create(spec("python-1")), theirs.create(spec()))
    ranges = {p["metadata"]["name"]: _uid_range(p) for p in env.pods()}
    assert len(ranges) == 3
    spans = sorted((r.first, r.first + r.count) for r in ranges.values())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), spans
    for name, uids in ranges.items():
        argv = env.kubelet.process(name).args
        assert argv[argv.index("--uid-range") + 1] == f"{uids.first}-{uids.first + uids.count - 1}"


async def test_a_range_another_worker_gave_a_pod_meanwhile_is_given_up(env) -> None:
    """Two workers may pick one range at once: the one whose pod finds another holding it once it
    exists deletes its pod and creates it again on another range."""
    env.kubelet.faults["other"] = "unschedulable"  # the other worker's pod: it only has to exist
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "other-0", "namespace": NAMESPACE, "labels": {pods.LABEL_RUNTIME: "other"}},
        "spec": {"containers": [{"name": "host", "image": IMAGE}]},
    }
    base = f"{env.url}/api/v1/namespaces/{NAMESPACE}/pods"
    async with env.kubelet._session.post(base, json=other) as answer:
        assert answer.status in (200, 201)
    env.cluster.create_replies = asyncio.Event()  # our pod is stored; its reply is held
    task = asyncio.create_task(env.provider().create(spec()))
    first = await eventually(
        lambda: [p for p in env.pods() if p["metadata"]["name"] != "other-0"], what="our pod exists"
    )
    taken = first[0]["metadata"]["annotations"][pods.ANNOTATION_UID_RANGE]
    patch = {"metadata": {"annotations": {pods.ANNOTATION_UID_RANGE: taken}}}
    headers = {"Content-Type": "application/merge-patch+json"}
    async with env.kubelet._session.patch(f"{base}/other-0", json=patch, headers=headers) as answer:
        assert answer.status == 200
    env.cluster.create_replies.set()
    host = await task
    [pod] = [p for p in env.pods() if p["metadata"]["name"] != "other-0"]
    assert pod["metadata"]["uid"] == host.hostUid != first[0]["metadata"]["uid"]
    assert pod["metadata"]["annotations"][pods.ANNOTATION_UID_RANGE] != taken
