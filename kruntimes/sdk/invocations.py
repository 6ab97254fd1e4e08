"""Async invocations (issue #44; docs/async-invocations.md): submit one to a Run or a Function
(`Prefer: respond-async`, answered 202 once it is recorded), read its status, wait until it ends,
list a target's invocations by state, and submit a failed one again under a new id.

    async with Client.from_config() as krt:
        accepted = await krt.invoke_async("hello", {"name": "x"}, invocation_id="order-42")
        done = await krt.invocations.wait(accepted, timeout=120)   # Succeeded | Failed | Unknown
        print(done.state, done.answer())
        async for failed in krt.invocations.list("hello", state="Failed"):
            await krt.invocations.resubmit("hello", failed.invocationId)

A Run's invocations live under its invoke URL, a Function's under its own; a target is a Run name
(or `function=True`: a Function name), a Run, RunStatus, Function, Endpoint or invoke URL, or for
reads an invocation's location. Every call is one HTTPS request through the gateway, which answers
from Temporal; none touches Temporal here but to look a target's uid up by its name.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from kruntimes.api.function import Function
from kruntimes.api.ids import Namespace, RuntimeName, RunUid
from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.api.names import validate_invocation_id
from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import Run
from kruntimes.api.spec import MAX_CALLBACK_URL_CHARS as MAX_CALLBACK_URL_BYTES
from kruntimes.api.status import Endpoint, RunStatus
from kruntimes.contracts.invocation import InvocationState
from kruntimes.contracts.names import function_invoke_url, invoke_url
from kruntimes.sdk.errors import (
    Busy,
    ConfigError,
    FunctionNotFound,
    InvokeError,
    NotReady,
    PayloadRejected,
    WaitTimeout,
)
from kruntimes.sdk.invoke import refusal, unreachable
from kruntimes.sdk.results import AsyncInvocation, Invocation
from kruntimes.wire import headers as wire

if TYPE_CHECKING:
    from kruntimes.sdk.functions import Functions
    from kruntimes.sdk.invoke import Invoker
    from kruntimes.sdk.runs import Runs

INVOKE_SUFFIX = ":invoke"
INVOCATIONS = "/invocations"
MAX_WAIT_S = 3600.0  # a wait without a timeout still ends after this long
FIRST_POLL_S = 0.2  # a wait's first pause; each next one half as long again, up to MAX_POLL_S
MAX_POLL_S = 5.0
DEFAULT_LIMIT = 1000  # invocations `list` yields at most unless told otherwise
MAX_PAGE_SIZE = 1000

# What names an invocation's target: a Run (name, object, status), a Function (object, or a name
# with function=True), its Endpoint or invoke URL; for reads also an invocation's location or
# the AsyncInvocation the accept answered.
InvocationTarget = str | Run | RunStatus | Function | Endpoint | AsyncInvocation
States = Literal["Queued", "Running", "Succeeded", "Failed", "Unknown"]


def invocations_url(endpoint_url: str) -> str:
    """The invocations collection under an invoke URL (`…/functions/{uid}:invoke`)."""
    if not endpoint_url.endswith(INVOKE_SUFFIX):
        raise ConfigError(f"not an invoke URL (…{INVOKE_SUFFIX}): {endpoint_url[:200]}")
    return endpoint_url.removesuffix(INVOKE_SUFFIX) + INVOCATIONS


def invocation_url(collection: str, invocation_id: str) -> str:
    """One invocation's URL: its id percent-encoded as one path segment."""
    return f"{collection}/{urllib.parse.quote(invocation_id, safe='')}"


def _checked_id(invocation_id: str, *, flag: str = "invocation id") -> str:
    try:
        return validate_invocation_id(invocation_id)
    except ValueError as e:
        raise PayloadRejected(400, "InvalidInvocationId", f"{flag}: {e}", invocation_id="") from e


def _check_callback_url(url: str, inv: str) -> None:
    """What the SDK checks of a callback URL before sending it (the gateway checks the rest): a
    header's bounds. The message never quotes the URL (its path or query may carry a token)."""
    if not isinstance(url, str) or not url.isascii() or any(not c.isprintable() or c.isspace() for c in url):
        raise PayloadRejected(
            400,
            "InvalidCallbackURL",
            "the callback URL must be printable ASCII without spaces",
            invocation_id=inv,
        )
    if not 1 <= len(url) <= MAX_CALLBACK_URL_BYTES:
        raise PayloadRejected(
            400,
            "InvalidCallbackURL",
            f"the callback URL must be 1..{MAX_CALLBACK_URL_BYTES} bytes",
            invocation_id=inv,
        )


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _location_of(url: str) -> tuple[str, str] | None:
    """(collection, id) of an invocation's location URL, or None for any other URL."""
    head, sep, tail = url.rpartition(INVOCATIONS + "/")
    if not sep or not tail or "/" in tail or ":" in tail:
        return None
    return head + INVOCATIONS, urllib.parse.unquote(tail)


def parse_accepted(status: int, headers: Any, raw: bytes, *, url: str, inv: str) -> AsyncInvocation:
    """The gateway's answer to an async submission (or a resubmission): 202 with the invocation's
    id, state and location (relative to `url`, made absolute), else the typed error it stands for."""
    body = _body(raw)
    inv = str(body.get("invocationId") or headers.get(wire.INVOCATION_ID) or inv)
    if status == 202:
        location = str(body.get("location") or headers.get(wire.LOCATION) or "")
        if not location:
            raise InvokeError(
                202, "MalformedAnswer", "the gateway's 202 names no location", invocation_id=inv
            )
        try:
            return AsyncInvocation(
                invocationId=inv,
                state=InvocationState(str(body.get("state") or InvocationState.Queued.value)),
                location=urllib.parse.urljoin(url, location),
            )
        except ValueError as e:
            raise InvokeError(
                202, "MalformedAnswer", "the gateway's 202 did not parse", invocation_id=inv
            ) from e
    if status == 200:  # a gateway that does not take Prefer: respond-async ran it at once
        raise InvokeError(
            200,
            "NotAccepted",
            "the gateway ran the invocation synchronously: it does not serve async invocations",
            invocation_id=inv,
        )
    raise refusal(status, headers, body, inv)


def parse_status(status: int, headers: Any, raw: bytes, *, inv: str) -> Invocation:
    """GET …/invocations/{id}: 200 with the InvocationStatus, else the typed error."""
    body = _body(raw)
    if status == 200:
        try:
            return Invocation.model_validate(body)
        except ValueError as e:
            raise InvokeError(
                200, "MalformedAnswer", "the gateway's invocation status did not parse", invocation_id=inv
            ) from e
    raise refusal(status, headers, body, inv)


def parse_page(status: int, headers: Any, raw: bytes) -> tuple[builtins.list[Invocation], str]:
    """GET …/invocations: 200 with `items` and the `continue` token of the next page ("" at the end)."""
    body = _body(raw)
    if status != 200:
        raise refusal(status, headers, body, "")
    items = body.get("items")
    token = body.get("continue") or ""
    if not isinstance(items, builtins.list) or not isinstance(token, str):
        raise InvokeError(
            200, "MalformedAnswer", "the gateway's invocation list did not parse", invocation_id=""
        )
    try:
        return [Invocation.model_validate(item) for item in items], token
    except ValueError as e:
        raise InvokeError(
            200, "MalformedAnswer", "the gateway's invocation list did not parse", invocation_id=""
        ) from e


class Invocations:
    """The async invocation calls (Client.invocations; Client.invoke_async submits)."""

    def __init__(self, runs: Runs, functions: Functions, invoker: Invoker) -> None:
        self._runs = runs
        self._functions = functions
        self._invoker = invoker

    def through(self, invoker: Invoker) -> Invocations:
        """The same calls sent through another HTTPS session (another caller's token): targets are
        still looked up with this client's credentials."""
        return Invocations(self._runs, self._functions, invoker)

    # -- where ---------------------------------------------------------------------------------------

    async def endpoint(
        self,
        target: InvocationTarget,
        *,
        namespace: str = "default",
        function: bool = False,
        submit: bool = False,
    ) -> str:
        """The target's invoke URL. A Run need not be Ready (an async invocation waits for it), but
        a task or a Run that has ended takes none (`submit`); reads take any Run still known."""
        if isinstance(target, AsyncInvocation):
            return target.location
        if isinstance(target, Endpoint):
            return target.url
        if isinstance(target, str) and target.startswith(("https://", "http://")):
            return target
        if isinstance(target, Function):
            return await self._function_url(target.metadata.name, target.metadata.namespace, target)
        if function:
            if not isinstance(target, str):
                raise ConfigError("function=True takes a Function's name")
            return await self._function_url(target, namespace, None)
        if isinstance(target, RunStatus):
            if target.endpoint is None:
                raise NotReady(
                    503, "RunNotReady", "the run has no endpoint", invocation_id="", retry_after=1.0
                )
            return target.endpoint.url
        if isinstance(target, str):
            known = await self._runs.status(target, namespace)  # one query, as a sync invoke's
            if known.endpoint is not None and not (submit and is_terminal(known.phase)):
                return known.endpoint.url
            run: Run = await self._runs.get(target, namespace)
        elif target.status is None or target.status.endpoint is None:  # it may have one by now
            run = await self._runs.get(target.metadata.name, target.metadata.namespace)
        else:
            run = target
        label = f"run {run.metadata.name!r}"
        if run.spec.mode.kind == "task":
            raise FunctionNotFound(
                404, "NotAFunction", f"{label} is a task, not a function", invocation_id=""
            )
        status = run.status or RunStatus()
        if submit and is_terminal(status.phase):
            raise FunctionNotFound(
                404, "RunFinished", f"{label} has ended {status.phase.value}", invocation_id=""
            )
        if status.endpoint is not None:
            return status.endpoint.url
        gateway, uid = self._runs.config.gatewayUrl, run.metadata.uid
        if not gateway or not uid:
            phase = status.phase if status.phase else RunPhase.Pending
            raise NotReady(
                503, "RunNotReady", f"{label} is {phase.value}, not Ready", invocation_id="", retry_after=1.0
            )
        return invoke_url(
            gateway,
            namespace=Namespace(run.metadata.namespace),
            runtime=RuntimeName(run.spec.runtime),
            run_uid=RunUid(uid),
        )

    async def _function_url(self, name: str, namespace: str, known: Function | None) -> str:
        if known is not None and known.status is not None and known.status.endpoint is not None:
            return known.status.endpoint.url
        uid = str(known.metadata.uid or "") if known is not None else ""
        if not uid:
            got = await self._functions.get(name, namespace)
            if got.status.endpoint is not None:
                return got.status.endpoint.url
            uid = got.uid
        gateway = self._runs.config.gatewayUrl
        if not gateway:
            raise ConfigError("the client config names no gatewayUrl (KRT_GATEWAY_URL)")
        return function_invoke_url(gateway, namespace=Namespace(namespace), function_uid=uid)

    async def _one(
        self, target: InvocationTarget, invocation_id: str | None, *, namespace: str, function: bool
    ) -> tuple[str, str]:
        """(the invocation's URL, its id) for a target and an id, or a location alone."""
        if isinstance(target, AsyncInvocation):
            return target.location, target.invocationId
        if invocation_id is None:
            found = _location_of(target) if isinstance(target, str) else None
            if found is None or not isinstance(target, str):
                raise ConfigError("an invocation id is needed, or the invocation's location URL")
            return target, found[1]
        _checked_id(invocation_id)
        url = await self.endpoint(target, namespace=namespace, function=function)
        return invocation_url(invocations_url(url), invocation_id), invocation_id

    # -- calls ---------------------------------------------------------------------------------------

    async def submit(
        self,
        target: InvocationTarget,
        data: Any = None,
        *,
        namespace: str = "default",
        function: bool = False,
        invocation_id: str | None = None,
        timeout: float | None = None,
        callback_url: str | None = None,
    ) -> AsyncInvocation:
        """Submit one async invocation; answered once it is recorded. The same id with the same
        body (and callback URL) again answers the same invocation (it runs once); with another
        body or callback URL InvocationConflict. ``callback_url``: where its status is POSTed when
        it ends, in place of the target's callback (an https URL whose origin the gateway allows
        the namespace: else Unauthorized with the reason CallbackNotAllowed)."""
        if isinstance(target, AsyncInvocation):
            raise ConfigError("submit takes a Run or a Function, not an invocation")
        inv = _checked_id(invocation_id) if invocation_id is not None else str(uuid.uuid4())
        if callback_url is not None:
            _check_callback_url(callback_url, inv)
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
        headers = {
            wire.INVOCATION_ID: inv,
            "Content-Type": "application/json",
            wire.PREFER: wire.RESPOND_ASYNC,
        }
        if timeout is not None:
            headers[wire.TIMEOUT] = f"{timeout:g}"
        if callback_url is not None:
            headers[wire.CALLBACK_URL] = callback_url
        url = await self.endpoint(target, namespace=namespace, function=function, submit=True)
        status, answered, raw = await self._invoker.exchange("POST", url, body=body, headers=headers, inv=inv)
        return parse_accepted(status, answered, raw, url=url, inv=inv)

    async def get(
        self,
        target: InvocationTarget,
        invocation_id: str | None = None,
        *,
        namespace: str = "default",
        function: bool = False,
    ) -> Invocation:
        """An invocation's status: by its target and id, or by its location (or the
        AsyncInvocation the submission answered). InvocationNotFound once forgotten."""
        url, inv = await self._one(target, invocation_id, namespace=namespace, function=function)
        status, headers, raw = await self._invoker.exchange("GET", url, inv=inv)
        return parse_status(status, headers, raw, inv=inv)

    async def wait(
        self,
        target: InvocationTarget,
        invocation_id: str | None = None,
        *,
        namespace: str = "default",
        function: bool = False,
        timeout: float | None = 60.0,
    ) -> Invocation:
        """Read the invocation until it has ended (Succeeded, Failed or Unknown) and return that
        status; a Failed or Unknown one is returned too, not raised. Reads back off from
        FIRST_POLL_S to MAX_POLL_S; a read refused for now (429, 503) is read again after its
        Retry-After, and one the gateway did not answer (restarting, say) is read again too: the
        invocation runs on without it. WaitTimeout after `timeout` seconds (MAX_WAIT_S when None)."""
        url, inv = await self._one(target, invocation_id, namespace=namespace, function=function)
        bound = min(timeout, MAX_WAIT_S) if timeout is not None else MAX_WAIT_S
        deadline = time.monotonic() + bound
        pause, last, missed = FIRST_POLL_S, None, ""
        while True:
            try:
                status, headers, raw = await self._invoker.exchange("GET", url, inv=inv)
                last, missed = parse_status(status, headers, raw, inv=inv), ""
            except (Busy, NotReady) as e:  # AsyncUnavailable, a gateway shedding load: read again
                pause, missed = max(pause, min(e.retry_after, MAX_POLL_S)), str(e)
            except ConfigError as e:
                if not unreachable(e):
                    raise
                missed = str(e)
            else:
                if last.done:
                    return last
            left = deadline - time.monotonic()
            if left <= 0:
                where = f"still {last.state.value}" if last is not None else "not read"
                raise WaitTimeout(
                    f"invocation {inv!r} is {where} after {bound:g} s"
                    + (f" (last read: {missed})" if missed else "")
                )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 1.5, MAX_POLL_S)

    async def list(
        self,
        target: InvocationTarget,
        *,
        state: InvocationState | States | None = None,
        namespace: str = "default",
        function: bool = False,
        limit: int | None = DEFAULT_LIMIT,
        page_size: int = 100,
    ) -> AsyncIterator[Invocation]:
        """The target's invocations still remembered (of one state: `state="Failed"` is the
        dead-letter view), newest first, a page at a time; at most `limit` of them."""
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be within 1..{MAX_PAGE_SIZE}")
        wanted = InvocationState(state) if state is not None else None
        collection = invocations_url(await self.endpoint(target, namespace=namespace, function=function))
        token, given = "", 0
        while limit is None or given < limit:
            size = page_size if limit is None else min(page_size, limit - given)
            query = {"limit": str(size)}
            if wanted is not None:
                query["state"] = wanted.value
            if token:
                query["continue"] = token
            url = f"{collection}?{urllib.parse.urlencode(query)}"
            status, headers, raw = await self._invoker.exchange("GET", url)
            items, token = parse_page(status, headers, raw)
            for item in items[:size]:
                yield item
                given += 1
            if not token or not items:
                return

    async def resubmit(
        self,
        target: InvocationTarget,
        invocation_id: str | None = None,
        new_id: str | None = None,
        *,
        namespace: str = "default",
        function: bool = False,
    ) -> AsyncInvocation:
        """Submit an invocation's body again under a new id (a uuid4 unless given): a new
        invocation, run once as any. The old one stays as it ended."""
        url, inv = await self._one(target, invocation_id, namespace=namespace, function=function)
        fresh = _checked_id(new_id, flag="new id") if new_id is not None else str(uuid.uuid4())
        status, headers, raw = await self._invoker.exchange(
            "POST", f"{url}:resubmit", headers={wire.INVOCATION_ID: fresh}, inv=fresh
        )
        return parse_accepted(status, headers, raw, url=url, inv=fresh)
