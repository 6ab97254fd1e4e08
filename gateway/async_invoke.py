"""Async invocations at the gateway (issue #44, docs/async-invocations.md): accept, read, list,
resubmit.

    POST …:invoke  with `Prefer: respond-async`   accept: 202 once Temporal recorded it
    GET  …/invocations/{id}                       its InvocationStatus (the workflow's memo)
    GET  …/invocations?state=&limit=&continue=    the target's invocations (visibility)
    POST …/invocations/{id}:resubmit              a new invocation with the same body

`…` is a Run's invoke URL (`/v1/namespaces/{ns}/runtimes/{runtime}/functions/{uid}`) or a
Function's (`/v1/namespaces/{ns}/functions/{uid}`).

An accept is a sync invoke's front half, with the sync path's own code (gateway/invoke.py,
gateway/function_invoke.py): the invocation id, the target's lookup and its 404 / 503 answers,
the authorization (`get` on the target), the body's bounds; a Run that exists but is not Ready yet
is accepted (its workflow waits for it). Then the backlog: the Queued invocations of the target and
of the namespace, counted by visibility (CountWorkflowExecutions, cached for BACKLOG_CACHE_S and
counted up by this gateway's own accepts meanwhile), against the target's bound (the smaller of
its asyncInvocations.backlog, as its hosts' heartbeats carry it, and `--max-async-target-backlog`)
and `--max-async-backlog` (429 AsyncBacklogFull). Then one InvocationWorkflow is started over the
gateway's raw channel to Temporal (gateway/visibility.py): id `invocation/{ns}/{uid}/{id}`,
conflict policy USE_EXISTING (a running one of that id is kept, never a second), reuse policy
ALLOW_DUPLICATE (an id forgotten after its retention may be used again), its input (the
InvocationInput as the workers' pydantic converter reads it) and the request's digest in the memo
(the body's SHA-256, or with a per-request callback URL that digest's and the URL's:
`request_identity`; gateway/callback_origins.py checks the URL and its origin first) sealed with the
platform's codec keys, the search attributes KrtNamespace, KrtPhase=Queued and
KrtRunUid (with KrtRuntime) or KrtFunction. A running workflow of that id with the same digest is
the same invocation (202, the same Location, its state now); with another, 409
InvocationConflict. 202 only once
the start returned; Temporal not answering is 503 AsyncUnavailable (nothing recorded, the same id
may be sent again).

Reads authorize `get` on the target (its name as the gateway knows it, from its routes or its
views of Temporal; a target it knows nothing of any more, a Run that ended, is asked about by
namespace alone), then read the workflow (DescribeWorkflowExecution: its memo, no worker needed);
a workflow that is not running any more has been forgotten (404). Every identifier is checked
before it is used (the namespace and runtime as DNS-1123 labels, uids canonical, the invocation id
printable ASCII of at most 128 bytes, `state` one of the states, `limit` at most MAX_LIST,
`continue` bounded base64url); every call to Temporal has a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from aiohttp import web

from kruntimes.api.names import is_run_uid, validate_dns1123_label, validate_invocation_id
from kruntimes.gateway.auth import FUNCTIONS, RUNS, Authorizer, Forbidden, Principal, Resource, bearer_token
from kruntimes.gateway.callback_origins import CallbackOrigins, InvalidCallbackUrl, parse_callback_url
from kruntimes.gateway.errors import (
    AsyncUnavailable,
    BacklogFull,
    BadRequest,
    CallbackNotAllowed,
    Conflict,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    RunNotReady,
)
from kruntimes.gateway.function_invoke import FunctionInvokeHandler
from kruntimes.gateway.invoke import (
    INVOCATION_ID,
    InvokeHandler,
    invocation_id,
    read_body,
    requested_timeout_s,
)
from kruntimes.gateway.listener import HttpLimits
from kruntimes.gateway.visibility import CallError, Visibility
from kruntimes.rpc.v1 import visibility_pb2 as pb
from kruntimes.rpc.v1 import workflow_start_pb2 as start_pb
from kruntimes.temporal.known_runs import keyword
from kruntimes.temporal.sealing import CodecError
from kruntimes.wire import headers, search
from kruntimes.wire import invocations as names
from kruntimes.wire.reasons import GatewayReason as R

log = logging.getLogger("kruntimes.gateway.async")

DEFAULT_MAX_TARGET_BACKLOG = 10_000  # Queued invocations of one target (`--max-async-target-backlog`)
DEFAULT_MAX_BACKLOG = 100_000  # Queued invocations of one namespace (`--max-async-backlog`)
# A backlog's count is read again after this long; accepts meanwhile are counted here.
BACKLOG_CACHE_S = 1.0
MAX_BACKLOG_KEYS = 10_000  # counts cached at most (targets and namespaces); the oldest go first
# Async requests one gateway serves at once (each holds Temporal calls of up to 10 s); past it,
# 503 AsyncUnavailable at once rather than a queue of calls on Temporal.
MAX_IN_FLIGHT = 1_024
MAX_LIST = 1_000
DEFAULT_LIST = 100
# Executions asked of Temporal a page: each carries its status memo (a result of up to about a
# MiB), so a page stays under the channel's receive bound.
LIST_PAGE = 50
MAX_CONTINUE_CHARS = 4_096
# Temporal refuses a payload over its blob size limit (2 MiB by default): a body that JSON-escapes
# past this is 413 before the start, not a refusal after it.
MAX_RECORDED_INPUT_BYTES = 2 * 1024 * 1024 - 64 * 1024
MAX_STATUS_BYTES = 4 * 1024 * 1024  # a status memo read (a result is at most ~1.06 MiB of it)
ALLOW_DUPLICATE = 1  # temporal.api.enums.v1.WorkflowIdReusePolicy
USE_EXISTING = 2  # temporal.api.enums.v1.WorkflowIdConflictPolicy
NORMAL_QUEUE = 1  # temporal.api.enums.v1.TaskQueueKind
RUNNING = 1  # temporal.api.enums.v1.WorkflowExecutionStatus
STARTED_EVENT = 1  # temporal.api.enums.v1.EventType.WORKFLOW_EXECUTION_STARTED
JSON_PLAIN = b"json/plain"
RUN, FUNCTION = "Run", "Function"  # kruntimes.contracts.invocation.TargetKind


@dataclass(frozen=True, slots=True)
class Target:
    """A Run or a Function as an async invocation names it (every field validated)."""

    kind: str  # RUN or FUNCTION
    namespace: str
    uid: str
    name: str = ""  # "" when the gateway does not know it (a Run that ended)
    runtime: str = ""  # a Run's; "" for a Function

    @property
    def resource(self) -> Resource:
        kind = FUNCTIONS if self.kind == FUNCTION else RUNS
        return Resource(namespace=self.namespace, name=self.name, run_uid=self.uid, kind=kind)

    @property
    def path(self) -> str:
        """The target's URL path (its invocations are under it)."""
        if self.kind == FUNCTION:
            return f"/v1/namespaces/{self.namespace}/functions/{self.uid}"
        return f"/v1/namespaces/{self.namespace}/runtimes/{self.runtime}/functions/{self.uid}"

    @property
    def uid_attribute(self) -> str:
        return search.FUNCTION if self.kind == FUNCTION else search.RUN_UID

    def listed(self, state: str | None = None) -> str:
        """The visibility query of its invocations still remembered (of one state)."""
        return search.invocations_listed(
            namespace=self.namespace, target_kind=self.kind, target_uid=self.uid, state=state
        )

    def workflow_id(self, inv: str) -> str:
        return names.invocation_workflow_id(self.namespace, self.uid, inv)

    def location(self, inv: str) -> str:
        return f"{self.path}/invocations/{quote(inv, safe='')}"

    def as_json(self) -> dict[str, str]:
        """kruntimes.contracts.invocation.Target, in its field order."""
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "runtime": self.runtime,
        }


def _iso(moment: datetime) -> str:
    """A UTC time as pydantic writes an AwareDatetime ("…Z")."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def input_json(
    target: Target,
    inv: str,
    *,
    digest: str,
    body: str,
    timeout_s: float | None,
    accepted_at: datetime,
    caller: str,
    callback_url: str | None = None,
) -> bytes:
    """The InvocationInput (kruntimes.contracts.invocation) as the workers' pydantic converter
    encodes one: the fields a new invocation sets, in the contract's order, compact, UTF-8 (the
    others keep their defaults; tests/contracts/async_names_test.py)."""
    document = {
        "target": target.as_json(),
        "invocationId": inv,
        "bodySha256": digest,
        "body": body,
        "timeoutSeconds": timeout_s,
        "acceptedAt": _iso(accepted_at),
        "caller": caller,
        "callbackUrl": callback_url,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def _json_payload(data: bytes) -> pb.VisiblePayload:
    return pb.VisiblePayload(metadata={"encoding": JSON_PLAIN}, data=data)


def _keyword(value: str) -> pb.VisiblePayload:
    return pb.VisiblePayload(
        metadata={"encoding": JSON_PLAIN, "type": b"Keyword"}, data=json.dumps(value).encode()
    )


def _unavailable(error: CallError, what: str) -> AsyncUnavailable:
    if not error.unreachable:  # Temporal answered and refused: the platform's setup, not load
        log.error("Temporal refused the gateway's call", extra={"call": what, "error": str(error)})
    else:
        log.warning("Temporal could not be asked", extra={"call": what, "error": str(error)})
    return AsyncUnavailable(f"Temporal could not {what} the invocation; nothing was recorded, retry later")


def _not_found() -> NotFound:
    return NotFound("no such invocation of this target", reason=R.INVOCATION_NOT_FOUND)


@dataclass(slots=True)
class _Count:
    count: int
    at: float
    added: int = 0  # accepted here since it was counted


class Backlog:
    """The Queued invocations of a target and of a namespace, against their bounds. A count is
    visibility's (CountWorkflowExecutions) at most BACKLOG_CACHE_S old plus this gateway's accepts
    since; concurrent misses of one key share one count."""

    def __init__(self, *, per_target: int, per_namespace: int, cache_s: float = BACKLOG_CACHE_S) -> None:
        self.per_target = per_target
        self.per_namespace = per_namespace
        self.cache_s = cache_s
        self._counts: dict[tuple[str, ...], _Count] = {}
        self._pending: dict[tuple[str, ...], asyncio.Future[int]] = {}

    @staticmethod
    def _query(namespace: str, target: Target | None) -> str:
        if target is not None:
            return target.listed(names.QUEUED)
        queued = f"{search.PHASE}='{names.QUEUED}'"
        return f"{search.INVOCATIONS_LISTED} AND {search.NAMESPACE}='{namespace}' AND {queued}"

    async def admit(self, temporal: Visibility, target: Target, own: int = 0) -> tuple[_Count, ...]:
        """A place in both backlogs, reserved until `release` (counted meanwhile, so requests at
        once cannot all take the last one); BacklogFull (429) or AsyncUnavailable (503).
        `own`: the target's asyncInvocations.backlog (0: not known, the gateway's bound alone)."""
        bound = min(own, self.per_target) if own > 0 else self.per_target
        queued = await self._count(temporal, ("target", target.namespace, target.uid), target)
        if queued >= bound:
            raise BacklogFull(
                f"the target has {bound} or more invocations waiting; nothing was recorded, retry later"
            )
        queued = await self._count(temporal, ("namespace", target.namespace), None, target.namespace)
        if queued >= self.per_namespace:
            raise BacklogFull(
                f"the namespace has {self.per_namespace} or more invocations waiting; nothing was "
                "recorded, retry later"
            )
        keys = (("target", target.namespace, target.uid), ("namespace", target.namespace))
        held = tuple(count for count in map(self._counts.get, keys) if count is not None)
        for count in held:
            count.added += 1
        return held

    @staticmethod
    def release(held: tuple[_Count, ...]) -> None:
        """The places `admit` reserved, given back (a start that recorded was counted by `accepted`)."""
        for count in held:
            count.added -= 1

    def accepted(self, target: Target) -> None:
        """An invocation of `target` was recorded here: counted until the next count."""
        for key in (("target", target.namespace, target.uid), ("namespace", target.namespace)):
            held = self._counts.get(key)
            if held is not None:
                held.added += 1

    async def _count(
        self, temporal: Visibility, key: tuple[str, ...], target: Target | None, namespace: str = ""
    ) -> int:
        now = time.monotonic()
        held = self._counts.get(key)
        if held is not None and now - held.at < self.cache_s:
            return held.count + held.added
        pending = self._pending.get(key)
        if pending is None:
            query = self._query(target.namespace if target is not None else namespace, target)
            pending = asyncio.ensure_future(temporal.count(query))
            self._pending[key] = pending
            pending.add_done_callback(functools.partial(self._counted, key))
        try:
            return await asyncio.shield(pending)
        except CallError as e:
            raise _unavailable(e, "count the backlog of") from None

    def _counted(self, key: tuple[str, ...], done: asyncio.Future[int]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:  # retrieved: never "not retrieved"
            return
        self._counts.pop(key, None)
        if len(self._counts) >= MAX_BACKLOG_KEYS:
            self._counts.pop(next(iter(self._counts)))
        self._counts[key] = _Count(done.result(), time.monotonic())


class AsyncInvocations:
    """The async API's handlers, over the sync path's handlers (their lookups and answers) and
    the gateway's Temporal channel (None: no Temporal configured, every async call is 503)."""

    def __init__(
        self,
        *,
        runs: InvokeHandler,
        functions: FunctionInvokeHandler,
        authorizer: Authorizer,
        temporal: Visibility | None,
        limits: HttpLimits | None = None,
        max_target_backlog: int = DEFAULT_MAX_TARGET_BACKLOG,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        callback_origins: CallbackOrigins | None = None,
    ) -> None:
        self.runs = runs
        self.functions = functions
        self.authorizer = authorizer
        self.temporal = temporal
        self.limits = limits or HttpLimits()
        self.backlog = Backlog(per_target=max_target_backlog, per_namespace=max_backlog)
        self.max_in_flight = MAX_IN_FLIGHT
        self._in_flight = 0
        # the origins a per-request callback may name, per namespace (None: none anywhere)
        self.callback_origins = callback_origins

    def _temporal(self) -> Visibility:
        if self.temporal is None:
            raise AsyncUnavailable("this gateway has no Temporal connection (krt gateway --temporal-address)")
        return self.temporal

    # -- the handlers (aiohttp) -------------------------------------------------------------------

    def handlers(self, kind: str) -> dict[str, Callable[[web.Request], Awaitable[web.Response]]]:
        """The handlers of a Run's (RUN) or a Function's (FUNCTION) URLs, by operation, each
        within the gateway's bound of async requests in flight."""
        operations = {"get": self.get, "list": self.list, "resubmit": self.resubmit}
        handlers = {name: self._bounded(operation, kind) for name, operation in operations.items()}
        # an accept takes its place once its body is read: a body may take minutes to arrive (the
        # rate rules allow it), and one caller's slow bodies must not hold every other's places
        return {"accept": functools.partial(self.accept, kind=kind), **handlers}

    @contextlib.contextmanager
    def _place(self) -> Iterator[None]:
        """One of the gateway's places for async requests talking to Temporal."""
        if self._in_flight >= self.max_in_flight:
            raise AsyncUnavailable(
                "the gateway serves as many async requests at once as it may; nothing was recorded, "
                "retry later"
            )
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def _bounded(
        self, operation: Callable[[web.Request, str], Awaitable[web.Response]], kind: str
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            with self._place():
                return await operation(request, kind)

        return handler

    async def accept(self, request: web.Request, kind: str) -> web.Response:
        inv = _new_id(request)
        request[INVOCATION_ID] = inv
        callback = requested_callback(request)
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        target = await self._existing_target(request, token, kind)
        principal = await self.authorizer.authorize(token, target.resource)
        callback_url = self._allowed_callback(target, callback)
        timeout_s = requested_timeout_s(request) if headers.TIMEOUT in request.headers else None
        temporal = self._temporal()
        # before the body: a refusal reads none of it
        with self._place():
            held = await self.backlog.admit(temporal, target, self._own_backlog(target))
        try:
            payload = await read_body(request, self.limits)
            try:
                body = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(
                    "an async invocation's body must be UTF-8", reason=R.MALFORMED_JSON
                ) from None
            digest = hashlib.sha256(payload).hexdigest()
            with self._place():
                state = await self._start(
                    temporal,
                    target,
                    inv,
                    digest=digest,
                    body=body,
                    timeout_s=timeout_s,
                    principal=principal,
                    callback_url=callback_url,
                )
        finally:
            self.backlog.release(held)
        return self._accepted(target, inv, state)

    async def get(self, request: web.Request, kind: str) -> web.Response:
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        inv = self._path_id(request)
        target = await self._read_target(request, token, kind)
        execution = await self._running(self._temporal(), target, inv)
        status = self._status(self._temporal(), execution, target, inv)
        return web.Response(
            body=status, content_type="application/json", headers={headers.INVOCATION_ID: inv}
        )

    async def list(self, request: web.Request, kind: str) -> web.Response:
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        target = await self._read_target(request, token, kind)
        state, limit, token_bytes = _list_query(request)
        temporal = self._temporal()
        query = target.listed(state or None)
        if target.kind == RUN:  # of the URL's runtime only, as a read of one checks (a checked label)
            query += f" AND {search.RUNTIME}='{target.runtime}'"
        items: list[dict[str, Any]] = []
        for asked in range(MAX_LIST // LIST_PAGE + 1):  # pages asked at most (each up to LIST_PAGE)
            if len(items) >= limit:
                break
            try:
                page = await temporal.list_recorded(
                    query, token_bytes, page_size=min(LIST_PAGE, limit - len(items))
                )
            except CallError as e:
                # a token of the caller's that Temporal cannot read (the dev server says UNKNOWN):
                # the caller's mistake, never "retry later"
                callers = asked == 0 and bool(token_bytes)
                if callers and e.code in ("INVALID_ARGUMENT", "UNKNOWN"):
                    raise BadRequest(
                        "`continue` is not a token of this list", reason=R.INVALID_REQUEST
                    ) from None
                raise _unavailable(e, "list") from None
            for execution in page.executions[: limit - len(items)]:
                item = self._list_item(temporal, execution, target)
                if item is not None:
                    items.append(item)
            token_bytes = page.next_page_token
            if not token_bytes or not page.executions:  # the end, or an empty page: the caller goes on
                break
        cont = base64.urlsafe_b64encode(token_bytes).decode() if token_bytes else ""
        return web.json_response({"items": items, "continue": cont})

    async def resubmit(self, request: web.Request, kind: str) -> web.Response:
        """The dead-letter resubmit: a new invocation (the caller's new id, or a generated one)
        with the body, timeout and callback of `{id}`, read from its workflow's first event."""
        if headers.CALLBACK_URL in request.headers:  # never silently another URL than the caller named
            raise BadRequest(
                f"a resubmit keeps the callback URL recorded with the invocation; {headers.CALLBACK_URL} "
                "is for a new invocation (POST …:invoke)",
                reason=R.INVALID_CALLBACK_URL,
            )
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        old = self._path_id(request)
        inv = _new_id(request)
        request[INVOCATION_ID] = inv
        target = await self._existing_target(request, token, kind)
        principal = await self.authorizer.authorize(token, target.resource)
        temporal = self._temporal()
        await self._running(temporal, target, old)
        try:
            event = await temporal.first_event(target.workflow_id(old))
        except CallError as e:
            raise _unavailable(e, "read") from None
        if event is None or event.event_type != STARTED_EVENT:
            raise _not_found()
        recorded = self._input(temporal, event)
        if recorded is None:
            raise GatewayError("the invocation's recorded input cannot be read")
        body, timeout_s, callback_url = recorded
        held = await self.backlog.admit(temporal, target, self._own_backlog(target))
        digest = hashlib.sha256(body.encode()).hexdigest()
        try:
            state = await self._start(
                temporal,
                target,
                inv,
                digest=digest,
                body=body,
                timeout_s=timeout_s,
                principal=principal,
                callback_url=callback_url,
            )
        finally:
            self.backlog.release(held)
        return self._accepted(target, inv, state)

    # -- targets ----------------------------------------------------------------------------------

    async def _existing_target(self, request: web.Request, token: str, kind: str) -> Target:
        """The target of an accept, as a sync invoke finds it (its 404 and 503 answers, with the
        sync path's authentication first); a Run that exists and is not Ready yet is taken."""
        namespace = request.match_info["namespace"]
        uid = request.match_info["uid"]
        if kind == FUNCTION:
            seen, known = self.functions.lookup(uid, namespace)
            if seen is None and known is None:
                error = self.functions.unknown(uid)
                unknown = Resource(namespace=namespace, name="", run_uid="", kind=FUNCTIONS)
                if isinstance(error, NotFound):  # the same 404 whatever the caller may see
                    with contextlib.suppress(Forbidden):
                        await self.authorizer.authorize(token, unknown)
                else:
                    await self.authorizer.authorize(token, unknown)
                raise error
            name = known.name if known is not None else seen.name if seen is not None else ""
            return Target(FUNCTION, namespace, uid, name)
        runtime = request.match_info["runtime"]
        route = await self.runs.find_route(namespace, runtime, uid)
        if route is not None:
            return Target(RUN, route.namespace, route.run_uid, route.name, route.runtime)
        error, name = self.runs.missing(namespace, runtime, uid)
        if isinstance(error, RunNotReady) and name:  # it exists: its invocations wait for it
            return Target(RUN, namespace, uid, name, runtime)
        await self.runs._miss(token, namespace, runtime, uid)  # raises the sync answer
        raise error  # (not reached)

    async def _read_target(self, request: web.Request, token: str, kind: str) -> Target:
        """The target of a read, its ids checked and the caller allowed to `get` it. Its name is
        the one the gateway knows (a Run that ended is asked about by namespace alone)."""
        namespace = request.match_info["namespace"]
        uid = request.match_info["uid"]
        runtime = request.match_info.get("runtime", "")
        try:
            validate_dns1123_label(namespace, field="namespace")
            if kind == RUN:
                validate_dns1123_label(runtime, field="runtime")
            valid = is_run_uid(uid)
        except ValueError:
            valid = False
        resource_kind = FUNCTIONS if kind == FUNCTION else RUNS
        if not valid:  # never a key or a query: the same 404 whatever the caller may see
            with contextlib.suppress(Forbidden):
                await self.authorizer.authorize(
                    token, Resource(namespace=namespace, name="", run_uid="", kind=resource_kind)
                )
            raise _not_found()
        name = ""
        if kind == FUNCTION:
            seen, known = self.functions.lookup(uid, namespace)
            name = known.name if known is not None else seen.name if seen is not None else ""
        else:
            route = self.runs.routes.route(uid)
            if route is not None and route.namespace == namespace and route.runtime == runtime:
                name = route.name
            else:
                found = self.runs.known.get(uid)
                if found is not None and found.namespace == namespace and found.runtime == runtime:
                    name = found.name
        target = Target(kind, namespace, uid, name, runtime if kind == RUN else "")
        await self.authorizer.authorize(token, target.resource)
        return target

    def _allowed_callback(self, target: Target, callback: str | None) -> str | None:
        """The request's callback URL (checked by `requested_callback`) if the target's namespace
        may name its origin; CallbackNotAllowed (403, naming the origin only) otherwise."""
        if callback is None:
            return None
        url = parse_callback_url(callback)  # checked already: cannot fail here
        if self.callback_origins is None:
            raise CallbackNotAllowed(
                "this gateway takes no per-request callback URL: its operator has not allowed any "
                "origin (krt gateway --callback-origins); use the target's asyncInvocations.callback"
            )
        if not self.callback_origins.allows(target.namespace, url):
            raise CallbackNotAllowed(
                f"the callback origin {url.origin} is not allowed for namespace {target.namespace} "
                "(krt gateway --callback-origins)"
            )
        return url.url

    def _own_backlog(self, target: Target) -> int:
        """The target's asyncInvocations.backlog as its hosts' heartbeats say it (a Run's route, a
        Function's Ready replicas'); 0 when none says it (not Ready yet, or hosts older than it)."""
        if target.kind == FUNCTION:
            return self.functions.routes.function_async_policy(target.uid)[0]
        route = self.runs.routes.route(target.uid)
        return route.async_backlog if route is not None and route.namespace == target.namespace else 0

    @staticmethod
    def _path_id(request: web.Request) -> str:
        """The path's invocation id (aiohttp decoded its percent-encoding), checked."""
        try:
            inv = validate_invocation_id(request.match_info["id"])
        except ValueError as exc:
            raise BadRequest(str(exc), reason=R.INVALID_INVOCATION_ID) from None
        request[INVOCATION_ID] = inv
        return inv

    # -- Temporal ---------------------------------------------------------------------------------

    async def _start(
        self,
        temporal: Visibility,
        target: Target,
        inv: str,
        *,
        digest: str,
        body: str,
        timeout_s: float | None,
        principal: Principal,
        callback_url: str | None = None,
    ) -> str:
        """Record the invocation (its workflow started, or the running one of its id kept): its
        state; Conflict when that one has another body or callback URL, AsyncUnavailable when not
        recorded."""
        workflow_id = target.workflow_id(inv)
        identity = request_identity(digest, callback_url)
        data = input_json(
            target,
            inv,
            digest=digest,
            body=body,
            timeout_s=timeout_s,
            accepted_at=datetime.now(UTC),
            caller=principal.user[:256],
            callback_url=callback_url,
        )
        if len(data) > MAX_RECORDED_INPUT_BYTES:
            raise PayloadTooLarge(
                f"the body, as recorded (JSON-escaped), is larger than {MAX_RECORDED_INPUT_BYTES} bytes"
            )
        attributes = {
            search.NAMESPACE: _keyword(target.namespace),
            search.PHASE: _keyword(names.QUEUED),
            target.uid_attribute: _keyword(target.uid),
        }
        if target.kind == RUN:
            attributes[search.RUNTIME] = _keyword(target.runtime)
        summary = f"{target.kind} {target.namespace}/{target.name or target.uid}: invocation {inv}"
        request = start_pb.StartWorkflowExecutionRequest(
            workflow_id=workflow_id,
            workflow_type=start_pb.WorkflowTypeName(name=names.INVOCATION_WORKFLOW),
            task_queue=start_pb.TaskQueueName(name=names.TASK_QUEUE, kind=NORMAL_QUEUE),
            input=start_pb.PayloadList(payloads=[temporal.seal(_json_payload(data))]),
            # a fresh one: Temporal answers a request id it saw on the id's current run (closed
            # too) with that run, so one derived from the id and body would make an id forgotten
            # after its retention "accepted" again without a run; USE_EXISTING keeps a start
            # sent again (a lost answer) to the one running, and its digest says whether it is it
            request_id=str(uuid.uuid4()),
            workflow_id_reuse_policy=ALLOW_DUPLICATE,
            workflow_id_conflict_policy=USE_EXISTING,
            memo=start_pb.RecordedMemo(
                fields={
                    names.INVOCATION_DIGEST_MEMO: temporal.seal(_json_payload(json.dumps(identity).encode()))
                }
            ),
            search_attributes=pb.VisibleSearchAttributes(indexed_fields=attributes),
            # plain, for the Temporal UI: names and the id only, never the body
            user_metadata=start_pb.RecordedUserMetadata(summary=_json_payload(json.dumps(summary).encode())),
        )
        for _ in range(2):  # a running one that ends between the start and the describe: once more
            try:
                answer = await temporal.start_workflow(request)
            except CallError as e:
                raise _unavailable(e, "record") from None
            if answer.started:
                self.backlog.accepted(target)
                return names.QUEUED
            try:
                existing = await temporal.describe(workflow_id)
            except CallError as e:
                raise _unavailable(e, "read") from None
            if existing is None or existing.status != RUNNING:
                continue
            if self._digest(temporal, existing) != identity:
                raise Conflict(
                    "an invocation of this id was accepted with another body or callback URL; it was "
                    "not run again (use a new invocation id)"
                )
            status = self._memo_json(temporal, existing, names.INVOCATION_STATUS_MEMO)
            state = status.get("state") if isinstance(status, dict) else None
            return state if state in names.STATES else names.QUEUED
        raise AsyncUnavailable("the invocation's id was in use and then not; nothing was recorded, retry")

    def _accepted(self, target: Target, inv: str, state: str) -> web.Response:
        location = target.location(inv)
        return web.json_response(
            {"invocationId": inv, "state": state, "location": location},
            status=202,
            headers={
                headers.LOCATION: location,
                headers.PREFERENCE_APPLIED: headers.RESPOND_ASYNC,
                headers.INVOCATION_ID: inv,
            },
        )

    async def _running(self, temporal: Visibility, target: Target, inv: str) -> start_pb.RecordedExecution:
        """The invocation's workflow, running and of this target; 404 otherwise."""
        try:
            execution = await temporal.describe(target.workflow_id(inv))
        except CallError as e:
            raise _unavailable(e, "read") from None
        if execution is None or execution.status != RUNNING or not self._of(execution, target):
            raise _not_found()
        return execution

    @staticmethod
    def _of(execution: start_pb.RecordedExecution, target: Target) -> bool:
        """Whether `execution` is an invocation of `target` (its type and search attributes)."""
        if execution.type.name != names.INVOCATION_WORKFLOW:
            return False
        fields = execution.search_attributes.indexed_fields

        def value(name: str) -> str | None:
            payload = fields.get(name)
            return None if payload is None else keyword(payload.metadata.get("encoding"), payload.data)

        if value(search.NAMESPACE) != target.namespace or value(target.uid_attribute) != target.uid:
            return False
        runtime = value(search.RUNTIME)
        return target.kind == FUNCTION or runtime is None or runtime == target.runtime

    def _memo_json(self, temporal: Visibility, execution: start_pb.RecordedExecution, name: str) -> Any:
        """The JSON value of the memo `name` (opened with the codec keys); None when there is none.
        One that cannot be read (not the workers' keys, not JSON) is the platform's fault: 500,
        logged, never taken for another state."""
        payload = execution.memo.fields.get(name)
        if payload is None:
            return None
        try:
            opened = temporal.open(payload)
            if opened.metadata.get("encoding") != JSON_PLAIN or len(opened.data) > MAX_STATUS_BYTES:
                raise ValueError("not a bounded json/plain payload")
            return json.loads(opened.data)
        except (CodecError, ValueError) as e:
            log.error("an invocation's memo cannot be read", extra={"memo": name, "error": str(e)[:300]})
            raise GatewayError(
                "the invocation's record cannot be read here (the gateway's codec keys are not the workers')"
            ) from None

    def _digest(self, temporal: Visibility, execution: start_pb.RecordedExecution) -> str | None:
        digest = self._memo_json(temporal, execution, names.INVOCATION_DIGEST_MEMO)
        return digest if isinstance(digest, str) else None

    def _status_doc(
        self, temporal: Visibility, execution: start_pb.RecordedExecution, target: Target, inv: str
    ) -> dict[str, Any]:
        """The workflow's InvocationStatus; before its first memo, Queued from what is known."""
        status = self._memo_json(temporal, execution, names.INVOCATION_STATUS_MEMO)
        if (
            isinstance(status, dict)
            and status.get("invocationId") == inv
            and status.get("state") in names.STATES
        ):
            return status
        return {
            "invocationId": inv,
            "target": target.as_json(),
            "state": names.QUEUED,
            "acceptedAt": _iso(execution.start_time.ToDatetime(tzinfo=UTC)),
            "startedAt": None,
            "endedAt": None,
            "expiresAt": None,
            "attempts": [],
            "attemptCount": 0,
            "result": None,
            "error": None,
            "retried": "",
            "callback": None,
        }

    def _status(
        self, temporal: Visibility, execution: start_pb.RecordedExecution, target: Target, inv: str
    ) -> bytes:
        return json.dumps(self._status_doc(temporal, execution, target, inv), ensure_ascii=False).encode()

    def _list_item(
        self, temporal: Visibility, execution: start_pb.RecordedExecution, target: Target
    ) -> dict[str, Any] | None:
        """A listed invocation's status without its result (GET it for that)."""
        prefix = target.workflow_id("")
        workflow_id = execution.execution.workflow_id
        if not workflow_id.startswith(prefix):
            return None
        try:
            inv = validate_invocation_id(workflow_id[len(prefix) :])
        except ValueError:
            return None
        status = self._status_doc(temporal, execution, target, inv)
        status.pop("result", None)
        return status

    def _input(
        self, temporal: Visibility, event: start_pb.RecordedEvent
    ) -> tuple[str, float | None, str | None] | None:
        """The body, timeout and callback URL of a recorded InvocationInput (None: unreadable)."""
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if len(payloads) != 1:
            return None
        try:
            opened = temporal.open(payloads[0])
            recorded = json.loads(opened.data) if opened.metadata.get("encoding") == JSON_PLAIN else None
        except (CodecError, ValueError) as e:
            log.error("a recorded invocation input cannot be read", extra={"error": str(e)[:300]})
            return None
        if not isinstance(recorded, dict) or not isinstance(recorded.get("body"), str):
            return None
        timeout_s = recorded.get("timeoutSeconds")
        callback_url = recorded.get("callbackUrl")
        return (
            recorded["body"],
            float(timeout_s)
            if isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
            else None,
            callback_url if isinstance(callback_url, str) else None,
        )


def request_identity(digest: str, callback_url: str | None) -> str:
    """What tells one request of an invocation id from another (the digest memo): the body's
    SHA-256 alone without a per-request callback (as before there was one), else the SHA-256 of
    that digest and the URL, so the same id with another callback URL is 409 like another body."""
    if callback_url is None:
        return digest
    return hashlib.sha256(f"{digest}\n{callback_url}".encode()).hexdigest()


def requested_callback(request: web.Request) -> str | None:
    """The request's X-Kruntime-Callback-URL, checked (400 InvalidCallbackURL, the message never
    quoting the URL); None without one."""
    values = request.headers.getall(headers.CALLBACK_URL, ())
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"one {headers.CALLBACK_URL} at most", reason=R.INVALID_CALLBACK_URL)
    try:
        parse_callback_url(values[0])
    except InvalidCallbackUrl as e:
        raise BadRequest(f"{headers.CALLBACK_URL}: {e}", reason=R.INVALID_CALLBACK_URL) from None
    return values[0]


def _new_id(request: web.Request) -> str:
    """A new invocation's id (the caller's, or generated): `.` and `..` are refused, since every
    client that follows RFC 3986 removes them from the invocation's path, encoded or not."""
    inv = invocation_id(request)
    if inv in (".", ".."):
        raise BadRequest(
            "an invocation id of only dots cannot be a URL path segment", reason=R.INVALID_INVOCATION_ID
        )
    return inv


def _list_query(request: web.Request) -> tuple[str, int, bytes]:
    """`state`, `limit` and `continue` of a list, each checked (400 InvalidRequest)."""
    query = request.rel_url.query
    state = query.get("state", "")
    if state and state not in names.STATES:
        raise BadRequest(f"state must be one of {', '.join(names.STATES)}", reason=R.INVALID_REQUEST)
    raw_limit = query.get("limit", str(DEFAULT_LIST))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST:
        raise BadRequest(f"limit must be a whole number in [1, {MAX_LIST}]", reason=R.INVALID_REQUEST)
    cont = query.get("continue", "")
    token = b""
    if cont:
        if len(cont) > MAX_CONTINUE_CHARS or not cont.isascii():
            raise BadRequest("`continue` is not a token of this list", reason=R.INVALID_REQUEST)
        try:
            token = base64.b64decode(cont.encode(), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("`continue` is not a token of this list", reason=R.INVALID_REQUEST) from None
    return state, int(raw_limit), token


__all__ = [
    "DEFAULT_MAX_BACKLOG",
    "DEFAULT_MAX_TARGET_BACKLOG",
    "FUNCTION",
    "RUN",
    "AsyncInvocations",
    "Backlog",
    "Target",
    "input_json",
    "request_identity",
    "requested_callback",
]
