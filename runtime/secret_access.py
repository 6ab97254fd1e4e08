"""A host's side of who gets a secret (kruntimes.config.secret_access, shared with the worker,
which checks the Secret of an async invocation's callback the same way): its refusals and read
failures as the host's own errors, each with its reason."""

from __future__ import annotations

from collections.abc import Iterable

from kruntimes.config import secret_access as shared
from kruntimes.config.secret_access import BINDINGS_FILE, BindingsFile, RunCreator, SecretUse
from kruntimes.config.secret_files import FileSecrets
from kruntimes.config.secret_files import SecretInvalid as _Invalid
from kruntimes.config.secret_files import SecretNotFound as _NotFound
from kruntimes.runtime.errors import InvalidRequest, SecretForbidden, SecretNotFound

__all__ = ["BINDINGS_FILE", "BindingsFile", "RunCreator", "SecretAccess", "SecretUse"]


class SecretAccess:
    """The host's secrets, given only to Runs whose creator may use them."""

    def __init__(self, files: FileSecrets, bindings: BindingsFile) -> None:
        self._shared = shared.SecretAccess(files, bindings)

    def resolve(self, use: SecretUse, secrets: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The environment of `secrets` ((name, prefix) in order: the last wins on a clash).
        Every secret is decided and audited before any is read; one refusal is SecretForbidden."""
        try:
            return self._shared.resolve(use, secrets)
        except shared.SecretForbidden as e:
            raise SecretForbidden(e.message) from None
        except _NotFound as e:
            raise SecretNotFound(e.message) from e
        except _Invalid as e:
            raise InvalidRequest(e.message) from e
