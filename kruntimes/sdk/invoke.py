"""The HTTPS invoke client: an invoke target to its endpoint, one POST through the gateway (never
retried), and the gateway's answer to an InvokeResult or a typed error. Never touches Temporal
but to look up a Run's endpoint by name. aiohttp is imported on first use.
"""

from __future__ import annotations

import json
import ssl
import uuid
from typing import TYPE_CHECKING, Any

from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import Run
from kruntimes.api.status import Endpoint, RunStatus
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import (
    AsyncBacklogFull,
    AsyncUnavailable,
    Busy,
    ConfigError,
    FunctionNotFound,
    InvocationConflict,
    InvocationFailed,
    InvocationNotFound,
    InvokeError,
    NotReady,
    OutcomeUnknown,
    PayloadRejected,
    Unauthorized,
)
from kruntimes.sdk.results import InvokeResult
from kruntimes.wire import headers as wire

if TYPE_CHECKING:
    import aiohttp

    from kruntimes.sdk.runs import Runs


# How long past the invocation timeout the SDK waits for the gateway's own answer (504).
ANSWER_MARGIN_S = 15.0
# The async invocation API answers from Temporal, never after the function: a read waits this long.
READ_S = 30.0
# A status holds at most one sync answer (MAX_RESULT_BYTES); a page of a list, several summaries.
MAX_ANSWER_BYTES = 8 * 1024 * 1024

InvokeTarget = str | Run | RunStatus | Endpoint


async def endpoint_of(target: InvokeTarget, *, namespace: str, runs: Runs) -> Endpoint:
    """Where to invoke ``target``: a Run name (one status query when Ready), a Run or RunStatus,
    an Endpoint, or the invoke URL. A target that is not a Ready function raises at once."""
    if isinstance(target, Endpoint):
        return target
    if isinstance(target, str) and target.startswith(("https://", "http://")):
        protocol = "HTTPS" if target.startswith("https://") else "HTTP"
        return Endpoint.model_validate({"protocol": protocol, "url": target})
    run: Run | None = None
    if isinstance(target, RunStatus):
        status = target
    else:
        if isinstance(target, str):
            status = await runs.status(target, namespace)  # one query on the hot path
            if status.phase is RunPhase.Ready and status.endpoint is not None:
                return status.endpoint
            run = await runs.get(target, namespace)
        else:
            run = target
            if target.status is None or target.status.phase is not RunPhase.Ready:
                run = await runs.get(target.metadata.name, target.metadata.namespace)
        status = run.status or RunStatus()
    label = f"run {run.metadata.name!r}" if run is not None else "the run"
    if run is not None and run.spec.mode.kind == "task":
        raise FunctionNotFound(404, "NotAFunction", f"{label} is a task, not a function", invocation_id="")
    if status.endpoint is not None and status.phase is RunPhase.Ready:
        return status.endpoint
    if is_terminal(status.phase):
        raise FunctionNotFound(
            404, "RunFinished", f"{label} has ended {status.phase.value}", invocation_id=""
        )
    raise NotReady(
        503,
        "RunNotReady",
        f"{label} is {status.phase.value}, not Ready",
        invocation_id="",
        retry_after=1.0,
    )


class Invoker:
    """Invocations over one HTTPS session (keep-alive, made on first use); close it."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self, endpoint: Endpoint, data: Any, *, invocation_id: str | None, timeout: float | None
    ) -> InvokeResult:
        """One invocation: ``data`` as JSON (``bytes`` as they are; None: no body), the token,
        the invocation id (a uuid4 when None) and the timeout header when given."""
        inv = invocation_id or str(uuid.uuid4())
        headers = {wire.INVOCATION_ID: inv, "Content-Type": "application/json"}
        if self.config.token:
            _token_may_go_to(endpoint.url, self.config.gatewayUrl)
            headers[wire.AUTHORIZATION] = f"Bearer {self.config.token}"
        if timeout is not None:
            headers[wire.TIMEOUT] = f"{timeout:g}"
        if data is None:
            body = b""
        elif isinstance(data, bytes | bytearray):
            body = bytes(data)
        else:
            body = json.dumps(data, separators=(",", ":")).encode()
        if len(body) > MAX_PAYLOAD_BYTES:  # the gateway's 413, without sending the body
            raise PayloadRejected(
                413,
                "PayloadTooLarge",
                f"the body is {len(body)} bytes, larger than {MAX_PAYLOAD_BYTES}",
                invocation_id=inv,
            )
        return await self._post(endpoint, body, headers, inv, timeout)

    async def _post(
        self, endpoint: Endpoint, body: bytes, headers: dict[str, str], inv: str, timeout: float | None
    ) -> InvokeResult:
        import aiohttp

        session = self._http()
        read_s = (timeout if timeout is not None else DEFAULT_INVOKE_TIMEOUT_SECONDS) + ANSWER_MARGIN_S
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_s)
        ssl_context = self._ssl_context(endpoint) if endpoint.url.startswith("https://") else None
        try:
            async with session.post(
                endpoint.url, data=body, headers=headers, ssl=ssl_context or True, timeout=client_timeout
            ) as response:
                raw = await response.read()
                return parse_answer(response.status, response.headers, raw, inv)
        except aiohttp.ClientConnectorCertificateError as e:
            raise ConfigError(
                f"the gateway's certificate at {endpoint.url} is not trusted: set caFile (KRT_CA_FILE) "
                "to the platform CA"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise ConfigError(
                f"cannot reach the gateway at {_origin(endpoint.url)}: is `krt up` running?"
            ) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise OutcomeUnknown(
                0,
                "ConnectionLost",
                f"the connection broke after the request was sent ({type(e).__name__}); "
                "the function may have run",
                invocation_id=inv,
            ) from e

    async def exchange(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        inv: str = "",
        read_s: float = READ_S,
    ) -> tuple[int, Any, bytes]:
        """One request of the async invocation API (accept, read, list, resubmit) with the token:
        its status, headers and body (at most MAX_ANSWER_BYTES). Each is safe to send again (an
        accept by its id), so a connection lost after sending is ConfigError, not OutcomeUnknown."""
        import aiohttp
        import yarl

        sent = {**(headers or {})}
        if self.config.token:
            _token_may_go_to(url, self.config.gatewayUrl)
            sent[wire.AUTHORIZATION] = f"Bearer {self.config.token}"
        endpoint = Endpoint.model_validate(
            {"protocol": "HTTPS" if url.startswith("https://") else "HTTP", "url": url}
        )
        ssl_context = self._ssl_context(endpoint) if url.startswith("https://") else None
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_s)
        try:
            async with self._http().request(
                method,
                yarl.URL(url, encoded=True),  # the invocation id is percent-encoded already
                data=body,
                headers=sent,
                ssl=ssl_context or True,
                timeout=client_timeout,
            ) as response:
                raw = await _read_bounded(response.content, MAX_ANSWER_BYTES + 1)
                if len(raw) > MAX_ANSWER_BYTES:
                    raise InvokeError(
                        response.status,
                        "AnswerTooLarge",
                        f"the gateway's answer is over {MAX_ANSWER_BYTES} bytes",
                        invocation_id=inv,
                    )
                return response.status, response.headers, raw
        except aiohttp.ClientConnectorCertificateError as e:
            raise ConfigError(
                f"the gateway's certificate at {_origin(url)} is not trusted: set caFile (KRT_CA_FILE) "
                "to the platform CA"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise ConfigError(f"cannot reach the gateway at {_origin(url)}: is `krt up` running?") from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ConfigError(
                f"the connection to the gateway at {_origin(url)} broke ({type(e).__name__}); "
                "sending it again is safe"
            ) from e

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=60),
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "kruntimes-sdk"},
            )
        return self._session

    def _ssl_context(self, endpoint: Endpoint) -> ssl.SSLContext:
        ca_file = self.config.caFile
        key = f"file:{ca_file}" if ca_file else f"pem:{endpoint.caBundle}" if endpoint.caBundle else "system"
        context = self._ssl.get(key)
        if context is None:
            try:
                if ca_file:
                    context = ssl.create_default_context(cafile=ca_file)
                elif endpoint.caBundle:
                    context = ssl.create_default_context(cadata=endpoint.caBundle)
                else:
                    context = ssl.create_default_context()
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"cannot load the CA file {ca_file}: {e}") from e
            self._ssl[key] = context
        return context


def parse_answer(status: int, headers: Any, raw: bytes, inv: str) -> InvokeResult:
    """The gateway's answer (status, headers, body): the result of a Succeeded invocation, else
    the typed error it stands for. ``inv``: our invocation id, when the answer names none."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    inv = str(body.get("invocationId") or headers.get(wire.INVOCATION_ID) or inv)
    if status == 200:
        try:
            result = InvokeResult.model_validate(body)
        except ValueError as e:
            raise InvokeError(
                200, "MalformedAnswer", "the gateway's answer did not parse", invocation_id=inv
            ) from e
        if not result.ok:
            raise InvocationFailed(result)
        return result
    raise refusal(status, headers, body, inv)


# The async invocation API's own reasons (docs/async-invocations.md), each a subclass of the
# error its status maps to for a sync invoke.
_ASYNC_REASONS: dict[tuple[int, str], type[InvokeError]] = {
    (409, "InvocationConflict"): InvocationConflict,
    (429, "AsyncBacklogFull"): AsyncBacklogFull,
    (503, "AsyncUnavailable"): AsyncUnavailable,
    (404, "InvocationNotFound"): InvocationNotFound,
}


def refusal(status: int, headers: Any, body: dict[str, Any], inv: str) -> InvokeError:
    """The typed error of an answer that is no result: its reason and message from the body,
    Retry-After for 429 and 503."""
    reason = str(body.get("reason") or f"HTTP{status}")
    message = str(body.get("message") or "")
    special = _ASYNC_REASONS.get((status, reason))
    if status in (429, 503):
        retrying: type[Busy | NotReady] = Busy if status == 429 else NotReady
        if special is not None and issubclass(special, Busy | NotReady):
            retrying = special
        return retrying(status, reason, message, invocation_id=inv, retry_after=_retry_after(headers))
    if special is not None:
        return special(status, reason, message, invocation_id=inv)
    kind: type[InvokeError] = {
        400: PayloadRejected,
        401: Unauthorized,
        403: Unauthorized,
        404: FunctionNotFound,
        413: PayloadRejected,
        500: OutcomeUnknown,  # the gateway failed; it may have dispatched first
        502: OutcomeUnknown,
        504: OutcomeUnknown,
    }.get(status, InvokeError)
    return kind(status, reason, message, invocation_id=inv)


def unreachable(error: BaseException) -> bool:
    """Whether an error of `Invoker.exchange` is the gateway not answering now (refused, reset,
    cut off, silent), which a later read may find answering; not a certificate it does not trust."""
    import aiohttp

    cause = error.__cause__
    return isinstance(cause, aiohttp.ClientError | TimeoutError) and not isinstance(
        cause, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError
    )


async def _read_bounded(content: Any, limit: int) -> bytes:
    """The body until its end or `limit` bytes, whichever comes first: one `read(n)` returns only
    what has arrived so far (a large answer comes in many pieces)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _token_may_go_to(url: str, gateway_url: str) -> None:
    """A bearer token goes over HTTPS, or to the origin of the gateway the client is configured
    with (an operator's choice): a URL pasted as `http://…` from elsewhere (a Location, a typo)
    would send it in plain text to whoever listens there. ConfigError, before any connection."""
    if not url.startswith("https://") and _origin(url) != _origin(gateway_url):
        raise ConfigError(f"refusing to send the client's token to {_origin(url)}: not HTTPS")


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rsplit('@', 1)[-1]}"  # never a password in the URL


def _retry_after(headers: Any) -> float:
    try:
        return max(float(headers.get(wire.RETRY_AFTER, "1")), 0.0)
    except ValueError:
        return 1.0
