"""Evaluations and results to and from the FunctionEvaluator protobuf messages."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from kruntimes.krm.evaluation import Evaluation
from kruntimes.krm.resources import FieldRef, FileRef, ResourceRef, Result
from kruntimes.rpc.v1 import krm_pb2 as pb

REASON_KEY = "krt-reason"
EVALUATION_KEY = "krt-evaluation-bin"
# A failure's details ride in trailing metadata, whose default limit is 8 KiB for the whole set.
MAX_TRAILER_BYTES = 6 * 1024


def _value(raw: Any) -> Value:
    value = Value()
    if raw is not None:
        json_format.ParseDict(json.loads(json.dumps(raw, default=str)), value)
    return value


def _plain(value: Value) -> Any:
    return json_format.MessageToDict(value)


def result_to_proto(result: Result) -> pb.Result:
    message = pb.Result(severity=result.severity, message=result.message, tags=result.tags)
    if result.resourceRef is not None:
        ref = result.resourceRef
        message.resource_ref.CopyFrom(
            pb.ResourceRef(api_version=ref.apiVersion, kind=ref.kind, name=ref.name, namespace=ref.namespace)
        )
    if result.field is not None:
        message.field.path = result.field.path
        if result.field.currentValue is not None:
            message.field.current_value.CopyFrom(_value(result.field.currentValue))
        if result.field.proposedValue is not None:
            message.field.proposed_value.CopyFrom(_value(result.field.proposedValue))
    if result.file is not None:
        message.file.CopyFrom(pb.FileRef(path=result.file.path, index=result.file.index))
    return message


def result_from_proto(message: pb.Result) -> Result:
    field = None
    if message.HasField("field"):
        field = FieldRef(
            path=message.field.path,
            currentValue=_plain(message.field.current_value)
            if message.field.HasField("current_value")
            else None,
            proposedValue=_plain(message.field.proposed_value)
            if message.field.HasField("proposed_value")
            else None,
        )
    ref = message.resource_ref
    return Result(
        severity=message.severity,
        message=message.message,
        resourceRef=ResourceRef(
            apiVersion=ref.api_version, kind=ref.kind, name=ref.name, namespace=ref.namespace
        )
        if message.HasField("resource_ref")
        else None,
        field=field,
        file=FileRef(path=message.file.path, index=message.file.index) if message.HasField("file") else None,
        tags=dict(message.tags),
    )


def to_proto(evaluation: Evaluation) -> pb.EvaluateFunctionResponse:
    return pb.EvaluateFunctionResponse(
        resource_list=evaluation.resource_list,
        log=evaluation.log,
        log_truncated=evaluation.log_truncated,
        results=[result_to_proto(r) for r in evaluation.results],
        exit_code=evaluation.exit_code,
    )


def from_proto(message: pb.EvaluateFunctionResponse) -> Evaluation:
    return Evaluation(
        resource_list=message.resource_list,
        log=message.log,
        log_truncated=message.log_truncated or message.results_truncated,
        results=tuple(result_from_proto(r) for r in message.results),
        exit_code=message.exit_code,
    )


def failure_trailer(evaluation: Evaluation) -> bytes:
    """A failed evaluation without its output, trimmed to MAX_TRAILER_BYTES (the log's tail kept,
    then results dropped from the end)."""
    message = to_proto(evaluation)
    message.resource_list = b""
    if message.ByteSize() > MAX_TRAILER_BYTES:
        over = message.ByteSize() - MAX_TRAILER_BYTES
        if over < len(message.log):
            message.log = message.log[over:]
        else:
            message.log = b""
        message.log_truncated = True
    while message.ByteSize() > MAX_TRAILER_BYTES and message.results:
        message.results.pop()
        message.results_truncated = True
    return message.SerializeToString()
