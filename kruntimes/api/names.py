"""Validators for names and identifiers: each returns its value or raises ValueError naming the rule.
A handler's rule is its adapter's (kruntimes.api.adapters)."""

from __future__ import annotations

import re
import uuid

from kruntimes.api._text import has_control_chars, utf8_len
from kruntimes.api.limits import MAX_FILE_NAME_BYTES, MAX_INVOCATION_ID_BYTES

DNS1123_LABEL_MAX = 63
RESERVED_ENV_PREFIX = "KRT_"

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Who started a Run (its creator's kind) and the identity it names: a subject is what the role
# bindings' `users` name (a token file's user, a Kubernetes user such as
# system:serviceaccount:ns:name, an e-mail address), ASCII so a log line reads as it is.
CREATOR_KINDS = ("sdk", "cli", "mcp", "schedule")
MAX_SUBJECT_CHARS = 128
_SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:/+=-]*")


def validate_dns1123_label(value: str, *, field: str) -> str:
    if not 1 <= len(value) <= DNS1123_LABEL_MAX:
        raise ValueError(
            f"{field}: a DNS-1123 label must be 1..{DNS1123_LABEL_MAX} characters: {value!r:.80}"
        )
    if not _DNS1123_LABEL.fullmatch(value):
        raise ValueError(
            f"{field}: a DNS-1123 label is lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit: {value!r}"
        )
    return value


def validate_run_uid(value: str, *, field: str = "run uid") -> str:
    """A Run uid: a UUID in its canonical form (lowercase, hyphenated), so one Run has one spelling
    in every map, path and log."""
    try:
        parsed = uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        parsed = None
    if parsed is None or str(parsed) != value:
        raise ValueError(f"{field}: must be a lowercase hyphenated UUID: {value!r:.80}")
    return value


def is_run_uid(value: str) -> bool:
    """Whether `value` is a Run uid in its canonical form (see validate_run_uid)."""
    try:
        validate_run_uid(value)
    except ValueError:
        return False
    return True


def validate_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"env name {name!r:.80} must match [A-Za-z_][A-Za-z0-9_]*")
    if name.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"env name {name!r} uses the reserved prefix {RESERVED_ENV_PREFIX!r}")
    return name


def validate_relative_file_name(name: str) -> str:
    """A normalised relative path that stays inside the directory it is joined to."""
    if not name:
        raise ValueError("file name must not be empty")
    utf8_len(name, field="file name")
    if has_control_chars(name):
        raise ValueError(f"file name {name!r:.80} must not contain NUL or control characters")
    if "\\" in name:
        raise ValueError(f"file name {name!r:.80} must use '/' separators, not backslash")
    if name.startswith("/"):
        raise ValueError(f"file name {name!r:.80} must be relative, not absolute")
    for part in name.split("/"):
        if part == "..":
            raise ValueError(f"file name {name!r:.80} must not contain a '..' component")
        if part in ("", "."):
            raise ValueError(f"file name {name!r:.80} must be normalised (no '//', './' or trailing '/')")
        if utf8_len(part, field="file name") > MAX_FILE_NAME_BYTES:
            raise ValueError(f"file name component exceeds {MAX_FILE_NAME_BYTES} bytes: {part!r:.80}")
    return name


def validate_invocation_id(value: str) -> str:
    size = utf8_len(value, field="invocation id")
    if not 1 <= size <= MAX_INVOCATION_ID_BYTES:
        raise ValueError(f"invocation id must be 1..{MAX_INVOCATION_ID_BYTES} bytes of UTF-8, got {size}")
    if has_control_chars(value):
        raise ValueError("invocation id must not contain control characters")
    if not value.isascii() or not value.isprintable():
        # format characters (U+202E turns a log line around), look-alikes: ids are ASCII
        raise ValueError("invocation id must be printable ASCII")
    return value


def validate_creator_kind(value: str, *, field: str = "creator.kind") -> str:
    if value not in CREATOR_KINDS:
        raise ValueError(f"{field}: one of {', '.join(CREATOR_KINDS)}, not {value!r:.40}")
    return value


def validate_subject(value: str, *, field: str = "creator.subject") -> str:
    """An identity a Run is created by and a role binding names: 1..128 ASCII letters, digits and
    `._@:/+=-`, starting with a letter or digit."""
    if not 1 <= len(value) <= MAX_SUBJECT_CHARS or not _SUBJECT.fullmatch(value):
        raise ValueError(
            f"{field}: 1..{MAX_SUBJECT_CHARS} ASCII letters, digits and ._@:/+=- "
            f"(starting with a letter or digit): {value!r:.80}"
        )
    return value
