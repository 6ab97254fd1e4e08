"""Every workflow the worker registers: what a recorded history replays against (so a new one is
replayed, and needs a recorded history)."""

from __future__ import annotations

from kruntimes.workers.assembly import POOL_WORKFLOWS, RUN_WORKFLOWS

WORKFLOWS = [*RUN_WORKFLOWS, *POOL_WORKFLOWS]
