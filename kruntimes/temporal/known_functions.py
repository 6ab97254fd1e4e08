"""The known-Functions view: which Functions exist, as Temporal visibility shows their
FunctionWorkflows (KrtFunction: the Function's uid, KrtNamespace, KrtPhase), refreshed by what
changed in the background (known_runs.KnownView, the known-Runs view's machinery). The gateway
reads it when a Function has no replica route: it tells a Function that exists (hold the
invocation, wake its workflow: scale from zero) from a uid that names none (404), and gives the
workflow id to signal. The invoke path only reads the dict.

A FunctionWorkflow indexes no KrtPhaseSince, so a refresh asks for the Functions started and ended
(completed: deleted; or terminated from outside) since the last one; a Function that continued as
new shows again by its new run's StartTime. A Function being deleted (KrtPhase 'Deleted' while its
replicas drain) shows as such from the next full listing only: asking for that phase narrowly
would list every deleted Function visibility still keeps (closed ones keep their attributes for
the namespace's retention), every refresh; until then an invocation of it is held and its
workflow, which ignores the signal, woken for nothing. A full listing mends the rest, as for Runs.

A Function's traffic split (KrtTraffic) is read with it: a changed split is asked for by
`KrtTrafficSince >= T` alone (its own index: only the Functions whose split changed), so the
gateway honours a new split within a refresh or two, never asking Temporal on the invoke path.
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
    # (revision, percent) of its traffic split; (): every invocation to whichever replica has room
    traffic: tuple[tuple[int, int], ...] = ()

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
        # each a status's own index, as the known-Runs view asks (an IN or != reads every row)
        return (
            f"{FUNCTIONS} AND ExecutionStatus='Completed' AND CloseTime >= '{at}'",
            f"{FUNCTIONS} AND ExecutionStatus='Terminated' AND CloseTime >= '{at}'",
            f"{RUNNING} AND StartTime >= '{at}'",
            f"{search.TRAFFIC_SINCE} >= '{at}'",  # last: a changed split is the newest entry
        )

    def parse(self, execution: Execution) -> tuple[str, KnownFunction] | None:
        attrs = execution.search_attributes
        uid = attrs.get(search.FUNCTION, "")
        namespace, _, name = execution.workflow_id.removeprefix("function/").partition("/")
        if not uid or not name or namespace != attrs.get(search.NAMESPACE, namespace):
            return None
        # the few namespaces and phases are kept once (interned), not once a Function
        return uid, KnownFunction(
            namespace=sys.intern(namespace),
            name=name,
            phase=sys.intern(attrs.get(search.PHASE, "")),
            traffic=search.parse_traffic(attrs.get(search.TRAFFIC, "")),
        )
