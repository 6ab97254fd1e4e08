"""A tool's refusal: a stable reason (the gateway's, kruntimes.wire.reasons, where one fits; else
the SDK error's class name, which the SDK never renames) and one line saying what to do. The line
is the CLI's (kruntimes.cli.main.explain), so an agent reads what a person at `krt` would."""

from __future__ import annotations

from kruntimes.api.run import ManifestError
from kruntimes.cli.main import explain
from kruntimes.cli.parser import UsageError
from kruntimes.sdk import errors as sdk
from kruntimes.wire.reasons import GatewayReason

INVALID_ARGUMENTS = "InvalidArguments"
INVALID_MANIFEST = "InvalidManifest"
UNREACHABLE = "Unreachable"
INTERNAL = "Internal"


class ToolError(Exception):
    """A refusal the caller sees as an MCP tool error (isError) with `reason` and `message`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def unauthenticated(message: str) -> ToolError:
    return ToolError(GatewayReason.UNAUTHENTICATED.value, message)


def forbidden(message: str) -> ToolError:
    return ToolError(GatewayReason.FORBIDDEN.value, message)


def tool_error(exc: BaseException) -> ToolError:
    """`exc` as a ToolError: what the SDK and the API raise get their reason; anything else is
    Internal with its type only (its text may quote what it was given)."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, ManifestError):
        return ToolError(INVALID_MANIFEST, "; ".join(exc.problems))
    if isinstance(exc, UsageError):
        return ToolError(INVALID_ARGUMENTS, str(exc))
    if isinstance(exc, sdk.InvokeError):
        return ToolError(exc.reason or type(exc).__name__, explain(exc)[1])
    if isinstance(exc, sdk.ConfigError):
        return ToolError(UNREACHABLE, explain(exc)[1])
    if isinstance(exc, sdk.KruntimesError):
        name = type(exc).__name__
        return ToolError(name if name != "KruntimesError" else "Failed", explain(exc)[1])
    return ToolError(INTERNAL, f"unexpected error {type(exc).__name__}; the MCP server's log says more")
