"""The custom search attributes of RunWorkflow: one definition for everything that reads or
writes them (the dev server registers them, the starter sets them at the start, the workflow
upserts them, the SDK and the gateway's known-Runs view read them).

SQL visibility (the dev server's) allows 10 custom Keyword attributes per namespace (these are 9)
and 3 Datetime ones (KrtPhaseSince and KrtTrafficSince are two). Search attributes are indexes
in plain text: never put a secret in one.

KrtPhaseSince is when the Run's workflow last indexed its phase (its workflow time), upserted with
every phase: `KrtPhaseSince >= T` lists the Runs whose phase changed since T from the attribute's
own index, not by reading every Run (the gateway's known-Runs view refreshes that way). Only
RunWorkflows carry it (not their RetentionWorkflows); a Run started before it existed carries it
from its next phase change.

KrtHost is the host id the Run is assigned to (status.assignedHost), upserted with the phase:
`KrtHost='python-3' AND ExecutionStatus='Running'` lists the Runs on that host. A Run keeps the
host it ended on; while it waits for a new host (recovering) it is empty.

KrtFunction is a Function's uid, on its FunctionWorkflow and on the RunWorkflows of its replicas
(set when the Function's workflow starts them): `KrtFunction='<uid>'` lists a Function's
replicas. A FunctionWorkflow carries KrtNamespace and KrtPhase (the Function's phase) too, and
never KrtPhaseSince: the known-Runs view lists Runs only.

KrtTraffic is a Function's traffic split as its workflow resolved it, `<revision>:<percent>`
joined by commas in revision order (`3:80,4:20`; unset: every invocation to the current
revision), and KrtTrafficSince when it last changed (upserted with it): the gateway's
known-Functions view asks for `KrtTrafficSince >= T` to learn a changed split from that index alone.

A finished Run's workflow closes; its RetentionWorkflow (running until the Run's
ttlSecondsAfterFinished is out) carries the Run's attributes with its final phase, so the Runs
that exist are the running RunWorkflows and RetentionWorkflows (`LISTED`). A deleted Run's
workflow (if it still runs) and its retention say KrtPhase=Deleted before anything is removed:
visibility is eventually consistent and drops a deleted execution only later, the Deleted phase
is indexed like any other.

The names and queries here load no SDK (the gateway reads them); the SDK's typed keys and the
attributes a starter sets (KRT_*, run_values, at_start, finished) are kruntimes.wire.search_typed's.
"""

from __future__ import annotations

from kruntimes.api.phases import RunPhase

PHASE = "KrtPhase"
RUNTIME = "KrtRuntime"
NAMESPACE = "KrtNamespace"
MODE = "KrtMode"
TENANT = "KrtTenant"
RUN_UID = "KrtRunUid"
HOST = "KrtHost"
PHASE_SINCE = "KrtPhaseSince"
FUNCTION = "KrtFunction"
TRAFFIC = "KrtTraffic"
TRAFFIC_SINCE = "KrtTrafficSince"

# name → Temporal indexed value type, as `temporal operator search-attribute create` takes it
DEFINITIONS: dict[str, str] = {
    **{
        name: "Keyword"
        for name in (PHASE, RUNTIME, NAMESPACE, MODE, TENANT, RUN_UID, HOST, FUNCTION, TRAFFIC)
    },
    PHASE_SINCE: "Datetime",
    TRAFFIC_SINCE: "Datetime",
}

DELETED = "Deleted"  # the KrtPhase of a deleted Run (not a RunPhase: the Run no longer exists)
# The Runs that exist: running, or finished and kept for their ttlSecondsAfterFinished.
LISTED = (
    "WorkflowType IN ('RunWorkflow', 'RetentionWorkflow') AND ExecutionStatus='Running' "
    f"AND {PHASE} != '{DELETED}'"
)


# The Functions that exist: their workflows run until the Function is deleted.
FUNCTIONS_LISTED = f"WorkflowType='FunctionWorkflow' AND ExecutionStatus='Running' AND {PHASE} != '{DELETED}'"


def functions_listed(*, namespace: str | None = None, function_uid: str | None = None) -> str:
    """The visibility query of the existing Functions (validated names or a uid only)."""
    query = FUNCTIONS_LISTED
    if namespace is not None:
        query += f" AND {NAMESPACE}='{namespace}'"
    if function_uid is not None:
        query += f" AND {FUNCTION}='{function_uid}'"
    return query


# An async invocation's workflow (InvocationWorkflow, issue #44) carries KrtNamespace, KrtPhase (its
# state: Queued, Running, Succeeded, Failed, Unknown) and its target's uid as KrtRunUid (a Run) or
# KrtFunction (a Function); it runs until its retention is out, so the ids remembered are the open ones.
INVOCATIONS_LISTED = "WorkflowType='InvocationWorkflow' AND ExecutionStatus='Running'"


def invocations_listed(*, namespace: str, target_kind: str, target_uid: str, state: str | None = None) -> str:
    """The visibility query of a target's remembered invocations (validated names, a uid and an
    InvocationState only: they are put in the query as they are)."""
    attribute = FUNCTION if target_kind == "Function" else RUN_UID
    query = f"{INVOCATIONS_LISTED} AND {NAMESPACE}='{namespace}' AND {attribute}='{target_uid}'"
    if state is not None:
        query += f" AND {PHASE}='{state}'"
    return query


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


MAX_TRAFFIC_CHARS = 64  # two `revision:percent` pairs, with room


def traffic_value(split: dict[int, int]) -> str:
    """KrtTraffic's value for a split (revision → percent): `3:80,4:20`, revisions in order."""
    return ",".join(f"{revision}:{percent}" for revision, percent in sorted(split.items()))


def parse_traffic(value: str) -> tuple[tuple[int, int], ...]:
    """A KrtTraffic value's (revision, percent) pairs; () for an empty, malformed or
    out-of-bounds one (every invocation then goes to whichever replica has room)."""
    if not value or len(value) > MAX_TRAFFIC_CHARS:
        return ()
    pairs: list[tuple[int, int]] = []
    for item in value.split(","):
        revision, sep, percent = item.partition(":")
        if not sep or not revision.isdigit() or not percent.isdigit():
            return ()
        pairs.append((int(revision), int(percent)))
    if len(pairs) > 2 or sum(p for _, p in pairs) != 100 or len({r for r, _ in pairs}) != len(pairs):
        return ()
    return tuple(pairs)
