"""Activity stand-ins registered under the real names, for time-skipping tests of the workflows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from temporalio import activity

from kruntimes.activities.host_manager import DeleteHostInput
from kruntimes.contracts.hostcalls import (
    CancelTaskInput,
    FunctionState,
    RegisterInput,
    RegisterResult,
    StatusInput,
    TaskInput,
    TaskResult,
    UnregisterInput,
)
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.contracts.retention import DeleteExecutionInput
from kruntimes.contracts.run import ProbeInput, ProbeResult
from tests.hosts.standin import StandInProvider


@dataclass
class FakeHosts:
    """What the stand-ins did, and the idle clock the test controls."""

    last_activity: datetime | None = None
    registered: dict[str, int] = field(default_factory=dict)  # run uid → attempt
    unregistered: list[str] = field(default_factory=list)
    status_calls: int = 0
    probe: object = None
    deleted: list[tuple[str, str, datetime]] = field(default_factory=list)  # workflow id, run id, when

    async def register(self, input: RegisterInput) -> RegisterResult:
        self.registered[input.runUid] = input.attempt
        return RegisterResult(registrationId=f"reg-{input.runUid}", hostUid="uid", created=True)

    def activities(self) -> list[object]:
        @activity.defn(name="create_host")
        async def create_host(spec: HostSpec) -> CreatedHost:
            return await StandInProvider(spec.provider).create(spec)

        @activity.defn(name="delete_host")
        async def delete_host(input: DeleteHostInput) -> bool:
            return True

        @activity.defn(name="register_function")
        async def register_function(input: RegisterInput) -> RegisterResult:
            return await self.register(input)

        @activity.defn(name="function_status")
        async def function_status(input: StatusInput) -> FunctionState:
            self.status_calls += 1
            return FunctionState(registered=True, ready=True, lastActivity=self.last_activity)

        @activity.defn(name="unregister_function")
        async def unregister_function(input: UnregisterInput) -> bool:
            self.unregistered.append(input.registrationId)
            return True

        @activity.defn(name="execute_task")
        async def execute_task(input: TaskInput) -> TaskResult:
            return TaskResult(status="Succeeded", outputs={})

        @activity.defn(name="probe_hosts")
        async def probe_hosts(input: ProbeInput) -> ProbeResult:
            return ProbeResult(lost=[])

        @activity.defn(name="cancel_task")
        async def cancel_task(input: CancelTaskInput) -> bool:
            return True

        @activity.defn(name="delete_execution")
        async def delete_execution(input: DeleteExecutionInput) -> bool:
            self.deleted.append(
                (input.workflowId, input.runId, activity.info().current_attempt_scheduled_time)
            )
            return True

        self.probe = probe_hosts
        return [
            create_host,
            delete_host,
            register_function,
            function_status,
            unregister_function,
            execute_task,
            cancel_task,
            delete_execution,
        ]
