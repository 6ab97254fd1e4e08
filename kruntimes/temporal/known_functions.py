"""The known-Functions view: which Functions exist, as Temporal visibility shows their
FunctionWorkflows (KrtFunction: the Function's uid, KrtNamespace, KrtPhase), refreshed by what
changed in the background (known_runs.KnownView, the known-Runs view's machinery). The gateway
reads it when a Function has no replica route: it tells a Function that exists (hold the
invocation, wake its workflow: scale from zero) from a uid that names none (404), and gives the
workflow id to signal. The invoke path only reads the dict.

A FunctionWorkflow indexes no KrtPhaseSince, so a refresh asks for the Functions started, ended
(completed: deleted; or terminated from outside) and being deleted (KrtPhase 'Deleted' while its
replicas drain) since the last one; a Function that continued as new shows again by its new run's
StartTime. A full listing mends the rest, as for Runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kruntimes.api.ids import Namespace
from kruntimes.contracts.names import function_workflow_id
from kruntimes.temporal.known_runs import Execution, KnownView
from kruntimes.wire import search

FUNCTIONS = "WorkflowType='FunctionWorkflow'"
RUNNING = f"{FUNCTIONS} AND ExecutionStatus='Running'"


@dataclass(frozen=True, slots=True)
class KnownFunction:
    namespace: str
    name: str
    phase: str

    @property
    def workflow_id(self) -> str:
        return function_workflow_id(Namespace(self.namespace), self.name)

    @property
    def deleted(self) -> bool:
        return self.phase == search.DELETED


class KnownFunctions(KnownView[KnownFunction]):
    """The Functions whose workflow runs, by Function uid."""

    FULL = RUNNING
    NAME = "known-Functions"

    def narrow(self, at: str) -> tuple[str, ...]:
        # those being deleted last: their entry (phase Deleted) wins over the one they started with
        return (
            f"{FUNCTIONS} AND ExecutionStatus='Completed' AND CloseTime >= '{at}'",
            f"{FUNCTIONS} AND ExecutionStatus='Terminated' AND CloseTime >= '{at}'",
            f"{RUNNING} AND StartTime >= '{at}'",
            f"{FUNCTIONS} AND {search.PHASE}='{search.DELETED}'",
        )

    def parse(self, execution: Execution) -> tuple[str, KnownFunction] | None:
        attrs = execution.search_attributes
        uid = attrs.get(search.FUNCTION, "")
        namespace, _, name = execution.workflow_id.removeprefix("function/").partition("/")
        if not uid or not name or namespace != attrs.get(search.NAMESPACE, namespace):
            return None
        # the few namespaces and phases are kept once (interned), not once a Function
        return uid, KnownFunction(
            namespace=sys.intern(namespace), name=name, phase=sys.intern(attrs.get(search.PHASE, ""))
        )
