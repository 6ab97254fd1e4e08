"""ScheduledRunWorkflow's contract: a Run started by a Temporal schedule."""

from __future__ import annotations

from kruntimes.api._base import ApiModel
from kruntimes.api.run import Run


class ScheduledRunInput(ApiModel):
    """What a schedule starts each time: the Run to create (its name is the schedule's, its uid
    unset), named `<schedule name>-<scheduled time>` per start."""

    run: Run
    schedule: str  # the schedule's name
