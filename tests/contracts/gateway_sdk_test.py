"""The gateway process loads neither the Temporal SDK nor pydantic: it reads visibility over gRPC
itself (gateway/visibility.py), which keeps the SDK's API modules and core runtime (about 40 MB)
out of every gateway replica, and its settings, role bindings and answers are plain Python
(pydantic and the models cost about 12 MB; the served OpenAPI document is generated ahead, by
`make openapi`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = (
    "import sys, kruntimes.workers.gateway, kruntimes.gateway.server, kruntimes.gateway.visibility, kruntimes.gateway.app\n"
    "from kruntimes.wire import search\n"
    "search.listed(namespace='default')\n"
    "kruntimes.workers.gateway.temporal_settings(kruntimes.workers.gateway.parse_args(['--temporal-address', '127.0.0.1:1', '--cert', 'c', '--key', 'k', '--peer-tls', 'p', '--assignment-public-key', 'a']))\n"
    "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(sys.argv[1])}))\n"
)


@pytest.mark.parametrize("package", ["temporalio", "pydantic"])
def test_the_gateway_entry_point_loads_neither_the_temporal_sdk_nor_pydantic(package: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CODE, package], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
