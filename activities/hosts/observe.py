"""What every host-provider operation reports: a metric (through the Temporal runtime's meter, the
worker's Prometheus endpoint `--metrics-address`) and one structured log line, each naming the
operation, provider, runtime and result; the log line also names the host, tenant, duration and
the correlation id.

The correlation id is the scale-out request's id when a ScaleOutWorkflow asked (its workflow id
is scaleout/{runtime}/{request}), else the id of the workflow whose activity asked. Metrics carry
no host nor correlation id: one series per host or request would grow without bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from temporalio import activity
from temporalio.common import MetricMeter

from kruntimes.activities.hosts.circuit import CircuitState
from kruntimes.api._text import truncate_utf8
from kruntimes.api.limits import MAX_STATUS_MESSAGE_BYTES
from kruntimes.decisions.scheduling.failures import ProviderError, ProviderOperation

log = logging.getLogger(__name__)

OPERATIONS = "kruntimes_provider_operations"
DURATION = "kruntimes_provider_operation_duration_ms"
CIRCUIT = "kruntimes_provider_circuit_state"
SUCCEEDED = "Succeeded"
SCALE_OUT_WORKFLOW = "ScaleOutWorkflow"
# Room kept at the end of a failure's message for the correlation id.
_ID_ROOM = 128


@dataclass(frozen=True)
class Correlation:
    """Who asked for an operation: `id` to correlate, `request_id` when it is a scale-out's."""

    id: str | None = None
    request_id: str | None = None
    workflow_id: str | None = None
    attempt: int | None = None


def correlation() -> Correlation:
    """The asking activity's correlation; empty outside an activity."""
    if not activity.in_activity():
        return Correlation()
    info = activity.info()
    workflow_id = info.workflow_id or None
    request = None
    if workflow_id is not None and info.workflow_type == SCALE_OUT_WORKFLOW:
        request = workflow_id.rsplit("/", 1)[-1] or None
    return Correlation(
        id=request or workflow_id, request_id=request, workflow_id=workflow_id, attempt=info.attempt
    )


def correlated(err: ProviderError, who: Correlation) -> ProviderError:
    """`err` with the correlation id in its failure (`requestId`) and at the end of its message."""
    if who.id is None:
        return err
    failure = err.failure
    where = f"scale-out request {who.request_id}" if who.request_id else f"workflow {who.id}"
    message = truncate_utf8(failure.message, max_bytes=MAX_STATUS_MESSAGE_BYTES - _ID_ROOM)
    message = f"{message} ({where})" if message else f"({where})"
    return ProviderError(failure._replace(requestId=failure.requestId or who.request_id, message=message))


class ProviderMetrics:
    """The provider operations' metrics on `meter` (MetricMeter.noop: none)."""

    def __init__(self, meter: MetricMeter | None = None) -> None:
        meter = meter or MetricMeter.noop
        self._operations = meter.create_counter(
            OPERATIONS, "Host-provider operations by operation, provider, runtime and result."
        )
        self._duration = meter.create_histogram(
            DURATION, "How long host-provider operations took, in milliseconds.", "ms"
        )
        self._circuit = meter.create_gauge(
            CIRCUIT, "Each provider and runtime's create circuit: 0 closed, 1 half-open, 2 open."
        )

    def operation(
        self,
        operation: ProviderOperation,
        *,
        provider: str,
        runtime: str,
        host: str | None,
        tenant: str | None = None,
        result: str,
        seconds: float,
        who: Correlation,
        message: str = "",
    ) -> None:
        """Count it, time it and log it: warning when it failed, debug for a successful status
        check (probes repeat for every host), info otherwise."""
        labels = {"operation": str(operation), "provider": provider, "runtime": runtime, "result": result}
        self._operations.add(1, labels)
        self._duration.record(max(0, round(seconds * 1000)), labels)
        if result != SUCCEEDED:
            level = logging.WARNING
        elif operation == ProviderOperation.Status:
            level = logging.DEBUG
        else:
            level = logging.INFO
        log.log(
            level,
            "provider %s %s %s: %s",
            provider,
            operation,
            host or runtime,
            result,
            extra={
                "operation": str(operation),
                "provider": provider,
                "runtime": runtime,
                "host": host,
                "tenant": tenant,
                "result": result,
                "durationMs": round(seconds * 1000, 1),
                "correlationId": who.id,
                "requestId": who.request_id,
                "workflowId": who.workflow_id,
                "attempt": who.attempt,
                "failure": message or None,
            },
        )

    def circuit(self, *, provider: str, runtime: str, state: CircuitState) -> None:
        self._circuit.set(int(state), {"provider": provider, "runtime": runtime})
