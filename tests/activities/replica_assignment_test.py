"""A Function replica's registration: the signed assignment names the Function's uid and the
revision (what the gateway routes a Function's invocations by); a plain Run's names neither."""

from __future__ import annotations

import uuid

from temporalio.testing import ActivityEnvironment

from kruntimes.activities.runtime_host import RuntimeHostActivities
from kruntimes.contracts.function import ReplicaOf
from tests.activities.conftest import Scripted, function_run, register_input
from tests.support.pki import TestPKI


async def test_a_replicas_signed_assignment_names_its_function_and_revision(
    scripted: Scripted, pki: TestPKI
) -> None:
    hosts = RuntimeHostActivities(signer=pki.signer)
    try:
        function_uid = str(uuid.uuid4())
        replica = register_input(scripted.address, function_run())._replace(
            replicaOf=ReplicaOf(functionUid=function_uid, functionName="echo", revision=7)
        )
        await ActivityEnvironment().run(hosts.register_function, replica)
        await ActivityEnvironment().run(
            hosts.register_function, register_input(scripted.address, function_run())
        )
    finally:
        await hosts.close()
    first, plain = scripted.runtime.calls["RegisterFunction"].requests
    assigned = pki.verifier().verify(first.assignment)
    assert (assigned.function_uid, assigned.revision) == (function_uid, 7)
    assert assigned.run_uid == replica.runUid
    unassigned = pki.verifier().verify(plain.assignment)
    assert (unassigned.function_uid, unassigned.revision) == ("", 0)
