"""Role bindings (the embedded platform's `rolebindings.yaml`): who may do what in which namespace.

```yaml
bindings:
  - namespace: team-a          # a namespace, or "*" for every one
    users: [alice]             # the token file's users
    groups: [team-a-devs]      # the token file's groups
    # verbs: [invoke]          # the default: invoke the namespace's Runs (the gateway checks)
  - namespace: team-a
    verbs: [use-secrets]       # Runs created by these users may name the namespace's secrets
    users: [team-a-ci]         # in envFrom (the host that resolves them checks)
    secrets: [db]              # only these; without `secrets`, every secret of the namespace
```

`invoke` is checked against the caller of the gateway (its token's user and groups);
`use-secrets` against the Run's creator (`metadata.creator.subject`, who started it: the client
config's `identity`), which has no groups, so a binding with `use-secrets` names `users` only.
A binding grants only its verbs: `use-secrets` alone lets nobody invoke.

Parsed by hand, without pydantic (the gateway does not load it); every error names the entry and
the field (`bindings[2].secrets[0]: ...`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from kruntimes.api.names import validate_dns1123_label, validate_subject

ANY_NAMESPACE = "*"
INVOKE = "invoke"
USE_SECRETS = "use-secrets"
VERBS = (INVOKE, USE_SECRETS)
MAX_FILE_BYTES = 1024 * 1024
MAX_BINDINGS = 10_000
MAX_NAMES = 100_000  # users, groups and secrets of all bindings together (YAML aliases counted)
_BINDING_KEYS = ("namespace", "users", "groups", "verbs", "secrets")


class BindingsError(ValueError):
    """A bindings document or file cannot be used; the message names the entry and field."""


class Caller(Protocol):
    """Who calls the gateway (its Principal): a user and the groups they are in."""

    @property
    def user(self) -> str: ...

    @property
    def groups(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class Binding:
    namespace: str
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = (INVOKE,)
    secrets: tuple[str, ...] | None = None  # use-secrets: these only; None: every secret


class _Budget:
    """The names a document may still hold: an alias repeats a list without its bytes."""

    def __init__(self) -> None:
        self.left = MAX_NAMES

    def names(self, value: object, *, where: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise ValueError(f"{where}: must be a list of non-empty strings")
        self.left -= len(value)
        if self.left < 0:
            raise ValueError(f"{where}: the bindings name more than {MAX_NAMES} users, groups and secrets")
        if not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"{where}: must be a list of non-empty strings")
        return tuple(value)


def _binding(entry: object, *, where: str, budget: _Budget) -> Binding:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping")
    extra = sorted(str(k) for k in entry if k not in _BINDING_KEYS)
    if extra:
        raise ValueError(f"{where}.{extra[0]}: unknown field ({', '.join(_BINDING_KEYS)})")
    namespace = entry.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"{where}.namespace: required, a namespace or {ANY_NAMESPACE!r}")
    if namespace != ANY_NAMESPACE:
        validate_dns1123_label(namespace, field=f"{where}.namespace")
    _names = budget.names
    verbs = _names(entry.get("verbs", [INVOKE]), where=f"{where}.verbs")
    for i, verb in enumerate(verbs):
        if verb not in VERBS:
            raise ValueError(f"{where}.verbs[{i}]: {verb!r:.40} is not a verb ({', '.join(VERBS)})")
    if not verbs:
        raise ValueError(f"{where}.verbs: name at least one ({', '.join(VERBS)})")
    users = _names(entry.get("users", []), where=f"{where}.users")
    groups = _names(entry.get("groups", []), where=f"{where}.groups")
    secrets: tuple[str, ...] | None = None
    if USE_SECRETS in verbs:
        if groups:
            raise ValueError(
                f"{where}.groups: a Run's creator is one identity, without groups: "
                f"a binding with {USE_SECRETS} names users"
            )
        for i, user in enumerate(users):
            validate_subject(user, field=f"{where}.users[{i}]")
    if "secrets" in entry:
        if USE_SECRETS not in verbs:
            raise ValueError(f"{where}.secrets: only a binding with {USE_SECRETS} names secrets")
        secrets = _names(entry["secrets"], where=f"{where}.secrets")
        for i, secret in enumerate(secrets):
            validate_dns1123_label(secret, field=f"{where}.secrets[{i}]")
    return Binding(namespace=namespace, users=users, groups=groups, verbs=verbs, secrets=secrets)


def parse(document: object) -> tuple[Binding, ...]:
    """The bindings of a parsed document; ValueError naming the field that is wrong."""
    if document is None:
        return ()
    if not isinstance(document, dict):
        raise ValueError("the document must be a mapping with a `bindings` list")
    unknown = sorted(str(k) for k in document if k != "bindings")
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (only `bindings`)")
    entries = document.get("bindings", [])
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ValueError("bindings: must be a list")
    if len(entries) > MAX_BINDINGS:
        raise ValueError(f"bindings: at most {MAX_BINDINGS} entries")
    budget = _Budget()
    return tuple(_binding(entry, where=f"bindings[{i}]", budget=budget) for i, entry in enumerate(entries))


class RoleBindings:
    """Who may invoke (a caller's user or group) and who may use secrets (a Run creator's
    subject), per namespace; a `*` binding covers every namespace."""

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self._users: dict[str, set[str]] = {}
        self._groups: dict[str, set[str]] = {}
        # namespace -> subject -> the secrets it may use (None: every secret)
        self._secrets: dict[str, dict[str, set[str] | None]] = {}
        for binding in bindings:
            if INVOKE in binding.verbs:
                self._users.setdefault(binding.namespace, set()).update(binding.users)
                self._groups.setdefault(binding.namespace, set()).update(binding.groups)
            if USE_SECRETS in binding.verbs:
                granted = self._secrets.setdefault(binding.namespace, {})
                for user in binding.users:
                    held = granted.get(user, set())
                    if held is None or binding.secrets is None:
                        granted[user] = None
                    else:
                        granted[user] = held | set(binding.secrets)

    @classmethod
    def from_yaml(cls, text: str) -> RoleBindings:
        """Parse the bindings document; raises BindingsError (a ValueError) naming what is wrong."""
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BindingsError(f"role bindings are not valid YAML: {e}") from None
        try:
            parsed = parse(document)
        except ValueError as e:
            raise BindingsError(f"role bindings are malformed: {e}") from None
        return cls(parsed)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RoleBindings:
        return cls.from_yaml(Path(path).read_text(encoding="utf-8"))

    def allows(self, caller: Caller, namespace: str) -> bool:
        """Whether `caller` may invoke the Runs of `namespace`."""
        for bound in (namespace, ANY_NAMESPACE):
            if caller.user in self._users.get(bound, ()):
                return True
            if not self._groups.get(bound, set()).isdisjoint(caller.groups):
                return True
        return False

    def may_use_secret(self, subject: str, namespace: str, secret: str) -> bool:
        """Whether a Run created by `subject` in `namespace` may have `secret` resolved."""
        for bound in (namespace, ANY_NAMESPACE):
            granted = self._secrets.get(bound, {})
            if subject in granted:
                secrets = granted[subject]
                if secrets is None or secret in secrets:
                    return True
        return False


def _open(path: Path) -> int:
    """`path` opened for reading; a symlink only when it stays in its own directory (a ConfigMap
    volume's `rolebindings.yaml -> ..data/rolebindings.yaml`), never one that leads elsewhere."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise BindingsError(f"role bindings {path.name}: cannot open ({e.strerror})") from e
    home = os.path.realpath(path.parent)
    target = os.path.realpath(path)
    if os.path.commonpath([home, target]) != home:
        raise BindingsError(f"role bindings {path.name}: a symlink out of its directory")
    try:
        return os.open(target, flags)
    except OSError as e:
        raise BindingsError(f"role bindings {path.name}: cannot open ({e.strerror})") from e


def read_file(path: Path) -> tuple[tuple[int, int, int, int, int], RoleBindings]:
    """The bindings in `path` with the file's signature (device, inode, mtime, size, mode), for
    whoever keeps them and reads the file again when it changes (a host). The file must be a
    regular file (or a link to one in its own directory), owned by this user or root and
    writable by nobody else: it decides who gets secrets. BindingsError (the file's name, never
    its other content) otherwise."""
    fd = _open(path)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BindingsError(f"role bindings {path.name}: not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise BindingsError(f"role bindings {path.name}: owned by uid {st.st_uid}, not by this user")
        if st.st_mode & 0o022:
            raise BindingsError(
                f"role bindings {path.name} has mode {stat.S_IMODE(st.st_mode):04o}: "
                "it must not be writable by group or others (use 0644 or 0600)"
            )
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise BindingsError(f"role bindings {path.name}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BindingsError(f"role bindings {path.name}: not UTF-8") from None
    signature = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)
    return signature, RoleBindings.from_yaml(text)
