"""The bounds of one evaluation, in one place (the service, the CLI and the evaluators use them)."""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

MAX_RESOURCE_LIST_BYTES = 4 * MiB  # input and output ResourceList each
MAX_LOG_BYTES = 64 * KiB  # the function's stderr kept; the rest is counted and dropped
MAX_RESULTS = 1000
MAX_RESULT_VALUE_NODES = 10_000  # all currentValue/proposedValue nodes of one output together
MAX_IMAGE_BYTES = 512
MAX_TAG_BYTES = 128
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 900.0
