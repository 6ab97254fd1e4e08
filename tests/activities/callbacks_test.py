"""deliver_callback against a real HTTPS receiver on 127.0.0.1 (a throwaway CA's certificate, real
TLS): the status POSTed and signed (checked by kruntimes.sdk.callbacks.verify), a receiver that
fails, hangs or redirects, and what is refused before anything is sent (http, internal addresses,
a creator not allowed the Secret). Names other than 127.0.0.1 resolve through the activity's
resolver seam; an audit hook records every connect of the process during a delivery and blocks
any that is not to loopback, so a refusal is proven to have sent nothing, anywhere."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import secrets
import ssl
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.callbacks import (
    MAX_RESPONSE_BYTES,
    AllowedHost,
    CallbackActivities,
    CallbackPolicy,
    is_own_address,
    trust,
)
from kruntimes.config import secret_store
from kruntimes.contracts.invocation import (
    ACTIVITY_CALLBACK,
    CallbackOutcome,
    CallbackRequest,
    InvocationState,
    InvocationStatus,
    Target,
    TargetKind,
)
from kruntimes.sdk.callbacks import SIGNATURE_HEADER, verify

NAMESPACE = "team-a"
SECRET = "hook-key"
CREATOR = "cli:alice"
BINDINGS = (
    f"bindings:\n- namespace: {NAMESPACE}\n  verbs: [use-secrets]\n  users: [alice]\n  secrets: [{SECRET}]\n"
)
RECEIVER_NAME = "receiver.test"  # in the receiver's certificate; resolved by the tests' resolver


# --- a throwaway CA and the receiver's certificate -----------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: ssl.SSLContext


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("callback-ca")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("callbacks test CA"))
        .issuer_name(_name("callbacks test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(RECEIVER_NAME))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(RECEIVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    (root / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (root / "tls.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (root / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(root / "tls.crt", root / "tls.key")
    return Certs(ca=root / "ca.pem", server=server)


# --- the receiver: TLS on a plain TCP accept, so a connection counts before its handshake --------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = 0
    mode: str = "ok"  # ok | fail | hang | redirect
    location: str = ""
    connections: int = 0
    requests: list[Received] = field(default_factory=list)

    def url(self, path: str = "/hook?token=t0p") -> str:
        return f"https://127.0.0.1:{self.port}{path}"


FAILURE_BODY = b"boom " * 40_000  # 200 kB: far past what the worker reads


async def _serve(receiver: Receiver, tls: ssl.SSLContext, reader: asyncio.StreamReader, writer: Any) -> None:
    receiver.connections += 1
    try:
        await writer.start_tls(tls)
        head = await reader.readuntil(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        receiver.requests.append(Received(line.split(" ")[1], headers, body))
        if receiver.mode == "hang":
            await reader.read()  # until the worker gives up and closes
            return
        answer = {
            "ok": b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
            "fail": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(FAILURE_BODY)
            + FAILURE_BODY,
            "redirect": b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            % receiver.location.encode(),
        }[receiver.mode]
        writer.write(answer)
        await writer.drain()
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass  # the worker hung up (it reads at most MAX_RESPONSE_BYTES) or refused the handshake
    finally:
        writer.close()


@pytest.fixture
async def receivers(certs: Certs) -> AsyncIterator[list[Receiver]]:
    """Two receivers on 127.0.0.1 (the second the target of a redirect)."""
    made: list[Receiver] = []
    servers: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()
    for _ in range(2):
        receiver = Receiver()

        async def handle(r: asyncio.StreamReader, w: Any, receiver: Receiver = receiver) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await _serve(receiver, certs.server, r, w)
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        receiver.port = server.sockets[0].getsockname()[1]
        made.append(receiver)
        servers.append(server)
    try:
        yield made
    finally:
        for server in servers:
            server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        for server in servers:
            await server.wait_closed()


@pytest.fixture
async def receiver(receivers: list[Receiver]) -> Receiver:
    return receivers[0]


# --- every connect of the process, watched and kept to loopback ----------------------------------

_CONNECTS: list[list[str]] = []  # the watch in force (at most one), its destinations


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or not _CONNECTS:
        return
    address = args[1]
    host = str(address[0]) if isinstance(address, tuple) else str(address)
    _CONNECTS[-1].append(host)
    if isinstance(address, tuple) and not ipaddress.ip_address(host.partition("%")[0]).is_loopback:
        raise PermissionError(f"the test allows no traffic off loopback ({host})")


_HOOKED: list[bool] = []


@pytest.fixture
def connects() -> Iterator[list[str]]:
    """The addresses this process connects to while the test runs (any not loopback is refused)."""
    if not _HOOKED:
        sys.addaudithook(_audit)  # an audit hook stays for the process: it acts only while watched
        _HOOKED.append(True)
    seen: list[str] = []
    _CONNECTS.append(seen)
    try:
        yield seen
    finally:
        _CONNECTS.remove(seen)


# --- the worker's side: its state directory, its secret, the request -----------------------------

KEY = "k3y-" + secrets.token_hex(16)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    secret_store.create(tmp_path, namespace=NAMESPACE, name=SECRET, values={"key": KEY.encode()})
    bindings = tmp_path / "rolebindings.yaml"
    bindings.write_text(BINDINGS)
    bindings.chmod(0o644)
    return tmp_path


def _request(url: str, *, creator: str = CREATOR, secret: str | None = SECRET) -> CallbackRequest:
    status = InvocationStatus(
        invocationId="inv-" + uuid.uuid4().hex[:8],
        target=Target(kind=TargetKind.Run, namespace=NAMESPACE, name="fn", uid=str(uuid.uuid4())),
        state=InvocationState.Succeeded,
        acceptedAt=dt.datetime.now(dt.UTC),
        attemptCount=1,
        result='{"status": "Succeeded", "outputs": {"n": 1}}',
    )
    return CallbackRequest(
        url=url, namespace=NAMESPACE, secretName=secret, creator=creator, status=status, attempt=1
    )


def _resolving(answers: dict[str, list[Sequence[str]]], asked: list[str]) -> Any:
    """A resolver for names the test controls: each name's answers in turn (the last repeats)."""

    async def resolve(host: str, port: int) -> Sequence[str]:
        asked.append(host)
        queue = answers[host]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return resolve


def _activities(
    state: Path, certs: Certs, *allow: str, timeout_s: float = 10.0, **seams: Any
) -> CallbackActivities:
    policy = CallbackPolicy(
        allow=tuple(AllowedHost.parse(a) for a in allow), ca_file=certs.ca, timeout_s=timeout_s
    )
    made = CallbackActivities.in_state_dir(policy, state)
    for name, value in seams.items():
        setattr(made, name, value)
    return made


async def _deliver(activities: CallbackActivities, request: CallbackRequest) -> CallbackOutcome:
    outcome = await ActivityEnvironment().run(activities.deliver_callback, request)
    assert isinstance(outcome, CallbackOutcome)
    return outcome


# --- delivered -----------------------------------------------------------------------------------


async def test_the_status_is_posted_as_json_signed_with_the_secret_and_the_receiver_verifies_it(
    receiver: Receiver, state: Path, certs: Certs, connects: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    request = _request(receiver.url())
    outcome = await _deliver(_activities(state, certs, f"127.0.0.1:{receiver.port}"), request)

    assert outcome == CallbackOutcome(delivered=True, httpStatus=204)
    assert connects == ["127.0.0.1"]
    [got] = receiver.requests
    assert got.path == "/hook?token=t0p"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-kruntime-invocation-id"] == request.status.invocationId
    assert InvocationStatus.model_validate(json.loads(got.body)) == request.status
    signature = got.headers[SIGNATURE_HEADER.lower()]
    assert verify(signature, got.body, KEY.encode())
    assert not verify(signature, got.body, b"another key")
    assert not verify(signature, got.body + b" ", KEY.encode())
    audits = [r for r in caplog.records if r.name == "kruntimes.audit.secrets"]
    assert [(a.decision, a.use, a.secret, a.creator, a.run_uid) for a in audits] == [  # type: ignore[attr-defined]
        ("allowed", "callback", SECRET, CREATOR, request.status.target.uid)
    ]
    assert not any("t0p" in r.getMessage() or "t0p" in str(r.__dict__) for r in caplog.records)


async def test_an_unsigned_callback_carries_no_signature(
    receiver: Receiver, state: Path, certs: Certs
) -> None:
    outcome = await _deliver(
        _activities(state, certs, f"127.0.0.1:{receiver.port}"), _request(receiver.url(), secret=None)
    )
    assert outcome.delivered
    assert SIGNATURE_HEADER.lower() not in receiver.requests[0].headers


async def test_the_connection_goes_to_the_address_checked_when_the_name_resolves_elsewhere_later(
    receiver: Receiver, state: Path, certs: Certs, connects: list[str]
) -> None:
    """DNS rebinding: the name answers loopback (allowed) once, then cloud metadata."""
    asked: list[str] = []
    resolver = _resolving({RECEIVER_NAME: [["127.0.0.1"], ["169.254.169.254"]]}, asked)
    activities = _activities(state, certs, RECEIVER_NAME, resolver=resolver)

    outcome = await _deliver(activities, _request(f"https://{RECEIVER_NAME}:{receiver.port}/hook"))

    assert outcome.delivered, outcome
    assert asked == [RECEIVER_NAME]  # resolved once, by the check
    assert connects == ["127.0.0.1"]
    assert len(receiver.requests) == 1


# --- not delivered -------------------------------------------------------------------------------


async def test_a_receiver_that_fails_is_a_failure_with_its_status_and_a_bounded_excerpt(
    receiver: Receiver, state: Path, certs: Certs
) -> None:
    receiver.mode = "fail"
    outcome = await _deliver(
        _activities(state, certs, f"127.0.0.1:{receiver.port}"), _request(receiver.url())
    )
    assert not outcome.delivered
    assert outcome.httpStatus == 500
    assert outcome.message.startswith(f"127.0.0.1:{receiver.port} answered 500: boom boom")
    assert len(outcome.message) < 200 < MAX_RESPONSE_BYTES
    assert "t0p" not in outcome.message  # the URL's query (a token, often) is never repeated


async def test_a_receiver_that_hangs_past_the_timeout_is_a_failure_that_says_so(
    receiver: Receiver, state: Path, certs: Certs
) -> None:
    receiver.mode = "hang"
    activities = _activities(state, certs, f"127.0.0.1:{receiver.port}", timeout_s=1.0)
    outcome = await _deliver(activities, _request(receiver.url()))
    assert outcome == CallbackOutcome(
        delivered=False, message=f"127.0.0.1:{receiver.port} did not answer within 1 s"
    )
    assert len(receiver.requests) == 1  # it was sent, and never answered


async def test_a_redirect_is_not_followed_and_its_target_sees_nothing(
    receivers: list[Receiver], state: Path, certs: Certs, connects: list[str]
) -> None:
    first, other = receivers
    first.mode = "redirect"
    first.location = f"https://{RECEIVER_NAME}:{other.port}/elsewhere"
    activities = _activities(state, certs, "127.0.0.1", RECEIVER_NAME)
    outcome = await _deliver(activities, _request(first.url()))
    assert not outcome.delivered
    assert outcome.httpStatus == 302
    assert "redirect" in outcome.message
    assert other.connections == 0
    assert connects == ["127.0.0.1"]


async def test_a_proxy_named_by_the_environment_is_not_used(
    receivers: list[Receiver], state: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy would connect for the worker to what the worker's checks refused."""
    receiver, proxy = receivers
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    outcome = await _deliver(_activities(state, certs, "127.0.0.1"), _request(receiver.url()))
    assert outcome.delivered, outcome
    assert proxy.connections == 0


async def test_a_receiver_whose_certificate_is_not_trusted_is_a_failure(
    receiver: Receiver, state: Path, tmp_path: Path
) -> None:
    policy = CallbackPolicy(allow=(AllowedHost("127.0.0.1"),))  # the system's CAs only
    outcome = await _deliver(CallbackActivities.in_state_dir(policy, state), _request(receiver.url()))
    assert not outcome.delivered
    assert "certificate is not trusted" in outcome.message
    assert receiver.requests == []


# --- refused before anything is sent -------------------------------------------------------------


async def test_a_loopback_url_without_callback_allow_is_refused_and_the_receiver_sees_no_connection(
    receiver: Receiver, state: Path, certs: Certs, connects: list[str]
) -> None:
    for allow in ((), (f"127.0.0.1:{receiver.port + 1}",), ("localhost",)):
        outcome = await _deliver(_activities(state, certs, *allow), _request(receiver.url()))
        assert not outcome.delivered
        assert "127.0.0.1, a loopback address" in outcome.message
        assert "--callback-allow" in outcome.message
    assert receiver.connections == 0
    assert connects == []


async def test_an_http_url_is_refused_and_nothing_connects(
    receiver: Receiver, state: Path, certs: Certs, connects: list[str]
) -> None:
    url = f"http://127.0.0.1:{receiver.port}/hook"
    outcome = await _deliver(_activities(state, certs, "127.0.0.1"), _request(url))
    assert not outcome.delivered
    assert "https only" in outcome.message
    assert receiver.connections == 0
    assert connects == []


@pytest.mark.parametrize(
    ("addresses", "what"),
    [
        (["169.254.169.254"], "169.254.169.254, a link-local address"),
        (["fd00:ec2::254"], "fd00:ec2::254, a private address"),
        (["10.1.2.3"], "10.1.2.3, a private address"),
        (["192.168.1.1"], "192.168.1.1, a private address"),
        (["100.64.0.1"], "100.64.0.1, not a global address"),
        (["0.0.0.0"], "0.0.0.0, the unspecified address"),
        (["::1"], "::1, a loopback address"),
        (["::ffff:169.254.169.254"], "::ffff:a9fe:a9fe, a link-local address (169.254.169.254 inside it)"),
        (["224.0.0.1"], "224.0.0.1, a multicast address"),
        (["8.8.8.8", "169.254.169.254"], "169.254.169.254, a link-local address"),
    ],
)
async def test_a_name_that_resolves_to_an_internal_address_is_refused_without_sending_anything(
    addresses: list[str], what: str, receiver: Receiver, state: Path, certs: Certs, connects: list[str]
) -> None:
    asked: list[str] = []
    activities = _activities(state, certs, resolver=_resolving({"metadata.test": [addresses]}, asked))
    outcome = await _deliver(activities, _request("https://metadata.test/latest/meta-data/"))
    assert not outcome.delivered
    assert f"refused: metadata.test resolves to {what}" in outcome.message
    assert asked == ["metadata.test"]
    assert connects == []


async def test_an_address_of_the_machine_is_refused(state: Path, certs: Certs, connects: list[str]) -> None:
    asked: list[str] = []
    resolver = _resolving({"me.test": [["8.8.8.8"]]}, asked)
    activities = _activities(state, certs, resolver=resolver, own=lambda a: str(a) == "8.8.8.8")
    outcome = await _deliver(activities, _request("https://me.test/hook"))
    assert "8.8.8.8, an address of this machine" in outcome.message
    assert connects == []


def test_the_machine_probe_knows_its_own_addresses_without_sending_anything() -> None:
    assert is_own_address(ipaddress.ip_address("127.0.0.1"))
    assert not is_own_address(ipaddress.ip_address("192.0.2.77"))  # TEST-NET-1: nobody's


@pytest.mark.parametrize(
    ("creator", "why"),
    [
        ("cli:mallory", "the Run's creator cli:mallory is not bound to use secret 'hook-key'"),
        ("", "the Run has no creator"),
    ],
)
async def test_a_creator_not_allowed_the_secret_is_refused_and_the_key_goes_nowhere(
    creator: str,
    why: str,
    receiver: Receiver,
    state: Path,
    certs: Certs,
    connects: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    activities = _activities(state, certs, f"127.0.0.1:{receiver.port}")
    outcome = await _deliver(activities, _request(receiver.url(), creator=creator))
    assert not outcome.delivered
    assert outcome.message.startswith("SecretForbidden: ")
    assert why in outcome.message
    assert KEY not in outcome.model_dump_json()
    assert not any(KEY in r.getMessage() or KEY in str(r.__dict__) for r in caplog.records)
    [audit] = [r for r in caplog.records if r.name == "kruntimes.audit.secrets"]
    assert (audit.decision, audit.use) == ("refused", "callback")  # type: ignore[attr-defined]
    assert receiver.connections == 0
    assert connects == []


async def test_a_missing_secret_or_one_without_a_signing_key_is_refused(
    state: Path, certs: Certs, connects: list[str]
) -> None:
    activities = _activities(state, certs, "127.0.0.1")
    (state / "rolebindings.yaml").write_text(
        BINDINGS.replace(f"secrets: [{SECRET}]", "secrets: [other, two]")
    )
    outcome = await _deliver(activities, _request("https://127.0.0.1:9/x", secret="other"))
    assert outcome.message.startswith("SecretNotFound: no secret 'other'")
    secret_store.create(state, namespace=NAMESPACE, name="two", values={"A": b"1", "B": b"2"})
    outcome = await _deliver(activities, _request("https://127.0.0.1:9/x", secret="two"))
    assert "has 2 keys and none named 'key'" in outcome.message
    assert connects == []


# --- the worker's flags --------------------------------------------------------------------------


def test_callback_allow_takes_a_host_and_an_optional_port() -> None:
    assert AllowedHost.parse("hooks.internal") == AllowedHost("hooks.internal")
    assert AllowedHost.parse("127.0.0.1:8443") == AllowedHost("127.0.0.1", 8443)
    assert AllowedHost.parse("[::1]:8443").admits("::1", 8443)
    assert AllowedHost.parse("Hooks.Internal").admits("hooks.internal.", 443)
    assert not AllowedHost.parse("hooks.internal:8443").admits("hooks.internal", 443)
    for bad in ("", "hooks.internal/x", "user@hooks", "hooks:0", "hooks:port"):
        with pytest.raises(ValueError, match="--callback-allow"):
            AllowedHost.parse(bad)


def test_a_callback_ca_that_cannot_be_loaded_is_refused_naming_the_flag(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match="--callback-ca"):
        trust(bad)


def test_the_activity_is_registered_under_the_contracts_name(state: Path) -> None:
    from temporalio.activity import _Definition

    defined = _Definition.from_callable(
        CallbackActivities.in_state_dir(CallbackPolicy(), state).deliver_callback
    )
    assert defined is not None and defined.name == ACTIVITY_CALLBACK


def test_krt_worker_takes_its_callback_flags_into_its_settings_and_refuses_bad_ones(
    tmp_path: Path, certs: Certs
) -> None:
    from kruntimes.workers.worker import parse_args, settings_from

    base = ["--state-dir", str(tmp_path), "--peer-tls", "/pki/cp", "--assignment-key", "/pki/a.key"]
    flags = ["--callback-allow", "hooks.internal", "--callback-allow", "10.0.0.5:8443"]
    settings = settings_from(parse_args([*base, *flags, "--callback-ca", str(certs.ca)]))
    assert settings.callbacks == CallbackPolicy(
        allow=(AllowedHost("hooks.internal"), AllowedHost("10.0.0.5", 8443)), ca_file=certs.ca
    )
    assert settings_from(parse_args(base)).callbacks == CallbackPolicy()
    with pytest.raises(SystemExit, match="--callback-allow 'hooks/x'"):
        settings_from(parse_args([*base, "--callback-allow", "hooks/x"]))
    with pytest.raises(SystemExit, match="--callback-ca"):
        settings_from(parse_args([*base, "--callback-ca", str(tmp_path / "missing.pem")]))
