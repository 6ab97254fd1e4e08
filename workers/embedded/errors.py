"""The embedded platform's one error."""

from __future__ import annotations


class PlatformError(Exception):
    """A step of `krt up|down|status` failed; the message says which, and where its log is."""
