"""Whether a runtime host's invoke port takes a client: it sends its accept frame only to a TLS
peer it admits, and so only reads that peer's requests."""

from __future__ import annotations

import socket
import ssl

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import frames


def accepted(address: str, context: ssl.SSLContext | None, *, server_hostname: str | None = None) -> bool:
    """Whether the invoke port sends its accept frame to this client (and so would read its requests)."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=server_hostname)
        sock.sendall(
            frames.encode_request(1, pb.InvokeFunctionRequest(registration_id="x").SerializeToString())
        )
        data = b""
        while len(data) < 9:
            chunk = sock.recv(9 - len(data))
            if not chunk:
                return False
            data += chunk
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return False
    finally:
        sock.close()
    return data == frames.encode_accepted()
