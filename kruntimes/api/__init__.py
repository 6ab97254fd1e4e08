"""The kruntimes API model: one schema for workflows, activities, gateway, CLI and SDK.

Errors (all ValueError, so pydantic validators report them as field errors)::

    ValueError
     ├── OutputsError   outputs broke a bound; .field and a stable .reason
     └── ManifestError  a Run manifest did not parse; .problems by field path
          └── FunctionManifestError  the same for a Function manifest
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kruntimes import _lazy

if TYPE_CHECKING:
    from kruntimes.api.adapters import validate_handler
    from kruntimes.api.function import (
        FUNCTION_KIND,
        Function,
        FunctionConditionType,
        FunctionManifestError,
        FunctionPhase,
        FunctionSpec,
        FunctionStatus,
        ReplicaCounts,
        ScaleSpec,
    )
    from kruntimes.api.manifest import load_manifest, manifest_from_dict
    from kruntimes.api.names import (
        validate_dns1123_label,
        validate_env_name,
        validate_invocation_id,
        validate_relative_file_name,
    )
    from kruntimes.api.outputs import OutputsError, encode_outputs, outputs_from_result, validate_outputs
    from kruntimes.api.phases import TERMINAL_PHASES, RunPhase, can_transition, is_active, is_terminal
    from kruntimes.api.run import API_VERSION, KIND, ManifestError, Run
    from kruntimes.api.spec import (
        Creator,
        FunctionMode,
        InlineFile,
        Metadata,
        ModeSpec,
        RetryPolicy,
        RunSpec,
        SourceSpec,
        TaskMode,
    )
    from kruntimes.api.status import (
        Condition,
        ConditionReason,
        ConditionStatus,
        ConditionType,
        Endpoint,
        EndpointProtocol,
        RunStatus,
    )

_LAZY: dict[str, str] = {
    "FUNCTION_KIND": "kruntimes.api.function",
    "Function": "kruntimes.api.function",
    "FunctionConditionType": "kruntimes.api.function",
    "FunctionManifestError": "kruntimes.api.function",
    "FunctionPhase": "kruntimes.api.function",
    "FunctionSpec": "kruntimes.api.function",
    "FunctionStatus": "kruntimes.api.function",
    "ReplicaCounts": "kruntimes.api.function",
    "ScaleSpec": "kruntimes.api.function",
    "load_manifest": "kruntimes.api.manifest",
    "manifest_from_dict": "kruntimes.api.manifest",
    "validate_dns1123_label": "kruntimes.api.names",
    "validate_env_name": "kruntimes.api.names",
    "validate_handler": "kruntimes.api.adapters",
    "validate_invocation_id": "kruntimes.api.names",
    "validate_relative_file_name": "kruntimes.api.names",
    "OutputsError": "kruntimes.api.outputs",
    "encode_outputs": "kruntimes.api.outputs",
    "outputs_from_result": "kruntimes.api.outputs",
    "validate_outputs": "kruntimes.api.outputs",
    "TERMINAL_PHASES": "kruntimes.api.phases",
    "RunPhase": "kruntimes.api.phases",
    "can_transition": "kruntimes.api.phases",
    "is_active": "kruntimes.api.phases",
    "is_terminal": "kruntimes.api.phases",
    "API_VERSION": "kruntimes.api.run",
    "KIND": "kruntimes.api.run",
    "ManifestError": "kruntimes.api.run",
    "Run": "kruntimes.api.run",
    "Creator": "kruntimes.api.spec",
    "FunctionMode": "kruntimes.api.spec",
    "InlineFile": "kruntimes.api.spec",
    "Metadata": "kruntimes.api.spec",
    "ModeSpec": "kruntimes.api.spec",
    "RetryPolicy": "kruntimes.api.spec",
    "RunSpec": "kruntimes.api.spec",
    "SourceSpec": "kruntimes.api.spec",
    "TaskMode": "kruntimes.api.spec",
    "Condition": "kruntimes.api.status",
    "ConditionReason": "kruntimes.api.status",
    "ConditionStatus": "kruntimes.api.status",
    "ConditionType": "kruntimes.api.status",
    "Endpoint": "kruntimes.api.status",
    "EndpointProtocol": "kruntimes.api.status",
    "RunStatus": "kruntimes.api.status",
}

__all__ = [
    "API_VERSION",
    "FUNCTION_KIND",
    "KIND",
    "TERMINAL_PHASES",
    "Condition",
    "ConditionReason",
    "ConditionStatus",
    "ConditionType",
    "Creator",
    "Endpoint",
    "EndpointProtocol",
    "Function",
    "FunctionConditionType",
    "FunctionManifestError",
    "FunctionMode",
    "FunctionPhase",
    "FunctionSpec",
    "FunctionStatus",
    "InlineFile",
    "ManifestError",
    "Metadata",
    "ModeSpec",
    "OutputsError",
    "ReplicaCounts",
    "RetryPolicy",
    "Run",
    "RunPhase",
    "RunSpec",
    "RunStatus",
    "ScaleSpec",
    "SourceSpec",
    "TaskMode",
    "can_transition",
    "encode_outputs",
    "is_active",
    "is_terminal",
    "load_manifest",
    "manifest_from_dict",
    "outputs_from_result",
    "validate_dns1123_label",
    "validate_env_name",
    "validate_handler",
    "validate_invocation_id",
    "validate_outputs",
    "validate_relative_file_name",
]


# A public name's module is loaded on first use (a function process needs only outputs and limits).
__getattr__ = _lazy.loader(__name__, _LAZY, globals())
