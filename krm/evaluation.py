"""What an evaluator is asked and what it answers (plain data, no I/O)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kruntimes.krm import errors
from kruntimes.krm.limits import (
    DEFAULT_TIMEOUT_SECONDS,
    MAX_IMAGE_BYTES,
    MAX_RESOURCE_LIST_BYTES,
    MAX_TAG_BYTES,
    MAX_TIMEOUT_SECONDS,
)
from kruntimes.krm.resources import ExpansionTooLarge, Result, YamlError, expanded_size


@dataclass(frozen=True, slots=True)
class Request:
    """One evaluation: `image` names the function, `tag` optionally selects its version (a
    version or a semver constraint; empty: the image reference's tag), `resource_list` is the
    serialized input ResourceList, `deadline` a `time.monotonic()` instant."""

    image: str
    resource_list: bytes
    deadline: float
    tag: str = ""

    @classmethod
    def new(cls, *, image: str, resource_list: bytes, tag: str = "", timeout: float | None = None) -> Request:
        """A validated request; `timeout` in seconds (None: the default)."""
        check_image(image)
        check_tag(tag)
        if len(resource_list) > MAX_RESOURCE_LIST_BYTES:
            raise errors.InputTooLarge(
                f"the input ResourceList is {len(resource_list)} bytes, over the bound of "
                f"{MAX_RESOURCE_LIST_BYTES}"
            )
        try:
            expanded_size(resource_list, MAX_RESOURCE_LIST_BYTES)
        except ExpansionTooLarge as e:
            raise errors.InputTooLarge(f"the input ResourceList: {e}") from e
        except YamlError:
            pass  # not YAML: the function answers that
        seconds = DEFAULT_TIMEOUT_SECONDS if timeout is None else timeout
        if not 0 < seconds <= MAX_TIMEOUT_SECONDS:
            raise errors.InvalidRequest(f"timeout must be in (0, {MAX_TIMEOUT_SECONDS:g}] seconds")
        return cls(image=image, resource_list=resource_list, tag=tag, deadline=time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What a function produced: its output ResourceList (raw bytes, as it wrote them), its
    stderr (`log`, bounded; `log_truncated` when some was dropped), the parsed results and its
    exit code. A failed evaluation rides on `errors.ExecutionError.evaluation`."""

    resource_list: bytes
    log: bytes = b""
    log_truncated: bool = False
    results: tuple[Result, ...] = field(default=())
    exit_code: int = 0


def _printable(value: str) -> bool:
    return value.isprintable() and not any(c.isspace() for c in value)


def check_image(image: str) -> None:
    if not image:
        raise errors.InvalidRequest("image is empty")
    if len(image.encode()) > MAX_IMAGE_BYTES or not _printable(image):
        raise errors.InvalidRequest(
            f"image must be at most {MAX_IMAGE_BYTES} bytes of printable characters without spaces"
        )


def check_tag(tag: str) -> None:
    # A constraint such as ">= 0.4.0 < 0.5.0" has spaces; control characters are refused.
    if len(tag.encode()) > MAX_TAG_BYTES or not tag.isprintable():
        raise errors.InvalidRequest(f"tag must be at most {MAX_TAG_BYTES} bytes of printable characters")
