"""What the Temporal UI shows of an async invocation's workflow (issue #44): its one-line summary
(plain: target and invocation id), set by whoever starts it, as kruntimes.wire.summaries does for
Runs; the workflow writes its current details (state, attempts, error: workflows/invocation.py).
Names, ids and the platform's words only: never the body, the result or a secret."""

from __future__ import annotations

from kruntimes.wire.summaries import Plain, summary


def target_text(*, kind: str, namespace: str, name: str, uid: str) -> str:
    """`Run demo/echo` (the uid when the name is not known), `Function demo/hello`."""
    return f"{kind} {namespace}/{name or uid}"


def invocation_summary(*, kind: str, namespace: str, name: str, uid: str, invocation_id: str) -> Plain:
    """`Run demo/echo: invocation order-17`: a starter's static summary (the gateway's words)."""
    target = target_text(kind=kind, namespace=namespace, name=name, uid=uid)
    return summary(f"{target}: invocation {invocation_id}")
