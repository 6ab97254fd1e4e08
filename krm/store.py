"""The in-memory FunctionConfig store: what the evaluators read, what the feeders write.

Feeders (`kruntimes.krm.directory`, `kruntimes.krm.kubernetes`) each own one *source* (a name such as `dir` or
`kubernetes`) and replace, add or remove that source's FunctionConfigs; every change is seen by
the next lookup, so nothing restarts. Lookups go over all sources in a fixed order (source,
then namespace/name), so the same store contents always give the same answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kruntimes.krm import errors, tags
from kruntimes.krm.config import FunctionConfig, PodExecutor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Binary:
    """A binary that serves an image: the file to run and which FunctionConfig said so."""

    path: Path
    config: str
    tag: str


def _entry(entries: list[str], matched: str) -> str:
    """The podExecutor tag entry that `matched` (a version the rules took, or an entry) falls
    under: one pool of Runs serves every version of one entry."""
    version = tags.parse_version(matched)
    for entry in entries:
        if entry.strip() == matched.strip():
            return entry.strip()
        if version is not None and tags.parse_constraint(entry).allows(version):
            return entry.strip()
    return matched


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What serves an image on pods: the FunctionConfig's podExecutor for this image name, and the
    podExecutor tag entry the request's tag falls under ("" for a podExecutor without tags)."""

    config: str
    name: str
    tag: str
    executor: PodExecutor

    @property
    def image(self) -> str:
        return f"{self.name}:{self.tag}" if self.tag else self.name


class Store:
    def __init__(self, *, functions_dir: Path | None = None) -> None:
        self.functions_dir = functions_dir.resolve() if functions_dir is not None else None
        self._configs: dict[str, dict[str, FunctionConfig]] = {}
        self._errors: dict[str, dict[str, str]] = {}
        self._generation = 0
        self._changed = asyncio.Event()

    # --- writing (the feeders) ------------------------------------------------------------------

    def replace(self, source: str, configs: Iterable[FunctionConfig]) -> None:
        self._configs[source] = {c.key: c for c in configs}
        self._bump()

    def put(self, source: str, config: FunctionConfig) -> None:
        self._configs.setdefault(source, {})[config.key] = config
        self._bump()

    def remove(self, source: str, key: str) -> None:
        if self._configs.get(source, {}).pop(key, None) is not None:
            self._bump()

    def set_errors(self, source: str, problems: dict[str, str]) -> None:
        """The documents of `source` that were refused, by where they came from (kept for
        `errors()`; a refused document never removes the last valid version of its config)."""
        if self._errors.get(source, {}) != problems:
            self._errors[source] = dict(problems)
            self._bump()

    def _bump(self) -> None:
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    # --- reading --------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        return self._generation

    async def changed(self, *, after: int, timeout: float) -> int:
        """Wait (at most `timeout` seconds) until the store changed past generation `after`."""
        async with asyncio.timeout(timeout):
            while self._generation <= after:
                await self._changed.wait()
        return self._generation

    def configs(self) -> list[FunctionConfig]:
        return [self._configs[s][k] for s in sorted(self._configs) for k in sorted(self._configs[s])]

    def errors(self) -> dict[str, str]:
        return {
            where: text for source in sorted(self._errors) for where, text in self._errors[source].items()
        }

    def binary(self, image: str, tag: str) -> Binary:
        """The binary for `image` at `tag` by the tag rules of `kruntimes.krm.tags`; NotFound otherwise."""
        name = tags.split_image(image)[0]
        candidates = []
        for config in self.configs():
            executor = config.spec.binaryExecutor
            if executor is None or name not in config.spec.prefixes:
                continue
            constraints = tuple(tags.parse_constraint(t) for t in executor.tags)
            candidates.append(tags.Candidate(constraints, config))
        if not candidates:
            raise errors.NotFound(f"{image}: no FunctionConfig with a binaryExecutor names {name}")
        config, matched = tags.select(candidates, tag=tag, image=image)
        assert config.spec.binaryExecutor is not None
        return Binary(self._path(config, config.spec.binaryExecutor.path), config.key, matched)

    def pod(self, image: str, tag: str) -> PodTarget:
        """The podExecutor for `image` at `tag`, by the same tag rules as `binary` (a podExecutor
        without tags serves every tag); NotFound when none has a source or an entrypoint."""
        name = tags.split_image(image)[0]
        candidates = []
        any_tag: FunctionConfig | None = None
        for config in self.configs():
            executor = config.spec.podExecutor
            if executor is None or name not in config.spec.prefixes:
                continue
            if not executor.runnable:
                continue  # nothing to run: neither a source nor an entrypoint in the image
            if not executor.tags:
                any_tag = any_tag or config
                continue
            constraints = tuple(tags.parse_constraint(t) for t in executor.tags)
            candidates.append(tags.Candidate(constraints, config))
        if not candidates and any_tag is None:
            raise errors.NotFound(
                f"{image}: no FunctionConfig with a podExecutor source or entrypoint names {name}"
            )
        try:
            if not candidates:
                raise errors.NotFound(f"{image}: no podExecutor tag")
            config, matched = tags.select(candidates, tag=tag, image=image)
        except errors.NotFound:
            if any_tag is None:
                raise
            config, matched = any_tag, ""
        executor = config.spec.podExecutor
        assert executor is not None
        return PodTarget(config.key, name, _entry(executor.tags, matched), executor)

    def _path(self, config: FunctionConfig, raw: str) -> Path:
        path = Path(raw)
        if path.is_absolute():
            return path
        if self.functions_dir is None:
            raise errors.NotFound(
                f"FunctionConfig {config.key}: relative binary path {raw!r} but no functions directory is set"
            )
        resolved = (self.functions_dir / path).resolve()
        if not resolved.is_relative_to(self.functions_dir):
            raise errors.NotFound(
                f"FunctionConfig {config.key}: binary path {raw!r} leaves the functions directory"
            )
        return resolved
