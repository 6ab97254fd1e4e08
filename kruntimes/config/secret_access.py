"""Who gets a secret: a Run's `envFrom` (resolved by its host) and the Secret that signs an async
invocation's callback (read by the worker, activities/callbacks.py) only for a creator the role
bindings let use that secret of the namespace (`verbs: [use-secrets]`, kruntimes.config.bindings);
an audit record of every decision, allowed or refused.

The host that reads a Run's secret decides, as the last hop before a value leaves the store:
whoever reached Temporal (a leaked admin credential, a script with the plain Temporal SDK) can
start a Run naming any secret, but a Run without a creator gets none, and one whose creator is not
bound to that secret is refused (SecretForbidden; the host's own error of that name is final: the
Run fails at its first attempt).

The bindings are a file the reader reads itself, `krt host --role-bindings` (default
`{state dir}/rolebindings.yaml`, the embedded platform's; in a host pod, the ConfigMap the chart
mounts at kubernetes_pods.ROLE_BINDINGS_FILE), again whenever it changed; one missing, unsafe
(writable by others, a symlink out of its directory, another user's) or malformed refuses every
secret, never allows.

Audit records are JSON log lines of the logger `kruntimes.audit.secrets` at INFO whatever the
process's log level: `audit: secret`, `decision` (allowed | refused), `use` (envFrom |
callback), `run_uid` (a callback's: its target's uid), `attempt`, `namespace`, `run`, `secret`,
`creator` (`kind:subject`, "" without one) and, when refused, `why`. Never a value, a key or a
path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kruntimes.config.bindings import BindingsError, RoleBindings, read_file
from kruntimes.config.secret_files import FileSecrets

log = logging.getLogger(__name__)
audit = logging.getLogger("kruntimes.audit.secrets")
audit.setLevel(logging.INFO)  # written whatever the process's --log-level

BINDINGS_FILE = "rolebindings.yaml"


class SecretForbidden(Exception):
    """Names the secret, the namespace and the creator; never a value or a path."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class RunCreator:
    """Who started the Run (kruntimes.api.spec.Creator), as the host received it (validated)."""

    kind: str
    subject: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.subject}"


@dataclass(frozen=True, slots=True)
class SecretUse:
    """One secret a Run names: which Run, which secret, who created the Run; `use` what for
    (`callback`: the Secret that signs a callback of the Run's or Function's invocations)."""

    run_uid: str
    attempt: int
    namespace: str
    run: str
    creator: RunCreator | None
    use: str = "envFrom"


class BindingsFile:
    """The host's role bindings, read when first needed and again whenever the file changed
    (device, inode, mtime, size or mode); a problem with it is kept and refuses every secret."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: object = None
        self._loaded: RoleBindings | BindingsError | None = None

    def current(self) -> RoleBindings:
        """The bindings in force; BindingsError saying why there are none usable."""
        try:
            st = os.stat(self.path)  # the target's: a ConfigMap update swaps the file behind the link
            signature: object = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)
        except FileNotFoundError:
            signature = "missing"
        except OSError as e:
            signature = ("error", e.errno)
        with self._lock:
            if signature != self._signature or self._loaded is None:
                self._loaded = self._read(signature)
                self._signature = signature
            loaded = self._loaded
        if isinstance(loaded, BindingsError):
            raise loaded
        return loaded

    def _read(self, signature: object) -> RoleBindings | BindingsError:
        if signature == "missing":
            problem = BindingsError(f"this host has no role bindings ({self.path.name} is missing)")
            log.warning("%s: no Run may use a secret", problem)
            return problem
        try:
            _, bindings = read_file(self.path)
        except BindingsError as e:
            log.warning("%s: no Run may use a secret until it is fixed", e)
            return e
        log.info("role bindings read", extra={"bindings": str(self.path)})
        return bindings


class SecretAccess:
    """The secrets of a store, given only to Runs whose creator may use them."""

    def __init__(self, files: FileSecrets, bindings: BindingsFile) -> None:
        self.files = files
        self.bindings = bindings

    def resolve(self, use: SecretUse, secrets: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The environment of `secrets` ((name, prefix) in order: the last wins on a clash).
        Every secret is decided and audited before any is read; one refusal is SecretForbidden."""
        wanted = list(secrets)
        refusals = [why for name in dict.fromkeys(n for n, _ in wanted) if (why := self._decide(use, name))]
        if refusals:
            raise SecretForbidden(refusals[0])
        env: dict[str, str] = {}
        for name, prefix in wanted:
            for key, value in self.files.read(use.namespace, name).items():
                env[prefix + key] = value
        return env

    def _decide(self, use: SecretUse, secret: str) -> str:
        """Why `use` may not have `secret` ("" when it may), audited either way."""
        why = ""
        if use.creator is None:
            why = (
                f"secret {secret!r} of namespace {use.namespace!r}: the Run has no creator (it was "
                "started without the kruntimes SDK or CLI, or by a client without an identity), "
                "and only a creator the role bindings name may use secrets"
            )
        else:
            try:
                allowed = self.bindings.current().may_use_secret(use.creator.subject, use.namespace, secret)
            except BindingsError as e:
                why = f"secret {secret!r} of namespace {use.namespace!r}: {e}"
            else:
                if not allowed:
                    why = (
                        f"the Run's creator {use.creator} is not bound to use secret {secret!r} of "
                        f"namespace {use.namespace!r} (role bindings: verbs [use-secrets])"
                    )
        record = {
            "audit": "secret",
            "decision": "refused" if why else "allowed",
            "use": use.use,
            "run_uid": use.run_uid,
            "attempt": use.attempt,
            "namespace": use.namespace,
            "run": use.run,
            "secret": secret,
            "creator": str(use.creator) if use.creator is not None else "",
        }
        if why:
            record["why"] = why
        audit.info("secret %s", record["decision"], extra=record)
        return why
