"""The custom search attributes of RunWorkflow: one definition for everything that reads or
writes them (the dev server registers them, the starter sets them at the start, the workflow
upserts them, the SDK and the gateway's known-Runs view read them).

SQL visibility (the dev server's) allows 10 custom Keyword attributes per namespace; these are 7.
Search attributes are indexes in plain text: never put a secret in one.

KrtHost is the host id the Run is assigned to (status.assignedHost), upserted with the phase:
`KrtHost='python-3' AND ExecutionStatus='Running'` lists the Runs on that host. A Run keeps the
host it ended on; while it waits for a new host (recovering) it is empty.

A finished Run's workflow closes; its RetentionWorkflow (running until the Run's
ttlSecondsAfterFinished is out) carries the Run's attributes with its final phase, so the Runs
that exist are the running RunWorkflows and RetentionWorkflows (`LISTED`). A deleted Run's
workflow (if it still runs) and its retention say KrtPhase=Deleted before anything is removed:
visibility is eventually consistent and drops a deleted execution only later, the Deleted phase
is indexed like any other.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run

PHASE = "KrtPhase"
RUNTIME = "KrtRuntime"
NAMESPACE = "KrtNamespace"
MODE = "KrtMode"
TENANT = "KrtTenant"
RUN_UID = "KrtRunUid"
HOST = "KrtHost"

# name → Temporal indexed value type, as `temporal operator search-attribute create` takes it
DEFINITIONS: dict[str, str] = {
    name: "Keyword" for name in (PHASE, RUNTIME, NAMESPACE, MODE, TENANT, RUN_UID, HOST)
}

DELETED = "Deleted"  # the KrtPhase of a deleted Run (not a RunPhase: the Run no longer exists)
# The Runs that exist: running, or finished and kept for their ttlSecondsAfterFinished.
LISTED = (
    "WorkflowType IN ('RunWorkflow', 'RetentionWorkflow') AND ExecutionStatus='Running' "
    f"AND {PHASE} != '{DELETED}'"
)

KRT_PHASE = SearchAttributeKey.for_keyword(PHASE)
KRT_RUNTIME = SearchAttributeKey.for_keyword(RUNTIME)
KRT_NAMESPACE = SearchAttributeKey.for_keyword(NAMESPACE)
KRT_MODE = SearchAttributeKey.for_keyword(MODE)
KRT_TENANT = SearchAttributeKey.for_keyword(TENANT)
KRT_RUN_UID = SearchAttributeKey.for_keyword(RUN_UID)
KRT_HOST = SearchAttributeKey.for_keyword(HOST)


def run_values(run: Run, *, phase: RunPhase = RunPhase.Pending) -> list[tuple[SearchAttributeKey[str], str]]:
    """A Run's search attributes (its uid must be set) with the given phase."""
    return [
        (KRT_PHASE, phase.value),
        (KRT_RUNTIME, run.spec.runtime),
        (KRT_NAMESPACE, run.metadata.namespace),
        (KRT_MODE, run.spec.mode.kind),
        (KRT_TENANT, run.spec.tenant or ""),
        (KRT_RUN_UID, run.metadata.uid or ""),
    ]


def listed(*, namespace: str | None = None, phase: RunPhase | None = None, run_uid: str | None = None) -> str:
    """The visibility query of the existing Runs; the values must be validated names (DNS
    labels, a uid) or a RunPhase: they are put in the query as they are."""
    query = LISTED
    if namespace is not None:
        query += f" AND {NAMESPACE}='{namespace}'"
    if phase is not None:
        query += f" AND {PHASE}='{phase.value}'"
    if run_uid is not None:
        query += f" AND {RUN_UID}='{run_uid}'"
    return query


def at_start(run: Run) -> TypedSearchAttributes:
    """What a starter sets when it starts the Run's workflow (the workflow upserts only what is missing)."""
    return TypedSearchAttributes([SearchAttributePair(key, value) for key, value in run_values(run)])


def finished(run: Run, *, phase: str, host: str) -> TypedSearchAttributes:
    """What a finished Run's RetentionWorkflow carries: the Run's attributes, its final phase (or
    DELETED) and host."""
    pairs = [SearchAttributePair(key, phase if key is KRT_PHASE else value) for key, value in run_values(run)]
    return TypedSearchAttributes([*pairs, SearchAttributePair(KRT_HOST, host)])
