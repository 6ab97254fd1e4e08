"""Temporal for the gateway, over gRPC, without the Temporal SDK.

The gateway reads which Runs and Functions exist (kruntimes/temporal/known_runs.py,
known_functions.py); sends a Function's `wake` signal when it holds an invocation of a Function
without a Ready replica (gateway/wake.py); and starts, reads, counts and lists the
InvocationWorkflows of async invocations (gateway/async_invoke.py). The SDK's client would cost
the gateway process tens of megabytes (its API modules and its core runtime) for those calls, so
the gateway makes them itself: WorkflowService's methods by their paths, with messages that carry
the fields it reads or sets (proto/kruntimes/rpc/v1/visibility.proto, workflow_signal.proto,
workflow_start.proto), over a gRPC channel with the TLS, mTLS or API key of the same settings
every process takes (kruntimes.temporal.settings). Every call has a deadline; an API key goes in
the call's metadata only, never in an error or a log line.

Payloads the gateway writes (an invocation's input, its digest memo) are sealed with the platform's
payload codec keys (`--codec-keys`, kruntimes.temporal.sealing: the same keys and format as the
workers' EncryptionCodec), and those it reads (the status memo, the input of a resubmit) opened
with them; without keys, as the workers without them, payloads are plain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from kruntimes.rpc.v1 import visibility_pb2 as pb
from kruntimes.rpc.v1 import workflow_signal_pb2 as signal_pb
from kruntimes.rpc.v1 import workflow_start_pb2 as start_pb
from kruntimes.temporal.known_runs import Execution, keyword
from kruntimes.temporal.sealing import ENCODING, KEY_ID, CodecError, Keyring, Sealer
from kruntimes.temporal.settings import TemporalSettings

METHOD = "/temporal.api.workflowservice.v1.WorkflowService/ListWorkflowExecutions"
SIGNAL_METHOD = "/temporal.api.workflowservice.v1.WorkflowService/SignalWorkflowExecution"
_SERVICE = "/temporal.api.workflowservice.v1.WorkflowService/"
START_METHOD = _SERVICE + "StartWorkflowExecution"
DESCRIBE_METHOD = _SERVICE + "DescribeWorkflowExecution"
COUNT_METHOD = _SERVICE + "CountWorkflowExecutions"
HISTORY_METHOD = _SERVICE + "GetWorkflowExecutionHistory"
# a start, a describe, a count, a history page: short calls; the caller waits on them
WORKFLOW_CALL_TIMEOUT_S = 10.0
SIGNAL_TIMEOUT_S = 10.0
IDENTITY = "krt-gateway"  # the signal's sender, as the workflow's history shows it
PAGE_SIZE = 1000
CALL_TIMEOUT_S = 30.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a page of 1,000 executions is well under a megabyte
MAX_ERROR_CHARS = 300


class VisibilityError(Exception):
    """Temporal could not be asked (unreachable, refused, or the query was refused)."""


class CallError(VisibilityError):
    """A WorkflowService call failed: `code` is its gRPC status code's name (UNAVAILABLE,
    NOT_FOUND, INVALID_ARGUMENT, ...), `unreachable` when Temporal could not answer at all."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self) -> bool:
        return self.code in _UNREACHABLE


_UNREACHABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED", "UNKNOWN"})


class SignalError(VisibilityError):
    """A signal was not sent (unreachable, refused, or no such workflow running: `not_found`)."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


RUNNING = 1  # temporal.api.enums.v1.WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING


class Visibility:
    """ListWorkflowExecutions on one Temporal namespace."""

    def __init__(self, settings: TemporalSettings) -> None:
        self.namespace = settings.namespace
        options: list[tuple[str, str | int]] = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
        try:
            key = settings.api_key()
            if settings.uses_tls:
                ca, cert, private = settings.tls_files()
                if settings.tlsServerName:
                    options.append(("grpc.ssl_target_name_override", settings.tlsServerName))
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=ca, private_key=private, certificate_chain=cert
                )
                self._channel = grpc.aio.secure_channel(settings.address, credentials, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(settings.address, options=options)
            # the platform's payload codec keys (CodecError, a ValueError, when unusable)
            self.sealer = Sealer(Keyring.load(settings.codecKeys)) if settings.codecKeys else None
        except (OSError, ValueError) as e:
            raise VisibilityError(str(e)[:MAX_ERROR_CHARS]) from None
        self._metadata: tuple[tuple[str, str], ...] = (("temporal-namespace", settings.namespace),)
        if key is not None:
            self._metadata += (("authorization", f"Bearer {key}"),)
        self._list = self._method(METHOD, pb.ListWorkflowExecutionsRequest, pb.ListWorkflowExecutionsResponse)
        self._signal = self._method(
            SIGNAL_METHOD, signal_pb.SignalWorkflowExecutionRequest, signal_pb.SignalWorkflowExecutionResponse
        )
        self._start = self._method(
            START_METHOD, start_pb.StartWorkflowExecutionRequest, start_pb.StartWorkflowExecutionResponse
        )
        self._describe = self._method(
            DESCRIBE_METHOD,
            start_pb.DescribeWorkflowExecutionRequest,
            start_pb.DescribeWorkflowExecutionResponse,
        )
        self._count = self._method(
            COUNT_METHOD, start_pb.CountWorkflowExecutionsRequest, start_pb.CountWorkflowExecutionsResponse
        )
        self._list_recorded = self._method(
            METHOD, pb.ListWorkflowExecutionsRequest, start_pb.ListRecordedExecutionsResponse
        )
        self._history = self._method(
            HISTORY_METHOD,
            start_pb.GetWorkflowExecutionHistoryRequest,
            start_pb.GetWorkflowExecutionHistoryResponse,
        )

    def _method(self, path: str, request: Any, response: Any) -> Any:
        """A unary method of WorkflowService, called by its path with our own messages."""
        return self._channel.unary_unary(
            path, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )

    # -- payloads ---------------------------------------------------------------------------------

    def seal(self, payload: pb.VisiblePayload) -> pb.VisiblePayload:
        """`payload` as the workers' codec stores it (encrypted; as it is without keys)."""
        if self.sealer is None:
            return payload
        metadata, data = self.sealer.seal(payload.SerializeToString())
        return pb.VisiblePayload(metadata=metadata, data=data)

    def open(self, payload: pb.VisiblePayload) -> pb.VisiblePayload:
        """A stored payload as it was before the codec (one not encrypted as it is); CodecError
        when it does not decrypt with the keys here."""
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        if self.sealer is None:
            raise CodecError("the payload is encrypted and the gateway has no codec keys (--codec-keys)")
        return pb.VisiblePayload.FromString(self.sealer.open(payload.metadata.get(KEY_ID, b""), payload.data))

    # -- workflows --------------------------------------------------------------------------------

    async def _call(self, method: grpc.aio.UnaryUnaryMultiCallable, request: object) -> object:  # type: ignore[type-arg]
        try:
            return await method(request, timeout=WORKFLOW_CALL_TIMEOUT_S, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            details = (e.details() or "")[:MAX_ERROR_CHARS]
            raise CallError(f"{e.code().name}: {details}", code=e.code().name) from None

    async def start_workflow(
        self, request: start_pb.StartWorkflowExecutionRequest
    ) -> start_pb.StartWorkflowExecutionResponse:
        """StartWorkflowExecution in this namespace (the request's namespace and identity are
        set here); CallError if Temporal refused it or could not be asked."""
        request.namespace = self.namespace
        request.identity = IDENTITY
        answer = await self._call(self._start, request)
        assert isinstance(answer, start_pb.StartWorkflowExecutionResponse)
        return answer

    async def describe(self, workflow_id: str) -> start_pb.RecordedExecution | None:
        """The current execution of `workflow_id` (its memo and search attributes), None when
        there is none; CallError otherwise."""
        request = start_pb.DescribeWorkflowExecutionRequest(
            namespace=self.namespace, execution=pb.VisibleExecutionId(workflow_id=workflow_id)
        )
        try:
            answer = await self._call(self._describe, request)
        except CallError as e:
            if e.code == "NOT_FOUND":
                return None
            raise
        assert isinstance(answer, start_pb.DescribeWorkflowExecutionResponse)
        return answer.workflow_execution_info

    async def count(self, query: str) -> int:
        """How many executions `query` matches (CountWorkflowExecutions)."""
        request = start_pb.CountWorkflowExecutionsRequest(namespace=self.namespace, query=query)
        answer = await self._call(self._count, request)
        assert isinstance(answer, start_pb.CountWorkflowExecutionsResponse)
        return int(answer.count)

    async def list_recorded(
        self, query: str, token: bytes, *, page_size: int
    ) -> start_pb.ListRecordedExecutionsResponse:
        """One page of the executions `query` matches, with their memos."""
        request = pb.ListWorkflowExecutionsRequest(
            namespace=self.namespace, page_size=page_size, next_page_token=token, query=query
        )
        answer = await self._call(self._list_recorded, request)
        assert isinstance(answer, start_pb.ListRecordedExecutionsResponse)
        return answer

    async def first_event(self, workflow_id: str) -> start_pb.RecordedEvent | None:
        """The first event (WorkflowExecutionStarted: its input) of the current execution of
        `workflow_id`; None when there is no such workflow."""
        request = start_pb.GetWorkflowExecutionHistoryRequest(
            namespace=self.namespace,
            execution=pb.VisibleExecutionId(workflow_id=workflow_id),
            maximum_page_size=1,
        )
        try:
            answer = await self._call(self._history, request)
        except CallError as e:
            if e.code == "NOT_FOUND":
                return None
            raise
        assert isinstance(answer, start_pb.GetWorkflowExecutionHistoryResponse)
        return answer.history.events[0] if answer.history.events else None

    async def signal(self, workflow_id: str, name: str, *, request_id: str) -> None:
        """Signal the current run of `workflow_id` with `name` and no argument; `request_id`
        makes a signal sent again count once. SignalError if it was not sent."""
        request = signal_pb.SignalWorkflowExecutionRequest(
            namespace=self.namespace,
            workflow_execution=pb.VisibleExecutionId(workflow_id=workflow_id),
            signal_name=name,
            identity=IDENTITY,
            request_id=request_id,
        )
        try:
            await self._signal(request, timeout=SIGNAL_TIMEOUT_S, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            details = (e.details() or "")[:MAX_ERROR_CHARS]
            raise SignalError(
                f"{e.code().name}: {details}", not_found=e.code() is grpc.StatusCode.NOT_FOUND
            ) from None

    @classmethod
    async def connect(cls, settings: TemporalSettings) -> Visibility:
        """A Visibility whose first call was answered (VisibilityError otherwise)."""
        visibility = cls(settings)
        try:
            await visibility._page("WorkflowType='RunWorkflow'", b"", page_size=1)
        except BaseException:
            await visibility.close()
            raise
        return visibility

    async def list(self, query: str, *, limit: int, page_size: int = PAGE_SIZE) -> AsyncIterator[Execution]:
        """The executions `query` matches, at most `limit`, page by page."""
        token = b""
        seen = 0
        while seen < limit:
            page = await self._page(query, token, page_size=min(page_size, limit - seen))
            for info in page.executions:
                if seen >= limit:
                    return
                seen += 1
                yield Execution(
                    workflow_id=info.execution.workflow_id,
                    search_attributes=_keywords(info.search_attributes),
                    running=info.status == RUNNING,
                )
            token = page.next_page_token
            if not token:
                return

    async def _page(self, query: str, token: bytes, *, page_size: int) -> pb.ListWorkflowExecutionsResponse:
        request = pb.ListWorkflowExecutionsRequest(
            namespace=self.namespace, page_size=page_size, next_page_token=token, query=query
        )
        try:
            page: pb.ListWorkflowExecutionsResponse = await self._list(
                request, timeout=CALL_TIMEOUT_S, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as e:
            details = (e.details() or "")[:MAX_ERROR_CHARS]
            raise VisibilityError(f"{e.code().name}: {details}") from None
        return page

    async def close(self) -> None:
        await self._channel.close()


def _keywords(attributes: pb.VisibleSearchAttributes) -> dict[str, str]:
    """Each keyword (or text) attribute's value, the first of a list; others are left out."""
    found: dict[str, str] = {}
    for name, payload in attributes.indexed_fields.items():
        value = keyword(payload.metadata.get("encoding"), payload.data)
        if value is not None:
            found[name] = value
    return found
