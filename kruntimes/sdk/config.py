"""Where clients (the `krt` CLI, the SDK) find the platform.

`krt up` writes `client.json` into the state directory (mode 0600: it holds the token). Values
come from, in order: the environment (the KRT_* variables of `ENV`), then that file, then
defaults. The state directory is KRT_STATE_DIR, by default ~/.kruntimes. The Temporal
connection takes TLS (mTLS) files, an API key (or its file) and the payload codec's key
directory, as `kruntimes.temporal.connect.TemporalSettings` does. `identity` (KRT_IDENTITY) is
who the client is: the creator its Runs record, which hosts check the role bindings against
before they resolve a Run's secrets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, Field

from kruntimes.api._base import ApiModel
from kruntimes.api.names import validate_subject
from kruntimes.contracts.names import TASK_QUEUE

if TYPE_CHECKING:
    from kruntimes.temporal.connect import TemporalSettings

CLIENT_FILE = "client.json"
ENV = {
    "temporalAddress": "KRT_TEMPORAL_ADDRESS",
    "temporalNamespace": "KRT_TEMPORAL_NAMESPACE",
    "taskQueue": "KRT_TASK_QUEUE",
    "gatewayUrl": "KRT_GATEWAY_URL",
    "token": "KRT_TOKEN",
    "caFile": "KRT_CA_FILE",
    "temporalTlsCert": "KRT_TEMPORAL_TLS_CERT",
    "temporalTlsKey": "KRT_TEMPORAL_TLS_KEY",
    "temporalTlsCa": "KRT_TEMPORAL_TLS_CA",
    "temporalTlsServerName": "KRT_TEMPORAL_TLS_SERVER_NAME",
    "temporalApiKey": "KRT_TEMPORAL_API_KEY",
    "temporalApiKeyFile": "KRT_TEMPORAL_API_KEY_FILE",
    "codecKeys": "KRT_CODEC_KEYS",
    "identity": "KRT_IDENTITY",
}


SECRET_FIELDS = ("token", "temporalApiKey", "uiLoginKey")
REDACTED = "REDACTED"


class ClientConfig(ApiModel):
    temporalAddress: str = "127.0.0.1:7233"
    temporalNamespace: str = "default"
    # The task queue Runs are started on: the one the platform's worker polls for RunWorkflow.
    taskQueue: str = Field(default=TASK_QUEUE, min_length=1)
    gatewayUrl: str = "https://127.0.0.1:8443"
    caFile: str | None = None
    token: str | None = Field(default=None, repr=False)
    uiUrl: str | None = None
    # what `krt ui` mints the UI's one-time login tickets with (the embedded platform's front)
    uiLoginKey: str | None = Field(default=None, repr=False)
    temporalTlsCert: str | None = None
    temporalTlsKey: str | None = None
    temporalTlsCa: str | None = None
    temporalTlsServerName: str | None = None
    temporalApiKey: str | None = Field(default=None, repr=False)
    temporalApiKeyFile: str | None = None
    codecKeys: str | None = None  # the payload codec's key directory
    # Who this client is: the creator its Runs and schedules record, whom the role bindings'
    # `use-secrets` name (`krt up` writes its owner, `admin`). None: Runs record no creator and
    # get no secret.
    identity: Annotated[str, AfterValidator(lambda v: validate_subject(v, field="identity"))] | None = None
    stateDir: str = ""

    def redacted(self) -> dict[str, object]:
        """For printing: the token and the API key are replaced by REDACTED (no part of them is
        shown: a prefix narrows a guess); an unset one stays null."""
        data = self.model_dump(mode="json")
        for secret in SECRET_FIELDS:
            if getattr(self, secret):
                data[secret] = REDACTED
        return data

    def temporal_settings(self) -> TemporalSettings:
        from kruntimes.temporal.connect import TemporalSettings

        return TemporalSettings(
            address=self.temporalAddress,
            namespace=self.temporalNamespace,
            tlsCert=self.temporalTlsCert,
            tlsKey=self.temporalTlsKey,
            tlsCa=self.temporalTlsCa,
            tlsServerName=self.temporalTlsServerName,
            apiKey=self.temporalApiKey,
            apiKeyFile=self.temporalApiKeyFile,
            codecKeys=self.codecKeys,
        )


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("KRT_STATE_DIR")
    return Path(raw).expanduser() if raw else Path.home() / ".kruntimes"


def load(env: Mapping[str, str] | None = None) -> ClientConfig:
    env = os.environ if env is None else env
    directory = state_dir(env)
    data: dict[str, object] = {"stateDir": str(directory)}
    path = directory / CLIENT_FILE
    if path.is_file():
        data.update(json.loads(path.read_text()))
        data["stateDir"] = str(directory)
    for field, var in ENV.items():
        if env.get(var):
            data[field] = env[var]
    return ClientConfig.model_validate(data)


def write(directory: Path, config: ClientConfig) -> Path:
    path = directory / CLIENT_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config.model_dump(mode="json", exclude={"stateDir"}), f, indent=2)
    tmp.replace(path)
    return path
