"""Benchmark: the gateway's memory with 10,000 routes and 10,000 known Runs, next to the same
gateway process with none (its baseline, measured in the same run).

    .venv/bin/python bench/gateway_memory.py [--hosts 20] [--per-host 500] [--known 10000] [--beats 5]

A real gateway process (`python -m gateway`, the flags `krt up` gives it, its known-Runs view on a
real Temporal dev server) is fed as a platform of HOSTS x PER_HOST Runs would feed it: each host
(this process, presenting that host's real certificate of the platform CA) keeps one heartbeat
stream open and sends its full snapshot of PER_HOST registrations, each with a signed
assignment, BEATS times; the dev server holds KNOWN running RunWorkflows carrying the Runs'
search attributes, which the view lists. The gateway's VmRSS is read at 0 routes, at half and
at all routes (once its metrics say so), and after the known-Runs view has listed them.

Target (issue 13): the gateway's RSS with 10,000 routes <= 100 MB. Reported with the ratio to the
same gateway's RSS at rest. Prints a table and a final JSON line {"bench": "gateway-memory", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _benchlib import BenchError, note, print_json_line, table

from kruntimes.pki import Identity, Role
from kruntimes.pki.local import ensure_tls
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.temporal.devserver import DevServer
from tests.support.pki import GATEWAY, TestPKI

TARGET_MB = 100.0
RUNTIME = "bash"
WAIT_S = 300.0


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    if found is None:
        raise BenchError(f"no VmRSS for pid {pid}")
    return int(found.group(1)) / 1024


def snapshot(pki: TestPKI, host_id: str, host_uid: str, *, per_host: int, sequence: int) -> hb.HostHeartbeat:
    beat = hb.HostHeartbeat(
        host_id=host_id,
        host_uid=host_uid,
        runtime=RUNTIME,
        address=f"127.0.0.1:{20000 + int(host_id.rsplit('-', 1)[1])}",
        invoke_address=f"127.0.0.1:{30000 + int(host_id.rsplit('-', 1)[1])}",
        sequence=sequence,
        interval_ms=60_000,
    )
    for i in range(per_host):
        uid, name = str(uuid.UUID(int=(int(host_uid[:8], 16) << 96) + i)), f"{host_id}-fn-{i}"
        beat.registrations.append(
            pb.RegistrationState(
                run_uid=uid,
                attempt=1,
                namespace="default",
                name=name,
                runtime=RUNTIME,
                registration_id=f"reg-{uuid.uuid4().hex}",
                phase=pb.REGISTRATION_PHASE_READY,
                assignment=pki.sign(
                    run_uid=uid, attempt=1, host_id=host_id, host_uid=host_uid, name=name, runtime=RUNTIME
                ),
            )
        )
    return beat


class FakeHost:
    """One host's heartbeat stream to the gateway, with that host's certificate."""

    def __init__(self, pki: TestPKI, address: str, index: int, *, per_host: int) -> None:
        self.host_id, self.host_uid = f"{RUNTIME}-{index}", uuid.uuid4().hex
        tls = pki.peer(Identity.host(runtime=RUNTIME, host_id=self.host_id))
        self.channel = grpc.aio.secure_channel(
            address, tls.channel_credentials(), options=tls.channel_options(Role.GATEWAY)
        )
        self.beat = snapshot(pki, self.host_id, self.host_uid, per_host=per_host, sequence=1)
        self.queue: asyncio.Queue[hb.HostHeartbeat | None] = asyncio.Queue()
        self.call = hb_grpc.RouteHeartbeatStub(self.channel).Heartbeats(self._stream())

    async def _stream(self) -> AsyncIterator[hb.HostHeartbeat]:
        while (beat := await self.queue.get()) is not None:
            yield beat

    def send(self, sequence: int) -> None:
        self.beat.sequence = sequence
        self.queue.put_nowait(self.beat)

    async def close(self) -> None:
        self.queue.put_nowait(None)
        self.call.cancel()
        await self.channel.close()


async def fill_known(address: str, count: int) -> None:
    """`count` running RunWorkflows with the Runs' search attributes (no worker polls their queue)."""
    from temporalio.common import SearchAttributePair, TypedSearchAttributes

    from kruntimes.temporal.connect import connect
    from kruntimes.wire import search_typed

    client = await connect(address, "default")
    slots = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with slots:
            await client.start_workflow(
                "RunWorkflow",
                id=f"run/default/known-{i}",
                task_queue="nobody-polls",
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(search_typed.KRT_RUN_UID, str(uuid.uuid4())),
                        SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                        SearchAttributePair(search_typed.KRT_RUNTIME, RUNTIME),
                        SearchAttributePair(search_typed.KRT_PHASE, "Ready"),
                    ]
                ),
            )

    await asyncio.gather(*(one(i) for i in range(count)))


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as answer:
        text = await answer.text()
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} within {WAIT_S:g} s")
        await asyncio.sleep(0.2)


async def bench(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="krt-gwmem-") as tmp:
        root = Path(tmp)
        pki = TestPKI.create(root / "pki")
        server = DevServer(state_dir=root / "temporal", persistent=False)
        server.start()
        try:
            if args.known:
                started = time.monotonic()
                await fill_known(server.address, args.known)
                note(f"{args.known} known Runs started in {time.monotonic() - started:.0f} s")
            tls = ensure_tls(root / "gateway-tls")
            token = f"bench-{uuid.uuid4().hex}"
            tokens, bindings, ready = root / "tokens.csv", root / "bindings.yaml", root / "ready.json"
            tokens.write_text(f'{token},admin,0,"admins"\n')
            tokens.chmod(0o600)
            bindings.write_text("bindings:\n  - namespace: default\n    users: [admin]\n")
            argv = [sys.executable, "-m", "gateway", "--listen", "127.0.0.1:0"]
            argv += ["--heartbeat-listen", "127.0.0.1:0", "--cert", str(tls.cert), "--key", str(tls.key)]
            argv += [
                "--token-file",
                str(tokens),
                "--role-bindings",
                str(bindings),
                "--ready-file",
                str(ready),
            ]
            argv += [
                "--peer-tls",
                str(pki.directory(GATEWAY)),
                "--assignment-public-key",
                str(pki.public_key),
            ]
            argv += ["--temporal-address", server.address, "--log-level", "warning"]
            log = (root / "gateway.log").open("wb")
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, cwd=Path(__file__).parent.parent
            )
            hosts: list[FakeHost] = []
            try:

                async def serving() -> bool:
                    if proc.returncode is not None:
                        raise BenchError(f"the gateway exited: {(root / 'gateway.log').read_text()[-2000:]}")
                    return ready.exists()

                await until(serving, "the gateway did not serve")
                info = json.loads(ready.read_text())
                url, heartbeats = info["url"], info["heartbeatAddress"]
                context = ssl.create_default_context(cafile=str(tls.ca_cert))
                headers = {"Authorization": f"Bearer {token}"}
                async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=context), headers=headers
                ) as http:

                    async def known_listed() -> bool:
                        # the view has listed the Runs once a miss for an unknown uid is a 404
                        async with http.post(
                            f"{url}/v1/namespaces/default/runtimes/{RUNTIME}/functions/{uuid.uuid4()}:invoke",
                            json={},
                        ) as answer:
                            return bool(answer.status == 404)

                    await until(known_listed, "the known-Runs view did not list the Runs")
                    rss: dict[str, float] = {"rest": rss_mb(proc.pid)}
                    total = args.hosts * args.per_host
                    for i in range(args.hosts):
                        hosts.append(FakeHost(pki, heartbeats, i, per_host=args.per_host))
                    for round_ in range(1, args.beats + 1):
                        for i, host in enumerate(hosts):
                            host.send(round_)
                            if round_ == 1 and i + 1 == args.hosts // 2:

                                async def half() -> bool:
                                    return bool(await metric(http, url, "krt_gateway_routes") >= total // 2)

                                await until(half, "the gateway did not route half the Runs")
                                rss["half"] = rss_mb(proc.pid)

                        async def all_routed() -> bool:
                            return bool(await metric(http, url, "krt_gateway_routes") >= total)

                        await until(all_routed, "the gateway did not route every Run")
                    rss["all"] = rss_mb(proc.pid)
            finally:
                for host in hosts:
                    await host.close()
                if proc.returncode is None:
                    proc.terminate()
                    await proc.wait()
                log.close()
        finally:
            server.stop()
    return {
        "hosts": args.hosts,
        "perHost": args.per_host,
        "known": args.known,
        "beats": args.beats,
        "rssMb": {k: round(v, 1) for k, v in rss.items()},
        "ratioToRest": round(rss["all"] / rss["rest"], 3),
        "targetMb": TARGET_MB,
        "met": rss["all"] <= TARGET_MB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--per-host", type=int, default=500)
    parser.add_argument("--known", type=int, default=10_000, help="running RunWorkflows the view lists")
    parser.add_argument("--beats", type=int, default=5, help="full snapshots each host sends")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    rss = result["rssMb"]
    assert isinstance(rss, dict)
    rows = [
        ["", "gateway RSS", "target"],
        ["at rest (0 routes, known Runs listed)", f"{rss['rest']} MB", ""],
        [f"{args.hosts * args.per_host // 2} routes", f"{rss.get('half')} MB", ""],
        [
            f"{args.hosts * args.per_host} routes, {args.beats} snapshots each",
            f"{rss['all']} MB ({result['ratioToRest']}x rest)",
            f"<= {TARGET_MB:g} MB: {'met' if result['met'] else 'MISSED'}",
        ],
    ]
    for line in table(rows, align_right=False):
        print(line)
    print_json_line({"bench": "gateway-memory", **result})


if __name__ == "__main__":
    main()
