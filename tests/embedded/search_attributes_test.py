"""A state directory from an earlier version gets the search attributes added since: the dev
server registers its --search-attribute flags only when it creates its database, and a Run
upserting an attribute the namespace does not know would fail every workflow task."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kruntimes.temporal.devserver import DevServer, temporal_binary
from kruntimes.wire import search


def _custom(server: DevServer) -> dict[str, str]:
    listed = subprocess.run(
        [temporal_binary(), "operator", "search-attribute", "list", "--address", server.address]
        + ["--namespace", "default", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    custom: dict[str, str] = json.loads(listed.stdout)["customAttributes"]
    return custom


def test_a_database_from_before_an_attribute_existed_gets_it_at_start(tmp_path: Path) -> None:
    server = DevServer(state_dir=tmp_path / "temporal")
    server.start()
    try:
        assert set(_custom(server)) >= set(search.DEFINITIONS)
        # The database as an earlier version left it: without the newest attribute.
        subprocess.run(
            [temporal_binary(), "operator", "search-attribute", "remove", "--address", server.address]
            + ["--namespace", "default", "--name", search.PHASE_SINCE, "--yes"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert search.PHASE_SINCE not in _custom(server)
    finally:
        server.stop()

    again = DevServer(state_dir=tmp_path / "temporal")
    again.start()
    try:
        custom = _custom(again)
        assert custom[search.PHASE_SINCE] == "INDEXED_VALUE_TYPE_DATETIME"
        assert set(custom) >= set(search.DEFINITIONS)
    finally:
        again.stop()
