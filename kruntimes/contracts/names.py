"""The names every party of the control plane agrees on: task queues, workflow ids, and the
names of signals, queries and updates.
"""

from __future__ import annotations

from datetime import datetime

from kruntimes.api.ids import HostId, Namespace, RuntimeName, RunUid

TASK_QUEUE = "kruntimes"
# Entity workflows poll their own queue: Runs waiting on them must never hold every task slot.
POOL_TASK_QUEUE = "kruntimes-pool"

# signal, query and update names
SIGNAL_CANCEL = "cancel"
SIGNAL_ASSIGNED = "assigned"
SIGNAL_REJECTED = "rejected"
SIGNAL_HOST_LOST = "host_lost"
QUERY_STATUS = "status"
UPDATE_DELETE = "delete"
SIGNAL_DELETE_NOW = "delete_now"  # RetentionWorkflow: a closed Run's delete
SIGNAL_ADMIT = "admit"
SIGNAL_ADMIT_MANY = "admit_many"
SIGNAL_RELEASE = "release"
SIGNAL_HOST_READY = "host_ready"
SIGNAL_SCALE_OUT_FAILED = "scale_out_failed"
SIGNAL_CONFIGURE = "configure"
SIGNAL_HOST_STATE = "host_state"
QUERY_POOL = "pool"
# An operator's admission control of a runtime (krt queue pause|resume|drain)
UPDATE_PAUSE_QUEUE = "pause_queue"
UPDATE_RESUME_QUEUE = "resume_queue"
UPDATE_DRAIN_QUEUE = "drain_queue"
# what the pool query fails with while a new pool run reads its hosts' reservations back
POOL_READING_BACK = "the pool is reading its hosts' reservations back after continuing as new"
SIGNAL_HOST_SLOTS = "slots"
SIGNAL_REGISTRATION_LOST = "registration_lost"
# HostWorkflow
SIGNAL_HOST_COMMAND = "command"
SIGNAL_PROVIDER_REPORT = "provider_report"
SIGNAL_WATCH_READY = "watch_ready"
QUERY_HOST = "host"
# The slots the pool handed over, read after every signal sent before it (a query may not be).
UPDATE_HOST_SLOTS = "read_slots"
# What the workflow keeps of its host's slots, as `slots_digest`: the pool hands a host over only
# when its HostWorkflow does not hold the same slots already.
QUERY_HOST_SLOTS_DIGEST = "slots_digest"
UPDATE_DRAIN_HOST = "drain"
UPDATE_DELETE_HOST = "delete"
# ReconcileWorkflow
SIGNAL_RECONCILE = "reconcile"
UPDATE_COLLECT = "collect"
QUERY_RECONCILE = "last"
# FunctionWorkflow (its `status` query is QUERY_STATUS, its `delete` update UPDATE_DELETE)
UPDATE_APPLY = "apply"
UPDATE_SCALE = "scale"
UPDATE_ROLLBACK = "rollback"
QUERY_REPLICAS = "replicas"
SIGNAL_FUNCTION_WAKE = "wake"  # a gateway holds an invocation of a Function without a Ready replica
# The ApplicationError type of an `apply` whose manifest names another Function (a different
# uid under the same name): the caller's 409.
FUNCTION_CONFLICT = "FunctionConflict"

DEFAULT_RETENTION_SECONDS = 24 * 3600  # how long a finished Run stays queryable without a ttl
MAX_ADMISSIONS_PER_SIGNAL = 100  # admissions in one admit_many signal: well within a payload


def run_workflow_id(namespace: Namespace, name: str) -> str:
    return f"run/{namespace}/{name}"


def run_of_workflow_id(workflow_id: str) -> tuple[str, str]:
    """(namespace, name) of a Run's workflow id; ("default", "run") for any other id."""
    kind, _, rest = workflow_id.partition("/")
    namespace, _, name = rest.partition("/")
    if kind != "run" or not namespace or not name or "/" in name:
        return ("default", "run")
    return (namespace, name)


def pool_workflow_id(runtime: RuntimeName) -> str:
    return f"pool/{runtime}"


def scale_out_workflow_id(runtime: RuntimeName, request_id: str) -> str:
    return f"scaleout/{runtime}/{request_id}"


def cleanup_workflow_id(run_uid: RunUid) -> str:
    return f"cleanup/{run_uid}"


def host_workflow_id(runtime: RuntimeName, host_id: HostId) -> str:
    return f"host/{runtime}/{host_id}"


def reconcile_workflow_id(runtime: RuntimeName) -> str:
    return f"reconcile/{runtime}"


def retention_workflow_id(run_uid: RunUid) -> str:
    return f"retention/{run_uid}"


def schedule_id(namespace: Namespace, name: str) -> str:
    """The Temporal Schedule of `krt schedule create NAME -n NAMESPACE`."""
    return f"schedule/{namespace}/{name}"


def scheduled_workflow_id(namespace: Namespace, name: str) -> str:
    """The id a schedule gives its ScheduledRunWorkflows; Temporal appends `-<scheduled time>`."""
    return f"scheduled/{namespace}/{name}"


SCHEDULED_STAMP = "%Y%m%d%H%M%S"  # the Run name's suffix: `<schedule>-20250101120000`
# A Run name is a DNS-1123 label (63 characters): the schedule's name leaves room for the stamp.
MAX_SCHEDULE_NAME = 63 - 1 - len("20250101120000")


def scheduled_run_name(schedule: str, at: datetime) -> str:
    return f"{schedule}-{at.strftime(SCHEDULED_STAMP)}"


def invoke_url(gateway_url: str, *, namespace: Namespace, runtime: RuntimeName, run_uid: RunUid) -> str:
    base = gateway_url.rstrip("/")
    return f"{base}/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{run_uid}:invoke"


def function_workflow_id(namespace: Namespace, name: str) -> str:
    return f"function/{namespace}/{name}"


def function_of_workflow_id(workflow_id: str) -> tuple[str, str] | None:
    """(namespace, name) of a Function's workflow id; None for any other id."""
    kind, _, rest = workflow_id.partition("/")
    namespace, _, name = rest.partition("/")
    if kind != "function" or not namespace or not name or "/" in name:
        return None
    return (namespace, name)


def function_invoke_url(gateway_url: str, *, namespace: Namespace, function_uid: str) -> str:
    """A Function's invoke URL: one for all its revisions and replicas; not the shape of a Run's
    (`invoke_url`), so neither uid is ever taken for the other."""
    base = gateway_url.rstrip("/")
    return f"{base}/v1/namespaces/{namespace}/functions/{function_uid}:invoke"
