"""ScaleOutWorkflow (scaleout/{runtime}/{request}): create one host and report it to the pool.

It never dispatches Runs: a new host belongs to no Run until the pool, told the host is ready,
decides again for the Runs waiting in its queue. With the report it starts the host's
HostWorkflow (host/{runtime}/{host}), which supervises the host from then on and outlives it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.host import host_input
    from kruntimes.contracts.names import SIGNAL_HOST_READY, SIGNAL_SCALE_OUT_FAILED, host_workflow_id
    from kruntimes.contracts.pool import HostReadySignal, ScaleOutFailedSignal, ready_host
    from kruntimes.contracts.providers import CreatedHost, HostSandbox, HostSpec
    from kruntimes.contracts.scaleout import ScaleOutInput
    from kruntimes.decisions.scheduling.failures import FailureReason, ProviderFailure, ProviderOperation
    from kruntimes.decisions.scheduling.model import ScaleOutRequest, ScaleOutStatus
    from kruntimes.wire import summaries
    from kruntimes.workflows.common import failure_text

CREATE_TIMEOUT = timedelta(seconds=90)
CREATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)


def _failure(err: ActivityError, input: ScaleOutInput) -> ProviderFailure:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.details:
        try:
            return ProviderFailure.model_validate(cause.details[0])
        except ValueError:
            pass
    return ProviderFailure.of(
        FailureReason.UnexpectedError,
        provider=input.request.provider,
        operation=ProviderOperation.Create,
        host=input.hostId,
        message=failure_text(err),
    )


async def _failed(
    pool: workflow.ExternalWorkflowHandle[object], request: ScaleOutRequest, failure: ProviderFailure
) -> ScaleOutRequest:
    """Tell the pool (it re-decides for the Runs that waited) and end with the structured reason."""
    await pool.signal(
        SIGNAL_SCALE_OUT_FAILED, ScaleOutFailedSignal(requestId=request.requestId, failure=failure)
    )
    return request._replace(status=ScaleOutStatus.Failed, failure=failure)


@workflow.defn(name="ScaleOutWorkflow")
class ScaleOutWorkflow:
    @workflow.run
    async def run(self, input: ScaleOutInput) -> ScaleOutRequest:
        request = input.request
        pool = workflow.get_external_workflow_handle(input.poolWorkflowId)
        try:
            spec = HostSpec(
                runtime=request.runtime,
                hostId=input.hostId,
                adapter=input.adapter,
                provider=request.provider,
                tenant=request.tenant,
                tenantGroup=request.tenantGroup,
                stateDir=input.stateDir,
                gateways=input.gateways,
                heartbeatIntervalSeconds=input.heartbeatIntervalSeconds,
                sandbox=input.sandbox or HostSandbox(),
            )
        except ValueError as exc:  # a configuration error: report it, never retry the task forever
            failure = ProviderFailure.of(
                FailureReason.OperationRejected,
                provider=request.provider,
                operation=ProviderOperation.Create,
                host=input.hostId,
                message=str(exc),
            )
            return await _failed(pool, request, failure)
        try:
            created = await workflow.execute_activity(
                "create_host",
                spec,
                result_type=CreatedHost,
                start_to_close_timeout=CREATE_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=10),
                retry_policy=CREATE_RETRY,
                summary=summaries.summary(f"create {input.hostId} ({request.provider})"),
            )
        except ActivityError as err:
            return await _failed(pool, request, _failure(err, input))
        host = ready_host(
            created,
            capacity=input.capacity,
            at=workflow.now(),
            tenant=request.tenant,
            tenancy=request.policy.mode,
            tenant_group=request.tenantGroup,
        )
        host = host._replace(supervised=True)
        # Both in one workflow task: the Runs waiting for this host do not wait for its supervisor.
        ready = pool.signal(SIGNAL_HOST_READY, HostReadySignal(requestId=request.requestId, host=host))
        supervisor = workflow.start_child_workflow(
            "HostWorkflow",
            host_input(input, host=host, created=created),
            id=host_workflow_id(request.runtime, host.hostId),
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=summaries.summary(f"host {request.runtime}/{host.hostId} ({created.provider})"),
        )
        told, started = await asyncio.gather(ready, supervisor, return_exceptions=True)
        if isinstance(told, BaseException):
            raise told
        if isinstance(started, BaseException):
            if not isinstance(started, WorkflowAlreadyStartedError):
                raise started
            # A HostWorkflow of an older incarnation with this id still runs: it ends once it
            # finds its host gone; the reconciler supervises this one then.
            workflow.logger.warning("host %s is not supervised yet: %s", host.hostId, started)
        return request._replace(status=ScaleOutStatus.Fulfilled, hostId=host.hostId, hostUid=host.hostUid)
