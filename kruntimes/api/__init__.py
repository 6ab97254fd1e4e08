"""The kruntimes API model: one schema for workflows, activities, gateway, CLI and SDK.

Errors (all ValueError, so pydantic validators report them as field errors)::

    ValueError
     ├── OutputsError   outputs broke a bound; .field and a stable .reason
     └── ManifestError  a Run manifest did not parse; .problems by field path
"""

from kruntimes.api.names import (
    validate_dns1123_label,
    validate_env_name,
    validate_handler,
    validate_invocation_id,
    validate_relative_file_name,
)
from kruntimes.api.outputs import OutputsError, encode_outputs, outputs_from_result, validate_outputs
from kruntimes.api.phases import TERMINAL_PHASES, RunPhase, can_transition, is_active, is_terminal
from kruntimes.api.run import API_VERSION, KIND, ManifestError, Run
from kruntimes.api.spec import (
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

__all__ = [
    "API_VERSION",
    "KIND",
    "TERMINAL_PHASES",
    "Condition",
    "ConditionReason",
    "ConditionStatus",
    "ConditionType",
    "Endpoint",
    "EndpointProtocol",
    "FunctionMode",
    "InlineFile",
    "ManifestError",
    "Metadata",
    "ModeSpec",
    "OutputsError",
    "RetryPolicy",
    "Run",
    "RunPhase",
    "RunSpec",
    "RunStatus",
    "SourceSpec",
    "TaskMode",
    "can_transition",
    "encode_outputs",
    "is_active",
    "is_terminal",
    "outputs_from_result",
    "validate_dns1123_label",
    "validate_env_name",
    "validate_handler",
    "validate_invocation_id",
    "validate_outputs",
    "validate_relative_file_name",
]
