"""`krt codec-server` decodes the platform's encrypted history for callers whose token is in an
allowed group: the real `temporal workflow show --codec-endpoint` against a Run of the shared
(encrypting) platform shows the env decoded with an admin's token, and nothing without one, with
a wrong one, or with a token outside the group. Then the protocol itself over real HTTP(S): CORS
for the UI's origin (the preflight included), X-Namespace, bounded bodies, catalogued errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from kruntimes.api.run import Run
from kruntimes.gateway.auth import TokenFile
from kruntimes.gateway.codec_server import DEFAULT_MAX_BODY_BYTES, MAX_PAYLOADS, CodecOptions, CodecServer
from kruntimes.gateway.listener import HttpLimits
from kruntimes.pki.local import ensure_tls
from kruntimes.sdk.client import Client
from kruntimes.temporal.codec import EncryptionCodec, Keyring
from kruntimes.workers.codec_server import options_from, parse_args, ssl_context_from
from tests.gateway.rawhttp import Connection, request, trickling
from tests.sdk.stack import Platform, manifest, unique, workflow_show
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
SECRET = f"codec-secret-{uuid.uuid4().hex}"
ADMIN = f"codec-admin-token-{uuid.uuid4().hex}"
DEV = f"codec-dev-token-{uuid.uuid4().hex}"  # a known user outside the allowed group
UI = "http://127.0.0.1:8233"
ENV_ECHO = "import os\ndef handle(p):\n    return {'password': os.environ['DB_PASSWORD']}\n"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("codec") / "tokens.csv"
    path.write_text(f'{ADMIN},root,0,"admins"\n{DEV},alice,1000,"devs"\n')
    path.chmod(0o600)
    return path


@contextlib.asynccontextmanager
async def codec_server(platform: Platform, tokens: Path, *extra: str) -> AsyncIterator[str]:
    """`krt codec-server` as a process (stopped by its pid); yields its URL."""
    ready = tokens.parent / f"ready-{uuid.uuid4().hex[:6]}.json"
    log = ready.with_suffix(".log")
    argv = [
        "-m",
        "kruntimes.workers.krt",
        "codec-server",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        str(tokens),
    ]
    argv += ["--codec-keys", str(platform.config.codecKeys), "--ready-file", str(ready), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:

        def started() -> bool:
            assert proc.returncode is None, log.read_text()
            return ready.exists()

        await eventually(started, within=WAIT_S, every=0.05, what="the codec server to start")
        yield json.loads(ready.read_text())["url"]
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 15)
        text = log.read_text()
        assert ADMIN not in text and DEV not in text, "a token was logged"


def readable(output: str) -> str:
    """What `temporal workflow show -o json` printed, with every payload's data base64-decoded."""
    texts = [output]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    with contextlib.suppress(ValueError):
                        texts.append(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    with contextlib.suppress(ValueError):
        walk(json.loads(output))
    return "\n".join(texts)


async def show(platform: Platform, name: str, *codec: str) -> tuple[int, str]:
    """`temporal workflow show -o json` of the Run's workflow: its exit code, and everything it
    printed with the payloads' data decoded from base64 (`readable`)."""
    code, out, err = await workflow_show(platform, name, *codec, timeout_s=WAIT_S)
    return code, readable(out) + err


async def test_the_temporal_cli_reads_the_env_decoded_only_with_an_admins_token(
    platform: Platform, tokens: Path
) -> None:
    name = unique("codec")
    async with Client(platform.config) as krt:
        await krt.create(Run.from_dict(manifest(name, source=ENV_ECHO, env={"DB_PASSWORD": SECRET})))
        await krt.wait(name)
    code, plain = await show(platform, name)
    assert code == 0 and SECRET not in plain, "history holds ciphertext"
    async with codec_server(platform, tokens) as url:
        code, decoded = await show(platform, name, "--codec-endpoint", url, "--codec-auth", f"Bearer {ADMIN}")
        assert code == 0, decoded
        assert SECRET in decoded, "the env, decoded"
        refusals = ([], ["--codec-auth", "Bearer not-a-token"], ["--codec-auth", f"Bearer {DEV}"])
        # Each refused show runs until the CLI's own deadline: the three wait it out together.
        shown = await asyncio.gather(
            *(show(platform, name, "--codec-endpoint", url, *refused) for refused in refusals)
        )
        for refused, (code, output) in zip(refusals, shown, strict=True):
            assert code != 0 and SECRET not in output, refused[1:] or "no token"
            assert ADMIN not in output


# -- the protocol ------------------------------------------------------------------------------


def payloads(*data: bytes) -> dict[str, object]:
    return {
        "payloads": [
            {
                "metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
                "data": base64.b64encode(d).decode(),
            }
            for d in data
        ]
    }


@pytest.fixture(scope="module")
def codec_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kruntimes.temporal.codec import ensure_key

    return ensure_key(tmp_path_factory.mktemp("codec-keys") / "keys")


@contextlib.asynccontextmanager
async def served(
    codec_keys: Path, tokens: Path, *, tls: ssl.SSLContext | None = None, max_body: int = 64 * 1024
) -> AsyncIterator[str]:
    options = CodecOptions(
        codec=EncryptionCodec(Keyring.load(codec_keys)),
        tokens=TokenFile(tokens),
        cors_origins=frozenset({UI}),
        max_body_bytes=max_body,
    )
    server = CodecServer(options, host="127.0.0.1", port=0, ssl_context=tls)
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()


def auth(token: str = ADMIN, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


async def test_encode_then_decode_returns_the_payloads_with_cors_for_the_ui(
    codec_keys: Path, tokens: Path
) -> None:
    async with served(codec_keys, tokens) as url, aiohttp.ClientSession() as http:
        sent = payloads(b'{"a": 1}', b'"two"')
        headers = auth(Origin=UI, **{"X-Namespace": "default"})
        async with http.post(f"{url}/encode", json=sent, headers=headers) as answer:
            assert answer.status == 200
            assert answer.headers["Access-Control-Allow-Origin"] == UI
            assert answer.headers["Access-Control-Allow-Credentials"] == "true"
            encoded = await answer.json()
        metadata = encoded["payloads"][0]["metadata"]
        assert base64.b64decode(metadata["encoding"]) == b"binary/encrypted"
        assert b"two" not in json.dumps(encoded).encode()
        async with http.post(f"{url}/decode", json=encoded, headers=headers) as answer:
            assert answer.status == 200
            assert await answer.json() == sent
        # a payload written without the codec comes back as it is
        async with http.post(f"{url}/decode", json=sent, headers=auth()) as answer:
            assert await answer.json() == sent
            assert "Access-Control-Allow-Origin" not in answer.headers  # no Origin: no CORS


async def test_the_preflight_of_the_ui_origin_is_answered_and_others_are_not(
    codec_keys: Path, tokens: Path
) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,x-namespace",
    }
    async with served(codec_keys, tokens) as url, aiohttp.ClientSession() as http:
        for path in ("/decode", "/encode"):
            async with http.options(f"{url}{path}", headers={"Origin": UI, **preflight}) as answer:
                assert answer.status == 204
                assert answer.headers["Access-Control-Allow-Origin"] == UI
                assert "POST" in answer.headers["Access-Control-Allow-Methods"]
                allowed = answer.headers["Access-Control-Allow-Headers"].lower()
                assert {"authorization", "content-type", "x-namespace"} <= {
                    h.strip() for h in allowed.split(",")
                }
        async with http.options(
            f"{url}/decode", headers={"Origin": "https://evil.example", **preflight}
        ) as answer:
            assert answer.status == 403
            assert "Access-Control-Allow-Origin" not in answer.headers


@pytest.mark.parametrize(
    ("headers", "status", "reason"),
    [
        ({}, 401, "Unauthenticated"),
        (auth("not-a-token"), 401, "Unauthenticated"),
        (auth(DEV), 403, "Forbidden"),
    ],
    ids=["no-token", "unknown-token", "outside-the-group"],
)
async def test_callers_without_an_allowed_token_are_refused(
    codec_keys: Path, tokens: Path, headers: dict[str, str], status: int, reason: str
) -> None:
    async with served(codec_keys, tokens) as url, aiohttp.ClientSession() as http:
        for path in ("/decode", "/encode"):
            async with http.post(
                f"{url}{path}", json=payloads(b"1"), headers={"Origin": UI, **headers}
            ) as answer:
                assert answer.status == status
                body = await answer.json()
                assert body["reason"] == reason
                assert answer.headers["Access-Control-Allow-Origin"] == UI  # the UI can read why
                assert DEV not in json.dumps(body)


async def test_bodies_are_bounded_and_checked(codec_keys: Path, tokens: Path) -> None:
    async with served(codec_keys, tokens, max_body=4096) as url, aiohttp.ClientSession() as http:
        async with http.post(f"{url}/decode", data=b"x" * 5000, headers=auth()) as answer:
            assert (answer.status, (await answer.json())["reason"]) == (413, "PayloadTooLarge")
        for bad in (b"not json", b'{"payloads": 3}', b'{"other": []}', b"[" * 3000):
            async with http.post(f"{url}/decode", data=bad, headers=auth()) as answer:
                assert (answer.status, (await answer.json())["reason"]) == (400, "MalformedJSON"), bad[:20]
        forged = payloads(b"x")
        forged["payloads"][0]["metadata"] = {  # type: ignore[index]
            "encoding": base64.b64encode(b"binary/encrypted").decode(),
            "encryption-key-id": base64.b64encode(b"no-such-key").decode(),
        }
        async with http.post(f"{url}/decode", json=forged, headers=auth()) as answer:
            assert (answer.status, (await answer.json())["reason"]) == (400, "InvalidRequest")
        async with http.get(f"{url}/decode", headers=auth()) as answer:
            assert (answer.status, (await answer.json())["reason"]) == (405, "MethodNotAllowed")


async def test_a_caller_waiting_for_100_continue_gets_it_once_allowed(codec_keys: Path, tokens: Path) -> None:
    """A client that sends its body only after `100 Continue` (curl does for large bodies) is
    asked for it once its token is taken, and refused without it otherwise."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with served(codec_keys, tokens) as url, aiohttp.ClientSession(timeout=timeout) as http:
        sent = payloads(b'"waited"')
        async with http.post(f"{url}/encode", json=sent, headers=auth(), expect100=True) as answer:
            assert answer.status == 200
            encoded = await answer.json()
        async with http.post(f"{url}/decode", json=encoded, headers=auth(), expect100=True) as answer:
            assert (answer.status, await answer.json()) == (200, sent)
        async with http.post(f"{url}/decode", json=encoded, headers=auth("nobody"), expect100=True) as answer:
            assert (answer.status, (await answer.json())["reason"]) == (401, "Unauthenticated")


async def test_a_slow_body_is_answered_408_at_the_minimum_rate(codec_keys: Path, tokens: Path) -> None:
    """The codec server's bodies are held to the listener's minimum rate, as the gateway's are: the
    attack is an allowed caller trickling its body to keep a connection."""
    options = CodecOptions(codec=EncryptionCodec(Keyring.load(codec_keys)), tokens=TokenFile(tokens))
    limits = HttpLimits(body_timeout_s=1.0, body_min_rate=1000)
    server = CodecServer(options, host="127.0.0.1", port=0, ssl_context=None, limits=limits)
    url = await server.start()
    try:
        conn = await Connection.open(url.replace("http://", "https://"), Path("/nonexistent"), tls=False)
        try:
            await conn.send(request("/decode", headers=auth(), content_length=60_000))
            async with trickling(conn, b'{"payloads": [' + b" " * 60_000):  # 20 bytes/s
                answer = await conn.answer()
            assert (answer.status, json.loads(answer.body)["reason"]) == (408, "RequestBodyTimeout")
        finally:
            await conn.close()
    finally:
        await server.stop()


async def test_https_with_a_certificate_and_plain_http_only_on_loopback(
    codec_keys: Path, tokens: Path, tmp_path: Path
) -> None:
    files = ensure_tls(tmp_path / "tls")
    args = parse_args(["--token-file", str(tokens), "--cert", str(files.cert), "--key", str(files.key)])
    context = ssl_context_from(args, "127.0.0.1")
    assert context is not None
    async with served(codec_keys, tokens, tls=context) as url:
        assert url.startswith("https://")
        client_context = ssl.create_default_context(cafile=str(files.ca_cert))
        connector = aiohttp.TCPConnector(ssl=client_context)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.post(f"{url}/decode", json=payloads(b"1"), headers=auth()) as answer,
        ):
            assert answer.status == 200
    plain = parse_args(["--token-file", str(tokens)])
    assert ssl_context_from(plain, "127.0.0.1") is None
    with pytest.raises(SystemExit, match="loopback"):
        ssl_context_from(plain, "0.0.0.0")
    with pytest.raises(SystemExit, match="KRT_CODEC_KEYS"):
        options_from(plain, env={})
    assert options_from(plain, env={"KRT_CODEC_KEYS": str(codec_keys)}).groups == ("admins",)


async def test_a_body_of_too_many_payloads_is_refused_before_any_is_encrypted(
    codec_keys: Path, tokens: Path
) -> None:
    """600k empty payloads fit in 8 MB; encrypted they would be answered with tens of times that."""
    many = b'{"payloads": [' + b",".join([b"{}"] * 600_000) + b"]}"
    async with (
        served(codec_keys, tokens, max_body=DEFAULT_MAX_BODY_BYTES) as url,
        aiohttp.ClientSession() as http,
    ):
        for path in ("/encode", "/decode"):
            async with http.post(f"{url}{path}", data=io.BytesIO(many), headers=auth()) as answer:
                body = await answer.json()
                assert (answer.status, body["reason"]) == (413, "PayloadTooLarge")
                assert f"at most {MAX_PAYLOADS} payloads, not 600000" in body["message"]
        async with http.post(f"{url}/encode", json=payloads(*[b""] * MAX_PAYLOADS), headers=auth()) as answer:
            assert answer.status == 200, "as many as the bound are served"
            assert len((await answer.json())["payloads"]) == MAX_PAYLOADS


async def test_an_answer_larger_than_twice_the_body_bound_is_refused(codec_keys: Path, tokens: Path) -> None:
    async with (
        served(codec_keys, tokens, max_body=16 * 1024) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/encode", json={"payloads": [{}] * 1000}, headers=auth()) as answer,
    ):
        body = await answer.json()
        assert (answer.status, body["reason"]) == (413, "PayloadTooLarge")
        assert "the answer would be larger than 32768 bytes" in body["message"]
