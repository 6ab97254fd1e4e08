"""Who may invoke a Function: the Run's rules with the Function as the resource. A binding for a
namespace covers its Functions (embedded); on a cluster the review asks for `get` on that Function
(resource `functions` of group kruntimes.io); a Function's cached decision is never a Run's."""

from __future__ import annotations

import uuid

from kruntimes.gateway.auth import FUNCTIONS, Resource, cache_key
from kruntimes.gateway.auth.kubernetes import RUNS_GROUP, access_review


def test_a_clusters_review_asks_for_the_function_by_name() -> None:
    uid = str(uuid.uuid4())
    attributes = access_review(Resource("team-a", "web", uid, kind=FUNCTIONS)).spec.resource_attributes
    assert (attributes.verb, attributes.group, attributes.resource) == ("get", RUNS_GROUP, "functions")
    assert (attributes.namespace, attributes.name) == ("team-a", "web")
    run = access_review(Resource("team-a", "web", uid)).spec.resource_attributes
    assert run.resource == "runs"


def test_a_functions_decision_is_cached_apart_from_a_runs() -> None:
    uid = str(uuid.uuid4())
    assert cache_key("t", Resource("a", "web", uid)) != cache_key(
        "t", Resource("a", "web", uid, kind=FUNCTIONS)
    )
