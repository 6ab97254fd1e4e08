"""What the Temporal UI shows of a Function's workflow: its one-line summary (plain) and its
current details (Markdown), as kruntimes.wire.summaries does for Runs. Names, counts and the
platform's words only: never an env value or a source file."""

from __future__ import annotations

from kruntimes.api.function import Function, FunctionStatus
from kruntimes.wire.summaries import Plain, details, summary


def function_summary(fn: Function) -> Plain:
    """`function python default/hello (1..10 replicas) by cli:alice`."""
    meta, scale = fn.metadata, fn.spec.scale
    by = f" by {meta.creator}" if meta.creator is not None else ""
    return summary(
        f"Function {fn.spec.runtime} {meta.namespace}/{meta.name} ({scale.min}..{scale.max} replicas){by}"
    )


def function_current(status: FunctionStatus) -> str:
    """Phase, message, revision, replicas wanted/ready, endpoint."""
    lines = [f"**{status.phase.value}**" + (f": {status.message}" if status.message else "")]
    revision = f"revision {status.revision}"
    if status.observedRevision != status.revision:
        revision += f" (rolling out from {status.observedRevision or 'none'})"
    counts = status.replicas
    lines.append(f"{revision} · replicas {counts.ready}/{counts.wanted} Ready, {counts.total} in all")
    if status.endpoint is not None:
        lines.append(f"endpoint `{status.endpoint.url}`")
    return details("\n\n".join(lines))
