"""An assignment with every field set, for the suites that sign and verify one."""

from __future__ import annotations

import uuid

from kruntimes.pki.assignments import SignedAssignment

ASSIGNMENT = SignedAssignment(
    run_uid=str(uuid.uuid4()),
    attempt=3,
    host_id="python-0",
    host_uid=str(uuid.uuid4()),
    namespace="default",
    name="hello",
    runtime="python",
)
