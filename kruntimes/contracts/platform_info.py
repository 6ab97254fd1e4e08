"""What the worker tells clients about the platform it serves (PlatformInfo)."""

from __future__ import annotations

from pydantic import Field

from kruntimes.api._base import ApiModel


class PlatformInfo(ApiModel):
    """What every Run of the platform is told about where it is invoked."""

    gatewayUrl: str = "https://127.0.0.1:8443"
    caBundle: str | None = None  # PEM, when the gateway's CA is the platform's own
    stateDir: str = ""  # where process hosts keep their records and workspaces
    gatewayHeartbeats: list[str] = Field(default_factory=list)  # heartbeat addresses hosts report to
    heartbeatIntervalSeconds: float = 5.0
