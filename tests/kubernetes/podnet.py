"""A pod's sandbox on the test node, as a node makes it: a process (a pause container,
container.py --pod-sandbox) holds the pod's network namespace, with an address of its own on a
veth pair (no port rewriting), which the pod's containers join. For a pod of `hostUsers: false` it
also holds the pod's user namespace, its uids and gids a range of the node's no other pod has,
which owns the network namespace: the pod's root holds its capabilities only over what that
namespace owns: its network namespace (packet rules) and the namespaces it makes (a function's
PID and mount namespaces).

Addresses and uid ranges come from slots (a /30 of ``SUBNET`` and ``USERNS_SIZE`` uids from
``USERNS_BASE`` each), each held while its pod runs by an abstract Unix socket bound to its name
(gone with its last descriptor, no file left), so test nodes of other test runs on the machine
never take the same. The node's services the pod dials on 127.0.0.1 (the
gateways' heartbeat ports, from the host's --gateway args) are reached as a Service's are,
through DNAT: in the pod, 127.0.0.1:port to the node's end of the veth; on the node, that to
127.0.0.1:port (route_localnet on the two interfaces the test made, nowhere else). Everything is
removed with the pod: the sandbox killed, its network namespace and both veth ends go with it; the
node's DNAT table goes when the kubelet stops (``NodeTable.remove``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import os
import random
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBNET = ipaddress.ip_network("10.244.0.0/18")  # a /30 per pod: 4,096 slots
SLOTS = 4096
# Below the host's own function uid ranges (from 2,000,000,000): 4,096 × 65,536 uids.
USERNS_BASE, USERNS_SIZE = 1_000_000_000, 65_536
SLOT_NAME = "\0krt-test-node-slot-{}"  # abstract: the machine's network namespace, no file
_TABLES = itertools.count()  # a table per kubelet: several may run in one process
SANDBOX_START_S = 10.0
CONTAINER_RUNTIME = Path(__file__).with_name("container.py")


class PodNetworkError(RuntimeError):
    """The pod's sandbox could not be made."""


async def _run(*argv: str, stdin: bytes | None = None) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(stdin), SANDBOX_START_S)
    if process.returncode != 0:
        raise PodNetworkError(f"{' '.join(argv)}: {out.decode(errors='replace').strip()}")


def gateway_ports(container: dict[str, Any]) -> list[int]:
    """The node loopback ports the host dials: its --gateway HOST:PORT args on 127.0.0.1."""
    args = [*(container.get("command") or []), *(container.get("args") or [])]
    ports = []
    for flag, value in zip(args, args[1:], strict=False):
        host, _, port = value.rpartition(":")
        if flag == "--gateway" and host == "127.0.0.1" and port.isdigit():
            ports.append(int(port))
    return sorted(set(ports))


class NodeTable:
    """The node's DNAT rules for pods' traffic to its loopback services: one nft table of this
    kubelet's, made at its first pod, removed when it stops."""

    def __init__(self) -> None:
        self.name = f"krt-test-node-{os.getpid()}-{next(_TABLES)}"
        self._made = False

    async def allow(self, veth: str, node_ip: str, ports: list[int]) -> None:
        if not ports:
            return
        if not self._made:
            await _run(
                "nft",
                "-f",
                "-",
                stdin=(
                    f"table ip {self.name} {{\n"
                    "  chain pre { type nat hook prerouting priority -100; }\n"
                    "}\n"
                ).encode(),
            )
            self._made = True
        Path(f"/proc/sys/net/ipv4/conf/{veth}/route_localnet").write_text("1")
        listed = ", ".join(str(p) for p in ports)
        rule = f'iifname "{veth}" ip daddr {node_ip} tcp dport {{ {listed} }} dnat to 127.0.0.1'
        await _run("nft", f"add rule ip {self.name} pre {rule}")

    async def remove(self) -> None:
        if self._made:
            await _run("nft", "delete", "table", "ip", self.name)
            self._made = False


@dataclass
class PodNetwork:
    slot: int
    lock: socket.socket | None  # the slot's name, held bound
    sandbox: asyncio.subprocess.Process
    users: bool  # a user namespace of the pod's own

    @property
    def node_ip(self) -> str:
        return str(SUBNET.network_address + 4 * self.slot + 1)

    @property
    def pod_ip(self) -> str:
        return str(SUBNET.network_address + 4 * self.slot + 2)

    @property
    def veth(self) -> str:
        return f"krtv{self.slot}"

    @property
    def uid_base(self) -> int:
        return USERNS_BASE + self.slot * USERNS_SIZE

    @property
    def pid(self) -> int:
        return self.sandbox.pid

    async def stop(self) -> None:
        """Kill the sandbox (its namespaces and veth go with it) and give the slot back."""
        if self.sandbox.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.sandbox.send_signal(signal.SIGKILL)
            await self.sandbox.wait()
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def _take_slot() -> tuple[int, socket.socket]:
    start = random.randrange(SLOTS)
    for i in range(SLOTS):
        slot = (start + i) % SLOTS
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(SLOT_NAME.format(slot))
        except OSError:  # another pod's, of this node or another
            sock.close()
            continue
        return slot, sock
    raise PodNetworkError("every pod network slot is taken")


async def _line(sandbox: asyncio.subprocess.Process, expected: bytes) -> None:
    assert sandbox.stdout is not None
    line = await asyncio.wait_for(sandbox.stdout.readline(), SANDBOX_START_S)
    if line.strip() != expected:
        rest = await asyncio.wait_for(sandbox.stdout.read(), SANDBOX_START_S)
        raise PodNetworkError(f"pod sandbox: {(line + rest).decode(errors='replace').strip()}")


async def start(ports: list[int], table: NodeTable, *, users: bool) -> PodNetwork:
    """The pod's sandbox, addressed (and with `users` its user namespace mapped); ``ports``: the
    node's loopback ports it may dial (``gateway_ports``)."""
    slot, lock = _take_slot()
    sandbox = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        str(CONTAINER_RUNTIME),
        "--pod-sandbox",
        *(["--users"] if users else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    network = PodNetwork(slot, lock, sandbox, users)
    try:
        if users:
            await _line(sandbox, b"user")
            ids = f"0 {network.uid_base} {USERNS_SIZE}\n"
            Path(f"/proc/{sandbox.pid}/uid_map").write_text(ids)
            Path(f"/proc/{sandbox.pid}/gid_map").write_text(ids)
            assert sandbox.stdin is not None
            sandbox.stdin.write(b"go\n")
            await sandbox.stdin.drain()
        await _line(sandbox, b"net")
        veth, pid = network.veth, str(sandbox.pid)
        inside = ("nsenter", "--target", pid, "--net")
        node_side = (
            f"link add {veth} type veth peer name eth0 netns {pid}\n"
            f"address add {network.node_ip}/30 dev {veth}\n"
            f"link set {veth} up\n"
        )
        await _run("ip", "-batch", "-", stdin=node_side.encode())
        pod_side = (
            f"address add {network.pod_ip}/30 dev eth0\n"
            "link set eth0 up\n"
            f"route add default via {network.node_ip}\n"
        )
        await _run(*inside, "ip", "-batch", "-", stdin=pod_side.encode())
        if ports:
            listed = ", ".join(str(p) for p in ports)
            rules = (
                "table ip krt-test-pod {\n"
                "  chain out { type nat hook output priority -100;\n"
                f"    ip daddr 127.0.0.1 tcp dport {{ {listed} }} dnat to {network.node_ip}\n"
                "  }\n"
                "  chain post { type nat hook postrouting priority 100;\n"
                '    oifname "eth0" ip saddr 127.0.0.0/8 masquerade\n'
                "  }\n"
                "}\n"
            )
            await _run(*inside, "nft", "-f", "-", stdin=rules.encode())
            await table.allow(veth, network.node_ip, ports)
    except BaseException:
        await network.stop()
        raise
    return network
