"""The gateway process never loads the Temporal SDK: it reads visibility over gRPC itself
(gateway/visibility.py), which keeps the SDK's API modules and core runtime (about 40 MB) out of
every gateway replica."""

from __future__ import annotations

import subprocess
import sys


def test_the_gateway_entry_point_loads_no_temporal_sdk() -> None:
    code = (
        "import sys, gateway.__main__, gateway.server, gateway.known, gateway.visibility\n"
        "from kruntimes.wire import search\n"
        "search.listed(namespace='default')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('temporalio')}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
