"""Temporal for the gateway, over gRPC, without the Temporal SDK.

The gateway reads one thing from Temporal: which Runs and Functions exist
(kruntimes/temporal/known_runs.py, known_functions.py); and sends one: a Function's `wake` signal
when it holds an invocation of a Function without a Ready replica (gateway/wake.py). The SDK's
client would cost the gateway process tens of megabytes (its API modules and its core runtime) for
those two calls, so the gateway makes them itself: WorkflowService.ListWorkflowExecutions and
SignalWorkflowExecution by their method paths, with messages that carry the fields it reads or
sets (proto/kruntimes/rpc/v1/visibility.proto, workflow_signal.proto), over a gRPC channel with the
TLS, mTLS or API key of the same settings every process takes (kruntimes.temporal.settings). Every
call has a deadline; an API key goes in the call's metadata only, never in an error or a log line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from kruntimes.rpc.v1 import visibility_pb2 as pb
from kruntimes.rpc.v1 import workflow_signal_pb2 as signal_pb
from kruntimes.temporal.known_runs import Execution, keyword
from kruntimes.temporal.settings import TemporalSettings

METHOD = "/temporal.api.workflowservice.v1.WorkflowService/ListWorkflowExecutions"
SIGNAL_METHOD = "/temporal.api.workflowservice.v1.WorkflowService/SignalWorkflowExecution"
SIGNAL_TIMEOUT_S = 10.0
IDENTITY = "krt-gateway"  # the signal's sender, as the workflow's history shows it
PAGE_SIZE = 1000
CALL_TIMEOUT_S = 30.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a page of 1,000 executions is well under a megabyte
MAX_ERROR_CHARS = 300


class VisibilityError(Exception):
    """Temporal could not be asked (unreachable, refused, or the query was refused)."""


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
        except (OSError, ValueError) as e:
            raise VisibilityError(str(e)[:MAX_ERROR_CHARS]) from None
        self._metadata: tuple[tuple[str, str], ...] = (("temporal-namespace", settings.namespace),)
        if key is not None:
            self._metadata += (("authorization", f"Bearer {key}"),)
        self._list = self._channel.unary_unary(
            METHOD,
            request_serializer=pb.ListWorkflowExecutionsRequest.SerializeToString,
            response_deserializer=pb.ListWorkflowExecutionsResponse.FromString,
        )

        self._signal = self._channel.unary_unary(
            SIGNAL_METHOD,
            request_serializer=signal_pb.SignalWorkflowExecutionRequest.SerializeToString,
            response_deserializer=signal_pb.SignalWorkflowExecutionResponse.FromString,
        )

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
