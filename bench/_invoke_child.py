"""The warm child of the raw chain in bench/invoke.py: echoes length-prefixed frames.

    python bench/_invoke_child.py

Reads frames (4-byte big-endian length, then the body) from stdin and writes each one back
unchanged to stdout; exits at EOF. Imports nothing beyond os and sys, so it starts fast.
"""

import os
import sys


def _read_exact(size: int) -> bytes:
    buf = b""
    while len(buf) < size:
        chunk = os.read(0, size - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf


def main() -> None:
    while True:
        header = _read_exact(4)
        body = _read_exact(int.from_bytes(header, "big"))
        frame = header + body
        while frame:
            frame = frame[os.write(1, frame) :]


if __name__ == "__main__":
    main()
