"""What the Temporal UI and `temporal workflow describe` show of each workflow: a one-line static
summary (at most MAX_SUMMARY_BYTES), static details and a Run's current details (Markdown).

One definition for the starters (the SDK, the schedules, the worker) and the workflows, so a
Run reads the same however it was started. Summaries (`summary`, one line: what a workflow,
activity or timer is) are `Plain`: the payload converter marks them and the payload codec leaves
them unencrypted, so the Temporal UI's list and `temporal workflow list/describe` show them
without the codec server. Details (static and current: Markdown tables, a Run's status message)
are payloads the codec encrypts like any other. Both are written to be shown to any operator:
never an env value, a secret's content, a token or a source file's content — only names, sizes
and a digest.
"""

from __future__ import annotations

import hashlib
import json

from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus

MAX_SUMMARY_BYTES = 200  # what the Temporal UI shows in its list; longer summaries are cut
MAX_DETAILS_BYTES = 4096


def _cut(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


class Plain(str):
    """Text for operators that is stored unencrypted (kruntimes.temporal.connect.PayloadConverter)."""

    __slots__ = ()


def summary(text: str) -> Plain:
    """A summary on one line, within MAX_SUMMARY_BYTES, stored unencrypted."""
    return Plain(_cut(" ".join(text.split()), MAX_SUMMARY_BYTES))


def details(text: str) -> str:
    return _cut(text, MAX_DETAILS_BYTES)


def spec_digest(run: Run) -> str:
    """sha256 of the spec with every env value left out: two Runs of the same code and settings
    have the same digest, and the digest tells nothing about a secret."""
    spec = run.spec.model_dump(mode="json")
    spec["env"] = sorted(spec.get("env") or {})
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_summary(run: Run) -> Plain:
    """`function python default/hello`, `task python team-a/nightly-20250101120000 by
    schedule:admin`: who created the Run, when it says, plain in its history for every operator."""
    meta = run.metadata
    by = f" by {meta.creator}" if meta.creator is not None else ""
    return summary(f"{run.spec.mode.kind} {run.spec.runtime} {meta.namespace}/{meta.name}{by}")


def run_details(run: Run, *, endpoint: str | None = None) -> str:
    """The Run as an operator wants it at a glance: what runs where, with which limits."""
    spec, meta = run.spec, run.metadata
    if spec.source.path is not None:
        source = f"`{spec.source.path}`"
    else:
        files = spec.source.inline or []
        source = f"inline, {len(files)} file{'s' if len(files) != 1 else ''}"
    mode: str = spec.mode.kind
    if spec.mode.function is not None and spec.mode.function.idleTimeoutSeconds is not None:
        mode += f" (idle timeout {spec.mode.function.idleTimeoutSeconds} s)"
    rows = [
        ("uid", f"`{meta.uid or ''}`"),
        ("runtime", f"`{spec.runtime}`"),
        ("mode", mode),
        ("handler", f"`{spec.handler}`"),
        ("source", source),
        ("env", ", ".join(f"`{k}`" for k in sorted(spec.env)) or "—"),
        ("envFrom", ", ".join(f"`{e.secretRef.name}`" for e in spec.envFrom) or "—"),
        ("timeout", f"{spec.timeoutSeconds} s" if spec.timeoutSeconds is not None else "none"),
        ("retries", f"{spec.retryPolicy.limit}"),
        ("ttl after finished", _ttl(spec.ttlSecondsAfterFinished)),
        ("tenant", f"`{spec.tenant}`" if spec.tenant else "shared"),
        ("creator", f"`{meta.creator}`" if meta.creator is not None else "none"),
        ("spec sha256", f"`{spec_digest(run)}`"),
    ]
    if endpoint is not None:
        rows.append(("endpoint", f"`{endpoint}`"))
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return details(f"### Run {meta.namespace}/{meta.name}\n\n| | |\n|---|---|\n{table}\n")


def run_current(status: RunStatus, *, reason: str) -> str:
    """A Run's current details: phase, reason, message, attempt, host, endpoint."""
    lines = [f"**{status.phase.value}** — {reason}" + (f": {status.message}" if status.message else "")]
    facts = [f"attempt {status.attempt}"] if status.attempt else []
    if status.recoveries:
        facts.append(f"recoveries {status.recoveries}")
    if status.assignedHost:
        facts.append(f"host `{status.assignedHost}`")
    if facts:
        lines.append(" · ".join(facts))
    if status.endpoint is not None:
        lines.append(f"endpoint `{status.endpoint.url}`")
    return details("\n\n".join(lines))


def _ttl(seconds: int | None) -> str:
    return f"{seconds} s" if seconds is not None else "24 h (default)"


def queue_details(*, paused: bool, by: str, message: str, queued: int) -> str:
    """A pool's current details once an operator paused, resumed or drained its admission:
    `**Paused** by alice (12 queued): maintenance` (names and the operator's message only)."""
    who = f" by {by}" if by else ""
    return details(f"**{'Paused' if paused else 'Admitting'}**{who} ({queued} queued): {message}")
