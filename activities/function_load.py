"""A Function's autoscaler (FunctionWorkflow's `autoscale_function` activity): every second it
samples the Function's load, feeds kruntimes.decisions.autoscale, and returns the decision as soon
as the replicas wanted differ from those the workflow has.

The load is, first, what the hosts report: for each Ready replica, its host's FunctionStatus
(invocations in flight plus those waiting their turn there), asked over mutual TLS with a bounded
timeout. Each gateway adds the invocations it holds waiting for a replica (every replica full, or
none Ready: scale from zero), which no host can report. A gateway's in-flight count (dispatched,
not answered yet) covers the same invocations as the hosts' plus their way to and from the host:
a host counts a call only while its handler runs, so under a steady load of short calls the hosts'
sum is below the concurrency the callers see (by the share of each call spent on the way). The
load is the larger of the hosts' sum and the gateways' in flight, plus the gateways' waiting.

Why ask the hosts and not the worker's host watches: a watch holds a host's stream in whichever
worker process its HostWorkflow's activity runs, keeps no per-registration counts (it asks for
losses only), and the replicas of one Function are spread over hosts watched by several workers;
one FunctionStatus per Ready replica per second costs each host a lookup.

The activity lives at most `maxSeconds` (the workflow then starts the next with its current
replicas), heartbeats its memory twice a second (a retried attempt, on any worker, goes on from it),
and when cancelled (the workflow's replicas changed) returns that memory with nothing changed:
the workflow waits for the cancellation to complete, so the window survives a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

import grpc
from temporalio import activity

from kruntimes.activities.hosts._rpc import gateway_channel, host_channel
from kruntimes.contracts.function import AutoscaleInput, AutoscaleResult, LoadTarget, ScaleWindow
from kruntimes.decisions.autoscale import Autoscaler, Decision, ScaleSettings, Snapshot
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 1.0
LOAD = "kruntimes_function_load"
DECISIONS = "kruntimes_function_scale_decisions"
WANTED = "kruntimes_function_replicas_wanted"
HEARTBEAT_EVERY_S = 0.5
# One host's or gateway's answer: a sample waits for none longer (an unanswered one counts 0).
RPC_TIMEOUT_S = 2.0
# A host's report is bounded by its own limits (concurrency <= 1000, queue <= 10,000 per
# registration); a gateway's by its waiting bound. Anything larger is not a count.
MAX_REPORTED = 1_000_000


class GatewayLoads(Protocol):
    """A Function's invocations over every gateway: (dispatched and not answered, waiting for a
    replica)."""

    async def loads(self, function_uid: str) -> tuple[int, int]: ...

    async def close(self) -> None: ...


class GrpcGatewayLoads:
    """Each gateway's GatewayLoad.FunctionLoads, at the heartbeat addresses the worker gives its
    hosts. A gateway that does not answer in time, or does not know the call (an older one),
    counts 0."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> hb_grpc.GatewayLoadAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = gateway_channel(address)
        return hb_grpc.GatewayLoadStub(channel)

    async def _one(self, address: str, function_uid: str) -> tuple[int, int]:
        try:
            answer = await self._stub(address).FunctionLoads(
                hb.FunctionLoadsRequest(function_uids=[function_uid]), timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            if err.code() is not grpc.StatusCode.UNIMPLEMENTED:
                log.debug("gateway %s: FunctionLoads %s", address, err.code().name)
            return 0, 0
        mine = [load for load in answer.loads if load.function_uid == function_uid]
        return (
            sum(min(load.in_flight, MAX_REPORTED) for load in mine),
            sum(min(load.waiting, MAX_REPORTED) for load in mine),
        )

    async def loads(self, function_uid: str) -> tuple[int, int]:
        counts = await asyncio.gather(*(self._one(a, function_uid) for a in self.addresses))
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class HostLoads:
    """Each Ready replica's in flight plus waiting, as its host's FunctionStatus says (0 for a
    replica whose host does not answer in time: a dead host serves nothing)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> pb_grpc.FunctionRuntimeAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = host_channel(address)
        return pb_grpc.FunctionRuntimeStub(channel)

    async def _one(self, target: LoadTarget) -> int:
        try:
            answer = await self._stub(target.address).FunctionStatus(
                pb.FunctionStatusRequest(registration_id=target.registrationId), timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            log.debug("host %s: FunctionStatus %s", target.address, err.code().name)
            return 0
        if not answer.registered:
            return 0
        return min(max(answer.in_flight, 0), MAX_REPORTED) + min(max(answer.waiting, 0), MAX_REPORTED)

    async def load(self, targets: Sequence[LoadTarget]) -> int:
        return sum(await asyncio.gather(*(self._one(t) for t in targets)))

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def settings_of(input: AutoscaleInput) -> ScaleSettings:
    return ScaleSettings(
        min=input.min,
        max=input.max,
        target=input.target,
        scale_down_delay_s=input.scaleDownDelaySeconds,
        stable_window_s=input.stableWindowSeconds,
    )


def window_of(snapshot: Snapshot) -> ScaleWindow:
    return ScaleWindow(
        samples=list(snapshot.samples),
        wanted=list(snapshot.wanted),
        panicUntil=snapshot.panic_until,
        lastAt=snapshot.last_at,
    )


def snapshot_of(window: ScaleWindow | None) -> Snapshot | None:
    if window is None:
        return None
    return Snapshot(
        samples=tuple(window.samples),
        wanted=tuple(window.wanted),
        panic_until=window.panicUntil,
        last_at=window.lastAt,
    )


def result_of(decision: Decision | None, current: int, scaler: Autoscaler) -> AutoscaleResult:
    window = window_of(scaler.snapshot())
    if decision is None:
        return AutoscaleResult(changed=False, previous=current, wanted=current, window=window)
    return AutoscaleResult(
        changed=decision.changed,
        previous=decision.current,
        wanted=decision.wanted,
        reason=decision.reason,
        message=decision.describe(),
        stableLoad=decision.stable_load,
        panicLoad=decision.panic_load,
        panicking=decision.panicking,
        window=window,
    )


class FunctionLoadActivities:
    def __init__(self, *, gateways: Sequence[str] = ()) -> None:
        self.gateways = list(gateways)

    @activity.defn(name="autoscale_function")
    async def autoscale_function(self, input: AutoscaleInput) -> AutoscaleResult:
        """Sample, decide, and return the first decision that changes the replicas wanted (or
        none after maxSeconds, or when cancelled)."""
        details = activity.info().heartbeat_details
        window = input.window
        if details:  # a retried attempt: the memory its predecessor heartbeat last
            with contextlib.suppress(Exception):
                window = ScaleWindow.model_validate(details[0])
        scaler = Autoscaler.restore(settings_of(input), snapshot_of(window))
        hosts, gateways = HostLoads(), GrpcGatewayLoads(self.gateways)
        meter = _Meter(input)
        decision: Decision | None = None
        ends = time.monotonic() + input.maxSeconds
        memory: list[object] = [window.model_dump(mode="json") if window is not None else None]
        beating = asyncio.create_task(_heartbeats(memory))
        try:
            while time.monotonic() < ends:
                started = time.monotonic()
                host_load, (in_flight, waiting) = await asyncio.gather(
                    hosts.load(input.replicas), gateways.loads(input.functionUid)
                )
                load = max(host_load, in_flight) + waiting
                now = time.time()
                scaler.record(now, float(load))
                decision = scaler.decide(now, current=input.current, ready=len(input.replicas))
                meter.sampled(load)
                memory[0] = window_of(scaler.snapshot()).model_dump(mode="json")
                if decision.changed:
                    meter.decided(decision)
                    activity.logger.info(
                        "Function %s/%s: %s", input.namespace, input.name, decision.describe()
                    )
                    break
                await asyncio.sleep(max(SAMPLE_EVERY_S - (time.monotonic() - started), 0.05))
        except asyncio.CancelledError:
            # cancelled by the workflow (its replicas changed): what it waits for is the memory
            if activity.is_cancelled():
                return result_of(None, input.current, scaler)
            raise
        finally:
            beating.cancel()
            await asyncio.shield(asyncio.gather(hosts.close(), gateways.close(), return_exceptions=True))
        if decision is None or not decision.changed:
            return result_of(None, input.current, scaler)
        return result_of(decision, input.current, scaler)


async def _heartbeats(memory: list[object]) -> None:
    """Heartbeat the latest memory every HEARTBEAT_EVERY_S, whatever a sample's RPCs take: the
    workflow's heartbeat timeout is short, so its cancellation arrives soon (the SDK throttles
    heartbeats to 0.8 of that timeout, and a cancellation comes with a heartbeat's answer)."""
    while True:
        activity.heartbeat(memory[0])
        await asyncio.sleep(HEARTBEAT_EVERY_S)


class _Meter:
    """The autoscaler's metrics, through the Temporal runtime's meter (the worker's Prometheus
    endpoint, `--metrics-address`, as the host providers' are): labels are the Function's
    namespace and name, the direction and the reason; never a uid."""

    def __init__(self, input: AutoscaleInput) -> None:
        meter = activity.metric_meter().with_additional_attributes(
            {"function_namespace": input.namespace, "function": input.name}
        )
        self._load = meter.create_gauge(LOAD, "A Function's invocations in flight and waiting, last sampled.")
        self._decisions = meter.create_counter(
            DECISIONS,
            "Autoscaler decisions that changed a Function's replicas wanted, by direction and reason.",
        )
        self._wanted = meter.create_gauge(WANTED, "The replicas the autoscaler last wanted for a Function.")

    def sampled(self, load: int) -> None:
        self._load.set(load)

    def decided(self, decision: Decision) -> None:
        direction = "up" if decision.wanted > decision.current else "down"
        self._decisions.add(1, {"direction": direction, "reason": decision.reason})
        self._wanted.set(decision.wanted)
