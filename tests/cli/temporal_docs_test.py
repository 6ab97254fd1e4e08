"""The embedded platform's control plane as the docs give it, and as another local user meets it,
against one real `krt up` platform (this module's own):

- every `temporal` command of docs/operations.md ("Operating with the `temporal` CLI and UI",
  "Reading encrypted payloads") and the README's runs as written through bash, with the lines the
  docs set up before them (`export TEMPORAL_CONFIG_FILE=...`) and `krt`, `python` and `temporal`
  on PATH, exits 0 and shows what the docs say (one of them drains a host);
- `krt ui`'s link gives one session: the UI itself, its settings naming the front's codec
  endpoint, and payloads of history decoded for that session; the same link a second time, nothing;
- another local user (a uid the test switches to) reaches none of it: not the dev server's ports
  (they are in another network namespace: the owner reaches them there), not its sockets nor the
  state directory's keys, no TLS handshake with the front without the owner's certificate, and no
  UI, codec or login without the session, the token or a ticket.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import run_workflow_id
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.pki import builder
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client, RunFailed, RunNotFound
from kruntimes.temporal.devserver import temporal_binary
from tests.sdk.stack import manifest
from tests.support.embedded import Embedded, embedded_platform
from tests.support.isolation import require_or_skip
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
README = ROOT / "README.md"
SECTION = "## Operating with the `temporal` CLI and UI"
DECODING = "## Reading encrypted payloads"
SUMMARY = re.compile(r"HandlerLoadFailed \(HandlerImportError\) on python-\d+ at attempt 1")
SETUP = ("export ", "S=")  # the lines of a block that set up the commands after them
OTHER_USER = 65534  # the uid another local user's probe runs as


@dataclass(frozen=True)
class Ran:
    command: str
    code: int
    out: str
    err: str


def _block(text: str, after: str) -> str:
    """The first ```sh block after the line `after`."""
    rest = text[text.index(after) :]
    opened = rest.index("```sh\n") + len("```sh\n")
    return rest[opened : rest.index("```", opened)]


def _lines(block: str) -> list[str]:
    """The block's lines: comments and blank lines dropped, continued lines joined, a trailing
    comment kept (bash ignores it)."""
    joined = block.replace("\\\n", " ")
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def setup_and_commands(block: str) -> tuple[str, list[str]]:
    lines = _lines(block)
    return "\n".join(ln for ln in lines if ln.startswith(SETUP)), [
        ln for ln in lines if not ln.startswith(SETUP)
    ]


def section() -> tuple[str, list[str]]:
    return setup_and_commands(_block(OPERATIONS.read_text(), SECTION))


def decoding() -> tuple[str, list[str]]:
    text = OPERATIONS.read_text()
    return setup_and_commands(_block(text[text.index(DECODING) :], "so give it the front's CA:"))


def readme() -> tuple[str, list[str]]:
    setup, commands = setup_and_commands(_block(README.read_text(), "A Run is an object"))
    return setup, [c for c in commands if c.startswith("temporal ")]


@pytest.fixture(scope="module")
def platform() -> Iterator[Embedded]:
    # not under pytest's own temporary directory (0700): another user must be able to come as far
    # as the state directory, for its own mode to be what stops them
    root = Path(tempfile.mkdtemp(prefix="krt-docs-"))
    root.chmod(0o755)
    try:
        with embedded_platform(root / "state") as started:
            yield started
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _config(platform: Embedded) -> clientconfig.ClientConfig:
    return clientconfig.load({"KRT_STATE_DIR": str(platform.state)})


async def bash(platform: Embedded, setup: str, command: str) -> Ran:
    path = os.pathsep.join(
        [str(Path(sys.executable).parent), str(Path(temporal_binary()).parent), os.environ.get("PATH", "")]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRT_", "TEMPORAL_", "SSL_CERT_"))}
    env |= {"KRT_STATE_DIR": str(platform.state), "PATH": path}
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"{setup}\n{command}",
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return Ran(command, proc.returncode, out.decode(), err.decode())


def test_the_docs_give_the_commands_this_test_runs() -> None:
    setup, commands = section()
    assert setup.startswith("export TEMPORAL_CONFIG_FILE=")
    assert sum(c.startswith("temporal ") for c in commands) >= 12
    assert any("--name delete_now" in c for c in commands)
    assert not any("--address" in c for c in commands), "the config file names the address"
    setup, commands = decoding()
    assert "TEMPORAL_CONFIG_FILE" in setup and len(commands) == 1 and "--profile decode" in commands[0]
    setup, commands = readme()
    assert "TEMPORAL_CONFIG_FILE" in setup and commands, "the README has one"


@pytest.mark.timeout(300)
async def test_every_temporal_command_of_the_operations_page_works_as_written(platform: Embedded) -> None:
    setup, commands = section()
    async with Client(_config(platform)) as client:
        await _runs(client)
        scale_out = await _a_scale_out(client)
        ready = {"hello"}  # the Ready Runs the lists show (until the commands end them)
        for command in commands:
            command = command.replace("scaleout/python/REQUEST", scale_out)
            ran = await bash(platform, setup, command)
            assert ran.code == 0, ran
            await _shows_what_the_docs_say(client, ran, ready)


async def test_the_readme_temporal_command_works_as_written(platform: Embedded) -> None:
    async with Client(_config(platform)) as client:
        await client.create(Run.from_dict(manifest("readme")))
        await client.wait("readme")
    setup, commands = readme()
    for command in commands:
        ran = await bash(platform, setup, command)
        assert ran.code == 0, ran
        assert "run/default/readme" in ran.out, ran


async def test_the_decode_command_shows_a_runs_env_and_the_plain_one_does_not(platform: Embedded) -> None:
    secret = f"docs-env-{uuid.uuid4().hex}"
    async with Client(_config(platform)) as client:
        await client.create(Run.from_dict(manifest("decoded", env={"DOCS_VALUE": secret})))
        await client.wait("decoded")
    setup, (command,) = decoding()
    command = command.replace("run/default/hello", "run/default/decoded")
    ran = await bash(platform, setup, command)
    assert ran.code == 0 and secret in ran.out, ran
    plain = await bash(platform, setup, command.replace(" --profile decode", ""))
    assert plain.code == 0 and secret not in plain.out, plain


def test_krt_ui_without_an_embedded_platform_says_to_start_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")} | {"KRT_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.krt", "ui"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4 and done.stdout == ""
    assert done.stderr.startswith("krt: ") and "has no UI login" in done.stderr and "krt up" in done.stderr


async def test_krt_ui_gives_one_session_with_the_ui_and_payloads_decoded_for_it(platform: Embedded) -> None:
    config = _config(platform)
    assert config.uiUrl and config.temporalTlsCa
    secret = f"ui-env-{uuid.uuid4().hex}"
    async with Client(config) as client:
        await client.create(Run.from_dict(manifest("seen", env={"UI_VALUE": secret})))
        await client.wait("seen")
        temporal = await client.temporal()
        history = await temporal.get_workflow_handle(run_workflow_id("default", "seen")).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes.input
    encrypted = json_format.MessageToJson(started)
    assert secret not in encrypted
    link = platform.ok("ui").stdout.strip()
    assert link.startswith(f"{config.uiUrl}/login?ticket=")
    trust = ssl.create_default_context(cafile=config.temporalTlsCa)
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of an IP address
    async with aiohttp.ClientSession(cookie_jar=jar, connector=aiohttp.TCPConnector(ssl=trust)) as http:
        async with http.get(link, allow_redirects=False) as login:
            assert login.status == 303 and login.headers["Location"] == "/"
            assert login.headers["Referrer-Policy"] == "no-referrer"
            cookie = login.headers["Set-Cookie"]
            assert all(flag in cookie for flag in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/")), cookie
        async with http.get(config.uiUrl + "/") as page:
            assert page.status == 200 and "<!doctype html>" in (await page.text()).lower()
        async with http.get(config.uiUrl + "/api/v1/settings") as settings:
            assert (await settings.json())["Codec"]["Endpoint"] == config.uiUrl + "/codec"
        async with http.post(  # as the UI sends it: same origin, the session's cookie, no token
            config.uiUrl + "/codec/decode?preserveStorageRefs=true",
            data=encrypted,
            headers={"Content-Type": "application/json", "X-Namespace": "default"},
        ) as decoded:
            assert decoded.status == 200
            payloads = json_format.Parse(await decoded.text(), Payloads())
        assert any(secret.encode() in p.data for p in payloads.payloads), "the Run's env, decoded"
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as fresh,
        fresh.get(link, allow_redirects=False) as again,
    ):
        assert again.status == 401, "a link works once"


# -- another local user ------------------------------------------------------------------------

# Runs as root until everything it needs is imported, then as OTHER_USER: a user of the machine
# with no file of the platform's. Prints what each attempt came to: "ok ..." or the error's class.
PROBE = r"""
import email.parser, encodings.idna, http.client, json, os, socket, ssl, sys  # before setuid
args = json.loads(sys.argv[1])
os.setgroups([]); os.setgid(args["uid"]); os.setuid(args["uid"])

def attempt(what):
    try:
        return "ok " + repr(what())[:500]
    except Exception as e:
        return type(e).__name__

def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=5).close()

def read(path):
    with open(path, "rb") as f:
        return len(f.read(1))

def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)

def tls(cert=None, key=None, version=ssl.TLSVersion.TLSv1_3):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.maximum_version = version
    context.set_alpn_protocols(["h2"])
    if cert:
        context.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", args["front"]), timeout=10) as raw:
        with context.wrap_socket(raw) as conn:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            return conn.recv(64)  # TLS 1.3 says the refusal at the first read

def https(method, path, headers=None, body=None):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", args["ui"], context=context, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    answer = conn.getresponse()
    return answer.status, answer.read(400).decode(errors="replace")

said = {"uid": os.getuid()}
for name, port in args["inner"].items():
    said["dev server " + name] = attempt(lambda: connect(port))
for path in args["files"]:
    said["read " + path] = attempt(lambda: read(path))
for path in args["sockets"]:
    said["socket " + path] = attempt(lambda: unix(path))
said["tls without a certificate"] = attempt(tls)
said["tls 1.2 without a certificate"] = attempt(lambda: tls(version=ssl.TLSVersion.TLSv1_2))
said["tls with another CA's certificate"] = attempt(lambda: tls(args["rogue_cert"], args["rogue_key"]))
said["ui"] = attempt(lambda: https("GET", "/"))
said["ui api"] = attempt(lambda: https("GET", "/api/v1/namespaces"))
said["codec"] = attempt(lambda: https("POST", "/codec/decode", {"Content-Type": "application/json"}, b'{"payloads": []}'))
said["codec, a made-up session"] = attempt(
    lambda: https("POST", "/codec/decode", {"Cookie": "krt_ui_session=made-up"}, b'{"payloads": []}')
)
said["login, a made-up ticket"] = attempt(lambda: https("GET", "/login?ticket=a.9999999999.b"))
print(json.dumps(said))
"""


def _rogue_pair(directory: Path) -> tuple[Path, Path]:
    """A client certificate of a CA the front does not know, readable by anyone."""
    import datetime as dt

    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = dt.datetime.now(dt.UTC)
    ca, ca_key = builder.build_ca(builder.name("rogue"), not_before=now, not_after=now + dt.timedelta(days=1))
    cert, key = builder.build_leaf(
        builder.name("rogue client"),
        ca_cert=ca,
        ca_key=ca_key,
        sans=[x509.DNSName("owner.kruntimes.local")],
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        not_before=now,
        not_after=now + dt.timedelta(days=1),
    )
    pair = (directory / "rogue.crt", directory / "rogue.key")
    pair[0].write_bytes(builder.cert_pem(cert))
    pair[1].write_bytes(builder.key_pem(key))
    for path in pair:
        path.chmod(0o644)
    return pair


REFUSED = ("SSLError", "SSLEOFError", "SSLZeroReturnError", "ConnectionResetError")


def _h2_answer(port: int, *, cert: Path, key: Path) -> bytes:
    """The first bytes the front answers the HTTP/2 preface with, over mutual TLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    context.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        return conn.recv(64)


def _probe(args: dict[str, Any]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said: dict[str, str] = json.loads(done.stdout)
    return said


def _inside(pid: int, port: int) -> bool:
    """Whether something answers on 127.0.0.1:`port` in the network namespace of `pid`."""
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable, "-c"]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
    return subprocess.run([*argv, code], capture_output=True, timeout=60, check=False).returncode == 0


def test_another_local_user_reaches_no_control_plane_endpoint(platform: Embedded) -> None:
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        require_or_skip("switching to another user needs root (and nsenter, to look into the namespace)")
    state = platform.state
    hidden = json.loads((state / "temporal.ready.json").read_text())
    if hidden["mode"] == "exposed":
        require_or_skip(f"the dev server cannot be hidden here: {hidden['why']}")
    said_at_start = json.loads((state / "up.ready").read_text())["controlPlane"]
    assert said_at_start.startswith("owner only: the dev server in a"), said_at_start
    ports = json.loads((state / "platform.json").read_text())
    inner: dict[str, int] = hidden["ports"]
    assert all(_inside(hidden["pid"], port) for port in inner.values()), "the owner reaches them there"
    private = [
        state / "client.json",
        state / "temporal.toml",
        state / "tokens.csv",
        state / "front" / "client.key",
        state / "front" / "tls.key",
        state / "front" / "ui-login.key",
    ]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for directory in (state, state / "front", state / "sockets"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    sockets = [state / "sockets" / name for name in ("frontend.sock", "ui.sock", "metrics.sock")]
    for path in sockets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    rogue_cert, rogue_key = _rogue_pair(state.parent)
    said = _probe(
        {
            "uid": OTHER_USER,
            "inner": inner,
            "front": ports["temporal"],
            "ui": ports["temporalUi"],
            "files": [str(p) for p in private],
            "sockets": [str(p) for p in sockets],
            "rogue_cert": str(rogue_cert),
            "rogue_key": str(rogue_key),
        }
    )
    assert said.pop("uid") == OTHER_USER
    for name in inner:
        assert said.pop(f"dev server {name}") == "ConnectionRefusedError", name
    for path in [*private, *sockets]:
        assert said.pop(f"read {path}" if path in private else f"socket {path}") == "PermissionError", path
    # TLS 1.3 ends the handshake on the client's side before the server has checked its
    # certificate: the refusal comes at the first read, as an alert or the end of the connection
    for refused in ("tls without a certificate", "tls with another CA's certificate"):
        assert said.pop(refused) in (*REFUSED, "ok b''"), refused
    assert said.pop("tls 1.2 without a certificate") in REFUSED, "TLS 1.2: refused in the handshake"
    owner = _h2_answer(
        ports["temporal"], cert=state / "front" / "client.crt", key=state / "front" / "client.key"
    )
    assert owner.startswith(b"\x00"), "the owner gets the dev server's HTTP/2 settings"
    for name, answer in said.items():
        assert answer.startswith("ok (401, "), (name, answer)
    assert "krt ui" in said["ui"]


# -- what the commands of the operations page show ------------------------------------------------


async def _runs(client: Client) -> None:
    """hello and other Ready, broken Failed: the Runs the commands name (no tenant is configured
    here: the tenant's list is empty)."""
    await client.create(Run.from_dict(manifest("hello")))
    await client.create(Run.from_dict(manifest("other")))
    await client.create(Run.from_dict(manifest("broken", source="import nowhere_to_be_found\n")))
    await client.wait("hello")
    await client.wait("other")
    with pytest.raises(RunFailed):
        await client.wait("broken")


async def _a_scale_out(client: Client) -> str:
    """A scale-out's workflow id, for the command that names one from the list."""
    temporal = await client.temporal()
    async for execution in temporal.list_workflows("WorkflowType='ScaleOutWorkflow'"):
        return execution.id
    raise AssertionError("the platform's hosts were started by scale-outs")


async def _shows_what_the_docs_say(client: Client, ran: Ran, ready: set[str]) -> None:
    command, out = ran.command, ran.out
    if command.startswith("temporal workflow list") and "ScaleOut" not in command and "Failed" not in command:
        if "KrtTenant" not in command:
            assert all(f"run/default/{name}" in out for name in ready), ran
    elif "ExecutionStatus='Failed'" in command:
        assert "run/default/broken" in out, ran
    elif "GROUP BY ExecutionStatus" in command:
        assert "Running" in out and "Failed" in out, ran
    elif "describe" in command and "run/default/broken" in command:
        assert SUMMARY.search(out), ran
        assert "Encoded failure" not in out, ran
    elif "--name delete" in command and "update execute" in command:
        assert "deleted run/default/other: Cancelled" in out, ran
        await _gone(client, "other")
    elif "--name cancel" in command:
        await client.wait("hello", until=RunPhase.Cancelled)  # closed: the next command deletes it
        ready.discard("hello")
    elif "--name delete_now" in command:
        await _gone(client, "hello")
    elif command.startswith("krt hosts drain"):
        hosts = await client.hosts()
        assert not any(h.host.hostId == "python-0" and h.host.state == HostState.Ready for h in hosts), hosts


async def _gone(client: Client, name: str) -> None:
    async def gone() -> bool:
        try:
            await client.get(name)
        except RunNotFound:
            return True
        return False

    await eventually(gone, within=60.0, what=f"run {name} is deleted")
