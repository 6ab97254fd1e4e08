"""The verbs the kubernetes provider and its watch call, listed from what the API server saw
them send, are exactly ``VERBS`` and exactly the worker's Role in docs/kubernetes.md (a chart's
RBAC can be compared with the same list)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from kruntimes.activities.hosts.events import HostEventKind, HostEventQueue
from kruntimes.activities.hosts.kubernetes import SECRET_VERBS, VERBS, OrphanCollector
from kruntimes.activities.hosts.kubernetes_watch import PodWatch
from tests.kubernetes.conftest import NAMESPACE, spec
from tests.kubernetes.verbs import VERB_OF
from tests.support.waiting import eventually

KUBERNETES_DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def documented_role() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", KUBERNETES_DOC.read_text(), flags=re.S)
    for block in blocks:
        for document in yaml.safe_load_all(block):
            if isinstance(document, dict) and document.get("kind") == "Role":
                return document
    raise AssertionError("docs/kubernetes.md shows no Role for the worker")


async def test_the_provider_calls_exactly_the_verbs_of_the_workers_role(env) -> None:
    queue = HostEventQueue()
    watch = PodWatch(env.api, namespace=NAMESPACE, control_plane="cp-a", on_event=queue)
    task = asyncio.create_task(watch.run())
    try:
        provider = env.provider()
        host = await provider.create(spec("python-0"))
        await provider.create(spec("python-0"))  # adopts: reads it
        assert await provider.probe(host)
        assert await provider.renew_certificates(now=datetime.now(UTC) + timedelta(days=3650)) == 1
        await provider.verdict(
            runtime="python", host_id="python-0", host_uid=host.hostUid, address=host.address
        )
        orphan = await provider.create(spec("python-1"))
        await OrphanCollector(provider, grace_s=0).sweep(known={host.hostUid})
        await provider.delete(runtime="python", host_id="python-0", host_uid=host.hostUid)
        await eventually(lambda: not env.pods(), what="both pods deleted")
        seen = []
        await eventually(
            lambda: (
                seen.extend(queue._queue.get_nowait() for _ in range(queue._queue.qsize()))
                or sum(e.kind is HostEventKind.Deleted for e in seen) >= 2
            )
        )
        assert orphan.hostUid in {e.host_uid for e in seen}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    ours = [r for r in list(env.cluster) if r.headers.get("User-Agent", "").startswith("OpenAPI-Generator")]
    called: dict[str, set[str]] = {}
    for r in ours:
        if r.resource is not None and r.action in VERB_OF:
            called.setdefault(r.resource.plural, set()).add(VERB_OF[r.action])
    assert called == {"pods": set(VERBS), "secrets": set(SECRET_VERBS)}
    role = documented_role()
    rules = {tuple(rule["resources"]): (rule["apiGroups"], set(rule["verbs"])) for rule in role["rules"]}
    assert rules == {("pods",): ([""], set(VERBS)), ("secrets",): ([""], set(SECRET_VERBS))}
