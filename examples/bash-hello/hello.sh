#!/usr/bin/env bash
# examples/bash-hello: a bash function. The payload arrives on stdin; stdout is the JSON outputs.
set -euo pipefail
payload=$(cat)
echo "bash saw ${#payload} bytes" >&2
printf '{"greeting": "hello from bash", "payloadBytes": %d}\n' "${#payload}"
