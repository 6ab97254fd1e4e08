"""What every platform process does around serving: say where it serves, and stop when told.

- The ready file: a process started with `--ready-file PATH` writes one JSON object there once it
  serves, `{"pid": ..., **fields}` (where it listens, which incarnation it is). It is written to
  a sibling `.tmp` file and renamed over PATH, so a reader sees the whole object or nothing.
- Stopping: SIGTERM and SIGINT set an event the process waits on, and it shuts down in order.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def write_ready_file(path: Path, **fields: object) -> None:
    """Write ``{"pid": this process, **fields}`` to ``path`` at once (through ``path``.tmp)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **fields}))
    tmp.replace(path)


def stop_event() -> asyncio.Event:
    """An event SIGTERM and SIGINT set from now on (on the running loop): what a serving process
    waits on before it shuts down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    return stop
