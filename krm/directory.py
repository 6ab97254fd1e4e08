"""FunctionConfigs from a directory of YAML files, re-read when they change (embedded mode).

Every `*.yaml`/`*.yml` file directly in the directory (names starting with `.` skipped, so a
Kubernetes ConfigMap volume's `..data` is not read twice; symlinks followed) may hold several
documents, each a FunctionConfig. The directory is polled: a file is re-read when its size,
mtime or inode changed, or while its mtime is recent enough that a same-size rewrite in the same
clock tick could hide (the racy-timestamp rule). A file that fails to parse is reported through
`Store.set_errors` and its last valid contents are kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from kruntimes.krm import config as fc
from kruntimes.krm.resources import YamlError, load_all
from kruntimes.krm.store import Store

log = logging.getLogger(__name__)

SOURCE = "dir"
MAX_FILES = 1000
MAX_FILE_BYTES = 1024 * 1024
RACY_SECONDS = 2.0
MIN_INTERVAL, MAX_INTERVAL = 0.05, 60.0


@dataclass(frozen=True, slots=True)
class _Seen:
    stat: tuple[int, int, int]  # size, mtime_ns, inode
    digest: bytes
    configs: tuple[fc.FunctionConfig, ...]


class DirectoryFeed:
    def __init__(self, store: Store, directory: Path, *, interval: float = 1.0) -> None:
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"interval must be in [{MIN_INTERVAL}, {MAX_INTERVAL}] seconds")
        self.store = store
        self.directory = directory
        self.interval = interval
        self._seen: dict[str, _Seen] = {}
        self._problems: dict[str, str] = {}

    def _files(self) -> list[Path]:
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except OSError as e:
            self._problems[str(self.directory)] = f"cannot list the directory: {e.strerror}"
            return []
        self._problems.pop(str(self.directory), None)
        names = [
            Path(e.path)
            for e in entries
            if not e.name.startswith(".") and e.name.endswith((".yaml", ".yml")) and e.is_file()
        ]
        if len(names) > MAX_FILES:
            self._problems[str(self.directory)] = f"more than {MAX_FILES} files; the rest are ignored"
            names = names[:MAX_FILES]
        return names

    def _read(self, path: Path, previous: _Seen | None) -> _Seen | None:
        where = str(path)
        try:
            st = path.stat()
            stat = (st.st_size, st.st_mtime_ns, st.st_ino)
            racy = time.time() - st.st_mtime_ns / 1e9 < RACY_SECONDS
            if previous is not None and previous.stat == stat and not racy:
                return previous
            if st.st_size > MAX_FILE_BYTES:
                raise YamlError(f"over {MAX_FILE_BYTES} bytes")
            data = path.read_bytes()[: MAX_FILE_BYTES + 1]
        except OSError as e:
            self._problems[where] = f"{where}: cannot read: {e.strerror}"
            return previous
        digest = hashlib.sha256(data).digest()
        if previous is not None and previous.digest == digest:
            return _Seen(stat, digest, previous.configs)
        try:
            if len(data) > MAX_FILE_BYTES:
                raise YamlError(f"over {MAX_FILE_BYTES} bytes")
            documents = [d for d in load_all(data) if d is not None]
            configs = tuple(fc.parse(d, source=f"{where}[{i}]") for i, d in enumerate(documents))
        except (YamlError, fc.FunctionConfigError) as e:
            text = str(e) if isinstance(e, fc.FunctionConfigError) else f"{where}: {e}"
            if self._problems.get(where) != text:
                log.warning("FunctionConfig file refused (its last valid contents are kept): %s", text)
            self._problems[where] = text
            return previous
        self._problems.pop(where, None)
        return _Seen(stat, digest, configs)

    def _collect(self) -> dict[str, _Seen]:
        seen: dict[str, _Seen] = {}
        for path in self._files():
            entry = self._read(path, self._seen.get(str(path)))
            if entry is not None:
                seen[str(path)] = entry
        return seen

    def scan(self) -> None:
        """Read what changed and hand the directory's FunctionConfigs to the store."""
        self._apply(self._collect())

    def _apply(self, seen: dict[str, _Seen]) -> None:
        # On the event loop's thread: the store wakes its waiters from here.
        for gone in set(self._problems) - set(seen) - {str(self.directory)}:
            if not Path(gone).exists():
                del self._problems[gone]
        before = [c for s in self._seen.values() for c in s.configs]
        after = [c for s in seen.values() for c in s.configs]
        self._seen = seen
        if before != after:
            self.store.replace(SOURCE, after)
        self.store.set_errors(SOURCE, self._problems)

    async def run(self) -> None:
        """Scan now and then every `interval` seconds, until cancelled."""
        while True:
            self._apply(await asyncio.to_thread(self._collect))
            await asyncio.sleep(self.interval)
