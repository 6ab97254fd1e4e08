"""A per-request callback URL on an async invocation (issue #44; gateway/callback_origins.py,
docs/async-invocations.md), at the shared platform's real gateway over real HTTPS with real
clients (the SDK, `krt`, aiohttp): `X-Kruntime-Callback-URL` within the origins the gateway's
`--callback-origins` allows the target's namespace is delivered to a real HTTPS receiver on
loopback, signed with the target's Secret, in place of the target's own callback; it is part of the
request's identity (another URL under the same id is 409); its path and query are never in the
status, a log line, nor the workflow's history read raw. Refused before anything is recorded: http,
over 2,048 bytes, a user, on a sync invoke (400); an origin not allowed, or no file at all (403).
Attacks on the comparison (a wildcard against look-alike hosts, case and IDNA spellings, IP
literals against names) are checked on the parser and matcher themselves, and at the gateway where
a check needs no DNS; a malformed origins file refuses `krt gateway`'s start, naming the entry."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kruntimes.api.run import Run
from kruntimes.api.spec import MAX_CALLBACK_URL_CHARS
from kruntimes.contracts.invocation import invocation_workflow_id
from kruntimes.gateway.async_invoke import AsyncInvocations
from kruntimes.gateway.callback_origins import (
    MAX_HEADER_BYTES,
    CallbackOrigins,
    InvalidCallbackUrl,
    OriginsError,
    parse_callback_url,
)
from kruntimes.pki.local import TlsFiles
from kruntimes.sdk.callbacks import SIGNATURE_HEADER, verify
from kruntimes.sdk.client import Client, InvocationConflict, RunObject
from kruntimes.temporal.settings import TemporalSettings
from kruntimes.wire import headers
from kruntimes.workers import gateway as gateway_main
from kruntimes.workers.embedded.layout import DEFAULT_CALLBACK_ORIGINS, Layout
from kruntimes.workers.embedded.supervise import _gateway_argv
from tests.activities.callbacks_test import certs  # noqa: F401 - the receiver's CA, a fixture
from tests.chaos.async_faults_test import HOOK_SECRET, IDENTITY, Receiver, callbacks_allowed, receiver  # noqa: F401
from tests.cli.conftest import krt, one_error_line
from tests.gateway.async_accept_test import TERMINAL, call, recorded, urls
from tests.gateway.async_secrets_test import ECHO, http  # noqa: F401 - a fixture
from tests.gateway.conftest import LogCapture
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

ASYNC = {headers.PREFER: "respond-async"}
# The target's own callback: never reached when a request names its own (and if it were, a worker
# that allows only 127.0.0.1 refuses it before connecting or resolving anything).
SPEC_HOOK = "https://127.0.0.2:9/never"


@pytest.fixture
def origins(platform: Platform) -> Iterator[AsyncInvocations]:
    """The shared gateway's async handlers; their callback origins as they were afterwards."""
    found = platform.gateway.async_invocations
    assert found is not None
    saved = found.callback_origins
    try:
        yield found
    finally:
        found.callback_origins = saved


async def _run(platform: Platform, name: str, **function: Any) -> RunObject:
    async with Client(platform.config) as krt_client:
        await krt_client.create(Run.from_dict(manifest(name, source=ECHO, mode={"function": function})))
        return await krt_client.wait(name, timeout=60)


async def _raw_history(platform: Platform, workflow_id: str) -> bytes:
    """Every event of the workflow's history as Temporal stores it (no codec: sealed stays sealed)."""
    history = await platform.temporal.get_workflow_handle(workflow_id).fetch_history()
    return b"".join(event.SerializeToString() for event in history.events)


# -- delivered ---------------------------------------------------------------------------------------


async def test_an_allowed_callback_url_is_delivered_signed_in_place_of_the_targets_and_kept_secret(
    platform: Platform,
    origins: AsyncInvocations,
    receiver: Receiver,  # noqa: F811 - the imported fixture
    callbacks_allowed: bytes,  # noqa: F811 - the imported fixture
    log_capture: LogCapture,
) -> None:
    receiver.failing = 0
    secret = f"hook-secret-{uuid.uuid4().hex}"
    origin = f"https://127.0.0.1:{receiver.port}"
    url = f"{origin}/hook/{secret}?token={secret}"
    origins.callback_origins = CallbackOrigins.from_yaml(f'namespaces: {{default: ["{origin}"]}}')
    policy = {"asyncInvocations": {"callback": {"url": SPEC_HOOK, "secretName": HOOK_SECRET}}}
    async with Client(platform.config.model_copy(update={"identity": IDENTITY})) as owner:
        name = unique("cb-url")
        await owner.create(Run.from_dict(manifest(name, source=ECHO, mode={"function": policy})))
        run = await owner.wait(name, timeout=60)
        uid = run.metadata.uid
        assert uid is not None
        inv = f"cbu-{uuid.uuid4().hex[:6]}"
        accepted = await owner.invoke_async(run, {"n": 1}, invocation_id=inv, callback_url=url)
        # the same request again is the same invocation; another callback URL (or none) is not
        again = await owner.invoke_async(run, {"n": 1}, invocation_id=inv, callback_url=url)
        assert again.location == accepted.location
        for other in (f"{origin}/hook/other", None):
            with pytest.raises(InvocationConflict) as conflict:
                await owner.invoke_async(run, {"n": 1}, invocation_id=inv, callback_url=other)
            assert secret not in str(conflict.value)

        async def delivered() -> Any:
            read = await owner.invocations.get(accepted)
            return read if read.callback is not None and read.callback.delivered else None

        done = await eventually(delivered, within=90, what="the per-request callback delivered", every=0.2)
    assert done.ok and done.callback is not None
    assert done.callback.url == origin, "the status shows the callback's origin only"
    assert len(receiver.requests) == 1, "delivered once, to the request's URL (not the target's)"
    got, body = receiver.requests[0]
    assert verify(got[SIGNATURE_HEADER.lower()], body, callbacks_allowed), "signed with the target's Secret"
    assert json.loads(body)["invocationId"] == inv
    assert secret not in json.dumps(done.model_dump(mode="json")), "the URL's path or query in the status"
    assert not [line for line in log_capture.lines if secret in line], "the URL's path or query in a log"
    history = await _raw_history(platform, invocation_workflow_id("default", uid, inv))
    assert inv.encode() in history, "the history read is the invocation's"
    assert secret.encode() not in history, "the URL's path or query in clear in Temporal's history"


# -- refused -----------------------------------------------------------------------------------------


async def test_what_the_gateway_refuses_is_refused_before_anything_is_recorded_and_never_echoed(
    platform: Platform,
    http: aiohttp.ClientSession,  # noqa: F811 - the imported fixture
    origins: AsyncInvocations,
    log_capture: LogCapture,
) -> None:
    run = await _run(platform, unique("cb-refused"))
    uid = run.metadata.uid
    assert uid is not None
    invoke, coll = urls(run)
    secret = f"hook-secret-{uuid.uuid4().hex}"
    tail = f"/hook/{secret}?token={secret}"
    origins.callback_origins = CallbackOrigins.from_yaml(
        'namespaces: {default: ["https://*.example.org", "https://localhost", "https://bücher.example"],'
        ' other: ["https://hooks.example.com"]}'
    )
    cases: list[tuple[str, str, int, str, str]] = [
        # (what, URL, status, reason, a word the message says)
        ("http", f"http://a.example.org{tail}", 400, "InvalidCallbackURL", "https"),
        (
            "over 2,048 bytes",
            f"https://a.example.org{tail}&pad=" + "x" * 2048,
            400,
            "InvalidCallbackURL",
            "2048",
        ),
        ("a user", f"https://user:{secret}@a.example.org{tail}", 400, "InvalidCallbackURL", "user"),
        ("no host", f"https://{tail}", 400, "InvalidCallbackURL", "host"),
        ("not parseable", f"https://[::1{tail}", 400, "InvalidCallbackURL", "parsed"),
        (
            "another namespace's",
            f"https://hooks.example.com{tail}",
            403,
            "CallbackNotAllowed",
            "hooks.example.com",
        ),
        ("the wildcard's own name", f"https://example.org{tail}", 403, "CallbackNotAllowed", "example.org"),
        ("a suffix trick", f"https://example.org.evil.com{tail}", 403, "CallbackNotAllowed", "evil.com"),
        ("a dash trick", f"https://evil-example.org{tail}", 403, "CallbackNotAllowed", "evil-example.org"),
        ("two labels under the wildcard", f"https://a.b.example.org{tail}", 403, "CallbackNotAllowed", "a.b"),
        ("another port", f"https://a.example.org:8443{tail}", 403, "CallbackNotAllowed", "8443"),
        ("an IP literal for a name", f"https://127.0.0.1{tail}", 403, "CallbackNotAllowed", "127.0.0.1"),
        ("an IPv6 literal for a name", f"https://[::1]{tail}", 403, "CallbackNotAllowed", "[::1]"),
        (
            "a look-alike of an IDNA name",
            f"https://bucher.example{tail}",
            403,
            "CallbackNotAllowed",
            "bucher",
        ),
    ]
    for what, url, status, reason, word in cases:
        inv = f"cbr-{uuid.uuid4().hex[:6]}"
        code, _, doc = await call(
            http,
            "POST",
            invoke,
            body=b"{}",
            sent={**ASYNC, headers.INVOCATION_ID: inv, headers.CALLBACK_URL: url},
        )
        assert (code, doc["reason"]) == (status, reason), (what, doc)
        assert word in doc["message"], (what, doc["message"])
        assert secret not in doc["message"] and "/hook/" not in doc["message"], (what, doc["message"])
        assert not await recorded(platform, uid, inv), f"{what}: recorded although refused"
    # no file at all: no per-request callback anywhere, and the answer says the operator's part
    origins.callback_origins = None
    inv = f"cbr-{uuid.uuid4().hex[:6]}"
    code, _, doc = await call(
        http,
        "POST",
        invoke,
        body=b"{}",
        sent={**ASYNC, headers.INVOCATION_ID: inv, headers.CALLBACK_URL: f"https://a.example.org{tail}"},
    )
    assert (code, doc["reason"]) == (403, "CallbackNotAllowed"), doc
    assert "operator has not allowed any" in doc["message"] and secret not in doc["message"], doc
    assert not await recorded(platform, uid, inv)
    # a sync invoke has nobody to call back: 400, and it did not run
    code, _, doc = await call(
        http,
        "POST",
        invoke,
        body=b"{}",
        sent={headers.INVOCATION_ID: inv, headers.CALLBACK_URL: f"https://a.example.org{tail}"},
    )
    assert (code, doc["reason"]) == (400, "InvalidCallbackURL"), doc
    assert "async invocation only" in doc["message"] and secret not in doc["message"], doc
    # a resubmit keeps the recorded URL: naming another is refused, not ignored
    code, _, doc = await call(
        http,
        "POST",
        f"{coll}/{inv}:resubmit",
        body=b"",
        sent={headers.CALLBACK_URL: f"https://a.example.org{tail}"},
    )
    assert (code, doc["reason"]) == (400, "InvalidCallbackURL"), doc
    assert "resubmit keeps" in doc["message"] and secret not in doc["message"], doc
    assert not [line for line in log_capture.lines if secret in line], (
        "a refused URL's path or query in a log"
    )


async def test_a_host_is_compared_normalized_and_the_status_shows_it_so(
    platform: Platform,
    http: aiohttp.ClientSession,  # noqa: F811 - the imported fixture
    origins: AsyncInvocations,
) -> None:
    """An uppercase host with a trailing dot is the lowercase one: accepted, and its callback is
    tried at the normalized origin (loopback, refused by the platform's worker: nothing connects,
    and no DNS query leaves the machine)."""
    run = await _run(platform, unique("cb-norm"))
    invoke, coll = urls(run)
    origins.callback_origins = CallbackOrigins.from_yaml('namespaces: {"*": ["https://localhost:9"]}')
    inv = f"cbn-{uuid.uuid4().hex[:6]}"
    code, _, doc = await call(
        http,
        "POST",
        invoke,
        body=b"{}",
        sent={**ASYNC, headers.INVOCATION_ID: inv, headers.CALLBACK_URL: "https://LocalHost.:9/h?t=1"},
    )
    assert code == 202, doc

    async def status() -> dict[str, Any]:
        code, _, doc = await call(http, "GET", f"{coll}/{inv}")
        assert code == 200, doc
        assert isinstance(doc, dict)
        return doc

    done = await eventually(
        status,
        within=60,
        until=lambda d: d["state"] in TERMINAL and d["callback"] and d["callback"]["failures"],
    )
    assert done["callback"]["url"] == "https://localhost:9", done["callback"]
    assert not done["callback"]["delivered"]


async def test_krt_invoke_async_callback_is_refused_without_async_and_names_only_the_origin(
    platform: Platform, origins: AsyncInvocations
) -> None:
    run = await _run(platform, unique("cb-cli"))
    origins.callback_origins = CallbackOrigins.from_yaml("namespaces: {}")
    secret = f"hook-secret-{uuid.uuid4().hex}"
    url = f"https://hooks.example.com/{secret}?token={secret}"
    sync = await krt(platform, "invoke", run.metadata.name, "--data", "{}", "--callback", url)
    assert sync.code == 2 and "--async" in one_error_line(sync.err), sync
    refused = await krt(platform, "invoke", run.metadata.name, "--data", "{}", "--async", "--callback", url)
    line = one_error_line(refused.err)
    assert refused.code == 1 and "CallbackNotAllowed" in line and "https://hooks.example.com" in line, refused
    assert "--callback-origins" in line and secret not in refused.err + refused.out, refused


# -- the origins file, and `krt gateway` ---------------------------------------------------------------


async def test_krt_gateway_refuses_to_start_on_a_malformed_origins_file_naming_the_entry(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "origins.yaml"
    bad.write_text(
        'namespaces:\n  default: ["https://hooks.example.com", "https://hooks.example.com/x?token=S3CRET"]\n'
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kruntimes.workers.gateway",
        *("--cert", str(tmp_path / "none"), "--key", str(tmp_path / "none")),
        *("--peer-tls", str(tmp_path), "--assignment-public-key", str(tmp_path / "none")),
        *("--callback-origins", str(bad)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    message = err.decode()
    assert "namespaces.default[1]" in message and "no path or query" in message, message
    assert "S3CRET" not in message + out.decode()


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ('namespaces: {default: ["http://a.example.com"]}', "https:// only"),
        ('namespaces: {default: ["https://u:p@a.example.com"]}', "no user"),
        ('namespaces: {default: ["https://*.com"]}', "two labels"),
        ('namespaces: {default: ["https://a.*.example.com"]}', "not a valid host name"),
        ('namespaces: {default: ["https://*.*.example.com"]}', "not a valid host name"),
        ('namespaces: {default: ["https://a.example.com:0"]}', "port 0"),
        ('namespaces: {default: ["https://a.example.com:70000"]}', "not an origin"),
        ('namespaces: {default: ["https://0x7f.0.0.1"]}', "dotted decimal"),
        ('namespaces: {default: ["https://0x7f000001"]}', "dotted decimal"),
        ('namespaces: {default: ["https://127.1"]}', "dotted decimal"),
        ("namespaces: {Default: []}", "DNS-1123"),
        ("namespaces: {default: https://a.example.com}", "a list of origins"),
        ("namespaces: {default: [1]}", "a string"),
        ("hosts: {}", "`namespaces`"),
        ("namespaces: [", "not valid YAML"),
        ("namespaces: {default: [" + ", ".join(['"https://a.example.com"'] * 257) + "]}", "at most 256"),
    ],
)
def test_a_malformed_origins_document_is_refused_naming_what(document: str, named: str) -> None:
    with pytest.raises(OriginsError) as refused:
        CallbackOrigins.from_yaml(document)
    assert named in str(refused.value)


def test_an_origins_file_is_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (256 * 1024) + "\nnamespaces: {}\n")
    with pytest.raises(OriginsError, match="larger than"):
        CallbackOrigins.load(big)
    with pytest.raises(OriginsError, match="cannot be read"):
        CallbackOrigins.load(tmp_path / "missing.yaml")


ALLOWED = CallbackOrigins.from_yaml(
    """
namespaces:
  default:
    - https://*.Example.ORG
    - https://HOOKS.example.com:8443
    - https://bücher.example
    - https://203.0.113.7
    - https://[2001:db8::1]:9443
  "*": [https://shared.example.net]
"""
)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://a.example.org/h", True),
        ("https://A.EXAMPLE.ORG./h", True),  # case and a trailing dot
        ("https://a.example.org:443/h", True),  # the default port said
        ("https://example.org/h", False),  # the wildcard's own name
        ("https://a.b.example.org/h", False),  # one label only
        ("https://example.org.evil.com/h", False),
        ("https://a.example.org.evil.com/h", False),
        ("https://evil-example.org/h", False),
        ("https://evilexample.org/h", False),
        ("https://a.example.org:444/h", False),
        ("https://hooks.example.com:8443/h", True),
        ("https://hooks.example.com/h", False),  # 443, not 8443
        ("https://BÜCHER.example/h", True),  # IDNA, uppercase
        ("https://xn--bcher-kva.example/h", True),  # its ASCII form
        ("https://bucher.example/h", False),
        ("https://203.0.113.7/h", True),
        ("https://203.0.113.7:8443/h", False),
        ("https://[2001:db8::1]:9443/h", True),
        ("https://[2001:DB8:0::1]:9443/h", True),  # another spelling of the address
        ("https://[::ffff:203.0.113.7]/h", False),  # a mapped address is another address
        ("https://shared.example.net/h", True),  # "*": every namespace
    ],
)
def test_a_url_matches_an_origin_normalized_and_wildcards_cover_one_label(url: str, allowed: bool) -> None:
    assert ALLOWED.allows("default", parse_callback_url(url)) is allowed


def test_an_ip_literal_matches_only_an_ip_entry_and_a_name_only_a_name() -> None:
    names = CallbackOrigins.from_yaml('namespaces: {default: ["https://localhost", "https://*.example.org"]}')
    addresses = CallbackOrigins.from_yaml('namespaces: {default: ["https://127.0.0.1", "https://[::1]"]}')
    for url in ("https://127.0.0.1/", "https://[::1]/", "https://[::ffff:127.0.0.1]/"):
        assert not names.allows("default", parse_callback_url(url)), url
    assert not addresses.allows("default", parse_callback_url("https://localhost/"))
    for url in ("https://2130706433/", "https://0x7f000001/", "https://127.1/", "https://017.0.0.1/"):
        with pytest.raises(InvalidCallbackUrl):
            parse_callback_url(url)  # an IPv4 address in another spelling: no name, no address


def test_the_recorded_url_is_normalized_and_the_header_bound_is_the_workflows() -> None:
    assert MAX_HEADER_BYTES == MAX_CALLBACK_URL_CHARS, "the gateway's bound is the workflow input's"
    parsed = parse_callback_url("HTTPS://Bücher.Example.:8443/Path?Q=1")
    assert parsed.url == "https://xn--bcher-kva.example:8443/Path?Q=1"
    assert parsed.origin == "https://xn--bcher-kva.example:8443"
    longest = "https://a.example.org/" + "x" * (MAX_HEADER_BYTES - len("https://a.example.org/"))
    assert parse_callback_url(longest).url == longest
    with pytest.raises(InvalidCallbackUrl, match="2048"):
        parse_callback_url(longest + "x")
    for bad, part in (
        ("https://a.example.org/p#fragsecret", "fragsecret"),
        ("https://a.example.org/\u00e9t\u00e9", "\u00e9t\u00e9"),
        ("https://a.example.org/a b", "a b"),
        ("https://a.example.org/p?token=S3CRET#x", "S3CRET"),
    ):
        with pytest.raises(InvalidCallbackUrl) as refused:
            parse_callback_url(bad)
        assert part not in str(refused.value)


def test_the_embedded_platforms_gateway_reads_a_file_that_allows_none(tmp_path: Path) -> None:
    """`krt up`'s gateway is started with the state directory's file, and what it writes there at
    first loads and allows no origin anywhere."""
    layout = Layout(tmp_path)
    tls = TlsFiles(ca_cert=tmp_path / "ca.crt", cert=tmp_path / "tls.crt", key=tmp_path / "tls.key")
    settings = TemporalSettings(tlsCa="ca", tlsCert="crt", tlsKey="key")
    argv = _gateway_argv(layout, ports={"gateway": 1, "heartbeat": 2}, tls=tls, temporal=settings)
    assert argv[1:3] == ["-m", "kruntimes.workers.gateway"]
    args = gateway_main.parse_args(argv[3:])
    assert args.callback_origins == layout.callback_origins
    layout.callback_origins.write_text(DEFAULT_CALLBACK_ORIGINS)
    loaded = gateway_main.callback_origins_from(args)
    assert loaded is not None
    for namespace in ("default", "team-a"):
        assert not loaded.allows(namespace, parse_callback_url("https://hooks.example.com/h"))
