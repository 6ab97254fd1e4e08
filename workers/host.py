"""The runtime host process: `krt host` or `python -m workers.host`.

Starts the Runtime Server and, with --ready-file, writes {"pid", "address", "hostUid"} there
once it serves (the process host provider waits for that file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import uuid
from pathlib import Path

from kruntimes import logs
from runtime.limits import ProcessLimits
from runtime.server import HostOptions, RuntimeHost


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt host", description="Run a kruntimes runtime host.")
    parser.add_argument("--host-id", required=True, help="stable host name, e.g. python-0")
    parser.add_argument("--runtime", required=True, help="the runtime this host serves, e.g. python")
    parser.add_argument("--listen", default="127.0.0.1:0", help="gRPC listen address (port 0: pick one)")
    parser.add_argument(
        "--invoke-listen",
        default=None,
        help="the raw invoke port's address (default: the --listen host, port 0; empty: none)",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="where workspaces live")
    parser.add_argument("--ready-file", type=Path, help="write the serving address here as JSON")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=64,
        help="threads for blocking work (registering, tasks, unregistering); invokes run on the event loop",
    )
    parser.add_argument("--address-space-mib", type=int, default=ProcessLimits().address_space_bytes // 2**20)
    parser.add_argument(
        "--gateway", action="append", default=[], help="a gateway's heartbeat address (repeatable)"
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument(
        "--host-uid",
        type=_uuid,
        default=None,
        help="this incarnation's uid, a UUID (a pod passes its own); default: a new one",
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def _uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a UUID: {text!r:.80}") from e


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    host = RuntimeHost(
        HostOptions(
            host_id=args.host_id,
            runtime=args.runtime,
            listen=args.listen,
            invoke_listen=args.invoke_listen,
            state_dir=args.state_dir,
            limits=ProcessLimits(address_space_bytes=args.address_space_mib * 2**20),
            max_workers=args.max_workers,
            gateways=tuple(args.gateway),
            heartbeat_interval_s=args.heartbeat_interval,
            host_uid=args.host_uid,
        )
    )
    address = host.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.ready_file:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "address": address, "hostUid": host.host_uid}))
        tmp.replace(args.ready_file)
    stop.wait()
    host.stop()


if __name__ == "__main__":
    main()
