"""The names of an async invocation's workflow (issue #44) as the gateway spells them: the gateway
starts and reads InvocationWorkflows without pydantic, so it cannot import
kruntimes.contracts.invocation, which defines them; tests/contracts/async_names_test.py holds the two
equal.
"""

from __future__ import annotations

INVOCATION_WORKFLOW = "InvocationWorkflow"
TASK_QUEUE = "kruntimes"  # kruntimes.contracts.names.TASK_QUEUE: the worker's main queue
INVOCATION_STATUS_MEMO = "krtStatus"  # the workflow's status (an InvocationStatus, JSON)
INVOCATION_DIGEST_MEMO = "krtDigest"  # the request's digest (body, callback URL), set at the start
QUEUED = "Queued"
# kruntimes.contracts.invocation.InvocationState, in its order
STATES = ("Queued", "Running", "Succeeded", "Failed", "Unknown")
TERMINAL_STATES = frozenset({"Succeeded", "Failed", "Unknown"})


def invocation_workflow_id(namespace: str, target_uid: str, invocation_id: str) -> str:
    """The workflow id of one invocation (each part already validated)."""
    return f"invocation/{namespace}/{target_uid}/{invocation_id}"
