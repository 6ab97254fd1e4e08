"""The Temporal SDK's side of the Runs' search attributes (kruntimes.wire.search names them): the
typed keys, and the attributes a starter sets and a finished Run's retention carries."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from kruntimes.api.function import Function, FunctionPhase
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.wire.search import (
    FUNCTION,
    HOST,
    MODE,
    NAMESPACE,
    PHASE,
    PHASE_SINCE,
    RUN_UID,
    RUNTIME,
    TENANT,
    TRAFFIC,
    TRAFFIC_SINCE,
)

KRT_PHASE = SearchAttributeKey.for_keyword(PHASE)
KRT_RUNTIME = SearchAttributeKey.for_keyword(RUNTIME)
KRT_NAMESPACE = SearchAttributeKey.for_keyword(NAMESPACE)
KRT_MODE = SearchAttributeKey.for_keyword(MODE)
KRT_TENANT = SearchAttributeKey.for_keyword(TENANT)
KRT_RUN_UID = SearchAttributeKey.for_keyword(RUN_UID)
KRT_HOST = SearchAttributeKey.for_keyword(HOST)
KRT_PHASE_SINCE = SearchAttributeKey.for_datetime(PHASE_SINCE)
KRT_FUNCTION = SearchAttributeKey.for_keyword(FUNCTION)
KRT_TRAFFIC = SearchAttributeKey.for_keyword(TRAFFIC)
KRT_TRAFFIC_SINCE = SearchAttributeKey.for_datetime(TRAFFIC_SINCE)


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


def at_start(run: Run) -> TypedSearchAttributes:
    """What a starter sets when it starts the Run's workflow (the workflow upserts only what is missing)."""
    return TypedSearchAttributes([SearchAttributePair(key, value) for key, value in run_values(run)])


def finished(run: Run, *, phase: str, host: str) -> TypedSearchAttributes:
    """What a finished Run's RetentionWorkflow carries: the Run's attributes, its final phase (or
    DELETED) and host."""
    pairs = [SearchAttributePair(key, phase if key is KRT_PHASE else value) for key, value in run_values(run)]
    return TypedSearchAttributes([*pairs, SearchAttributePair(KRT_HOST, host)])


def function_values(
    fn: Function, *, phase: FunctionPhase = FunctionPhase.Pending
) -> list[tuple[SearchAttributeKey[str], str]]:
    """A Function's workflow's search attributes (its uid must be set) with the given phase."""
    return [
        (KRT_PHASE, phase.value),
        (KRT_NAMESPACE, fn.metadata.namespace),
        (KRT_FUNCTION, fn.metadata.uid or ""),
    ]


def function_at_start(fn: Function) -> TypedSearchAttributes:
    """What a starter sets when it starts a Function's workflow (the workflow upserts what is missing)."""
    return TypedSearchAttributes([SearchAttributePair(key, value) for key, value in function_values(fn)])


def replica_at_start(run: Run, *, function_uid: str) -> TypedSearchAttributes:
    """A replica Run's attributes at its start: a Run's, and its Function's uid."""
    return TypedSearchAttributes(
        [
            *(SearchAttributePair(key, value) for key, value in run_values(run)),
            SearchAttributePair(KRT_FUNCTION, function_uid),
        ]
    )


def invocation_values(
    *, namespace: str, target_kind: str, target_uid: str, runtime: str = "", state: str
) -> list[tuple[SearchAttributeKey[str], str]]:
    """An InvocationWorkflow's search attributes (as the gateway sets them): its namespace, its
    state as KrtPhase, its target's uid as KrtRunUid and its runtime as KrtRuntime (a Run) or its
    uid as KrtFunction (a Function)."""
    if target_kind == "Function":
        return [(KRT_NAMESPACE, namespace), (KRT_PHASE, state), (KRT_FUNCTION, target_uid)]
    values = [(KRT_NAMESPACE, namespace), (KRT_PHASE, state), (KRT_RUN_UID, target_uid)]
    return values + ([(KRT_RUNTIME, runtime)] if runtime else [])


def invocation_at_start(
    *, namespace: str, target_kind: str, target_uid: str, runtime: str = ""
) -> TypedSearchAttributes:
    """What a starter of an InvocationWorkflow sets (KrtPhase Queued; the workflow upserts the rest)."""
    values = invocation_values(
        namespace=namespace, target_kind=target_kind, target_uid=target_uid, runtime=runtime, state="Queued"
    )
    return TypedSearchAttributes([SearchAttributePair(key, value) for key, value in values])
