"""The python adapter, running inside a function process forked from the zygote.

The handler is `module:function` resolved in the function's working directory. It takes the
decoded JSON payload, optionally a second `context` argument, may be sync or async, and returns a
JSON-serializable value: a dict with string keys is the outputs, anything else becomes
{"result": value}. Handler exceptions, SystemExit included, are results of one invocation; the
process stays warm for the next.

A process answers one invocation at a time, unless its handler is a coroutine function and the
server sends it tagged requests (its registration takes several invocations at once; it learns
from the ready frame that the handler is async): then each request is a task on the process's
event loop, answered with its tag whenever it ends, and what the handler prints through
sys.stdout and sys.stderr is routed (a context variable per task) to the answer of the
invocation that printed it. What is written to the descriptors directly is no invocation's.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import importlib
import inspect
import json
import os
import re
import socket
import sys
import traceback
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kruntimes.api import outputs as api_outputs
from kruntimes.api.limits import MAX_LOG_BYTES, MAX_OUTPUT_KEY_BYTES, MAX_OUTPUT_KEYS, MAX_OUTPUT_VALUE_BYTES
from kruntimes.runtime import framing

MAX_ERROR_MESSAGE = 4096
RECV_SIZE = 65536
HEADER_SIZE = framing.HEADER.size
_unpack_header = framing.HEADER.unpack_from


class LoadError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def load_handler(workdir: str, handler: str) -> Callable[..., Any]:
    module_name, _, func_name = handler.partition(":")
    if workdir not in sys.path:
        sys.path.insert(0, workdir)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        why = _import_error(exc, workdir)
        raise LoadError("HandlerImportError", f"cannot import {module_name!r}: {why}") from exc
    func = getattr(module, func_name, None)
    if func is None:
        raise LoadError("HandlerNotFound", f"module {module_name!r} has no attribute {func_name!r}")
    if not callable(func):
        raise LoadError("HandlerNotCallable", f"{handler!r} is not callable")
    return func  # type: ignore[no-any-return]


def _import_error(exc: BaseException, workdir: str) -> str:
    """Why the import failed, in the words a user acts on: the missing module's own message, a
    syntax error with its file and line, else the error and the line of the function's source
    that raised it (never the import machinery's frames or the workspace's path)."""
    if type(exc) is ModuleNotFoundError:
        text = str(exc)
    elif isinstance(exc, SyntaxError):
        where = f" ({os.path.basename(exc.filename)}, line {exc.lineno})" if exc.filename else ""
        return f"SyntaxError: {exc.msg}{where}"[:MAX_ERROR_MESSAGE]
    else:
        text = f"{type(exc).__name__}: {exc}"
    root = os.path.join(workdir, "")
    own = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(root)]
    if own:
        text += f" ({os.path.relpath(own[-1].filename, workdir)}, line {own[-1].lineno})"
    return text[:MAX_ERROR_MESSAGE]


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith(os.path.dirname(__file__))]
    if user:
        last = user[-1]
        text += f" (at {os.path.basename(last.filename)}:{last.lineno})"
    return text[:MAX_ERROR_MESSAGE]


def _takes_context(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


# What `api_outputs.encode_outputs` produces (json.dumps with these options), built once: the
# function process encodes every result with it and only falls back to the full checks when a
# result is not a small object with plain keys (the fallback also words the errors).
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
_PLAIN_KEY = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_OUTPUT_KEY_BYTES}}}")  # within the API's key rule
_PLAIN_RESULTS = (dict, list, str, int, float, bool, type(None))  # never awaitable


def encode_result(result: Any) -> tuple[int, bytes]:
    """A handler's return value as a RESULT frame body, or an ERROR one (InvalidOutput)."""
    if type(result) is dict:
        outputs: dict[Any, Any] | None = result if all(type(key) is str for key in result) else None
    else:  # a dict subclass is taken as outputs by the API too, but on the checked path below
        outputs = None if isinstance(result, dict) else {api_outputs.RESULT_KEY: result}
    if outputs is not None and len(outputs) <= MAX_OUTPUT_KEYS:
        try:
            data = _ENCODER.encode(outputs).encode()
        except (TypeError, ValueError, RecursionError):
            data = None
        if data is not None and len(data) <= MAX_OUTPUT_VALUE_BYTES:
            fullmatch = _PLAIN_KEY.fullmatch
            if all(fullmatch(key) for key in outputs):
                return framing.RESULT, data
    try:
        return framing.RESULT, api_outputs.encode_outputs(api_outputs.outputs_from_result(result))
    except (api_outputs.OutputsError, TypeError, ValueError) as exc:
        return framing.ERROR, _error("InvalidOutput", str(exc))


class Worker:
    def __init__(self, func: Callable[..., Any], context: dict[str, Any]) -> None:
        self.func = func
        self.with_context = _takes_context(func)
        self.is_async = inspect.iscoroutinefunction(func)
        self.loop = asyncio.new_event_loop() if self.is_async else None
        self.context = context

    def _start(self, invocation_id: str, payload: bytes) -> tuple[bool, Any]:
        """(True, what the handler returned) or (False, the error frame body) for bad JSON."""
        try:
            arg = json.loads(payload) if payload else None
        except ValueError as exc:
            return False, _error("InvalidPayload", f"payload is not JSON: {exc}")
        if self.with_context:
            return True, self.func(arg, SimpleNamespace(invocation_id=invocation_id, **self.context))
        return True, self.func(arg)

    def call(self, invocation_id: str, payload: bytes) -> tuple[int, bytes]:
        try:
            ok, result = self._start(invocation_id, payload)
            if not ok:
                return framing.ERROR, result
            if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                if self.loop is None:
                    self.loop = asyncio.new_event_loop()
                result = self.loop.run_until_complete(result)
        except BaseException as exc:
            return framing.ERROR, _error("HandlerError", _describe(exc))
        finally:
            _flush()
        return encode_result(result)

    async def call_async(self, invocation_id: str, payload: bytes) -> tuple[int, bytes]:
        """One invocation as a task of the process's loop (tagged requests)."""
        try:
            ok, result = self._start(invocation_id, payload)
            if not ok:
                return framing.ERROR, result
            if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            return framing.ERROR, _error("HandlerError", _describe(exc))
        return encode_result(result)


def _error(kind: str, message: str) -> bytes:
    return json.dumps({"type": kind, "message": message[:MAX_ERROR_MESSAGE]}).encode()


def _flush() -> None:
    """What the handler printed reaches the pipes before its answer reaches the socket."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the handler
            continue


class _Reader:
    """Frames from the control socket, usually one recv per request."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def frame(self) -> tuple[int, bytes] | None:
        if not self.buffer:  # the usual case: one recv holds exactly one frame
            chunk = self.sock.recv(RECV_SIZE)
            if not chunk:
                return None
            if len(chunk) >= HEADER_SIZE:
                size, kind = _unpack_header(chunk)
                if len(chunk) == HEADER_SIZE + size:
                    return kind, chunk[HEADER_SIZE:]
            self.buffer += chunk
        while True:
            if len(self.buffer) >= framing.HEADER.size:
                size, kind = framing.HEADER.unpack_from(self.buffer)
                end = framing.HEADER.size + size
                if len(self.buffer) >= end:
                    body = bytes(self.buffer[framing.HEADER.size : end])
                    del self.buffer[:end]
                    return kind, body
            chunk = self.sock.recv(max(RECV_SIZE, len(self.buffer)))
            if not chunk:
                return None
            self.buffer += chunk


class _Printed:
    """What one invocation printed to one stream: the first MAX_LOG_BYTES, and how much in all."""

    __slots__ = ("data", "total")

    def __init__(self) -> None:
        self.data = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = MAX_LOG_BYTES - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def part(self) -> tuple[int, bytes]:
        return self.total, bytes(self.data)


# the current task's invocation's (stdout, stderr) while tagged requests are served
_PRINTED: contextvars.ContextVar[tuple[_Printed, _Printed] | None] = contextvars.ContextVar(
    "krt_printed", default=None
)


class _Routed:
    """sys.stdout or sys.stderr while tagged requests are served: text printed by a task goes to
    its invocation's answer; anything else (no invocation's) to the stream it replaced."""

    def __init__(self, stream: Any, index: int) -> None:
        self._stream = stream
        self._index = index

    def write(self, text: str) -> int:
        printed = _PRINTED.get()
        if printed is None:
            return int(self._stream.write(text))
        printed[self._index].feed(text.encode("utf-8", "replace"))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _PRINTED.get() is None:
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Tagged:
    """Tagged requests served as tasks on the handler's loop, until the server closes the socket."""

    def __init__(self, sock: socket.socket, worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.worker = worker
        self.loop = loop
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.sending = asyncio.Lock()  # one answer at a time on the socket

    async def serve(self, first: bytes, buffered: bytearray) -> int:
        self.start(first)
        buffer = buffered
        while True:
            while True:
                got = framing.pop_frame(buffer, limit=1 << 31)
                if got is None:
                    break
                kind, body = got
                if kind == framing.INVOKE_TAGGED:
                    self.start(body)
                elif kind == framing.CANCEL:
                    task = self.tasks.get(framing.TAG.unpack_from(body)[0])
                    if task is not None:
                        task.cancel()
                else:
                    return 0
            chunk = await self.loop.sock_recv(self.sock, RECV_SIZE)
            if not chunk:
                return 0
            buffer += chunk

    def start(self, body: bytes) -> None:
        (tag,) = framing.TAG.unpack_from(body)
        invocation_id, payload = framing.decode_invoke(body[framing.TAG.size :])
        self.tasks[tag] = self.loop.create_task(self.run(tag, invocation_id, payload))

    async def run(self, tag: int, invocation_id: str, payload: bytes) -> None:
        printed = (_Printed(), _Printed())
        _PRINTED.set(printed)  # this task's context only
        try:
            kind, body = await self.worker.call_async(invocation_id, payload)
        except asyncio.CancelledError:  # its timeout passed: the server answered it already
            kind, body = framing.ERROR, _error("Cancelled", "the invocation's timeout passed")
        finally:
            self.tasks.pop(tag, None)
        frame = framing.encode_answer(tag, kind, printed[0].part(), printed[1].part(), body)
        async with self.sending:
            await self.loop.sock_sendall(self.sock, frame)


def _serve_tagged(sock: socket.socket, worker: Worker, first: bytes, buffered: bytearray) -> int:
    loop = worker.loop
    assert loop is not None
    asyncio.set_event_loop(loop)
    sock.setblocking(False)
    _flush()
    sys.stdout = _Routed(sys.stdout, 0)
    sys.stderr = _Routed(sys.stderr, 1)
    return loop.run_until_complete(_Tagged(sock, worker, loop).serve(first, buffered))


def main(*, ctl_fd: int, workdir: str, handler: str, once: bool, context: dict[str, Any]) -> int:
    sock = socket.socket(fileno=ctl_fd)
    try:
        worker = Worker(load_handler(workdir, handler), context)
    except LoadError as exc:
        sock.sendall(framing.encode(framing.LOAD_ERROR, _error(exc.kind, str(exc))))
        return 3
    gc.freeze()  # what the zygote and the handler module allocated is never collected again
    sock.sendall(framing.encode(framing.READY, framing.READY_ASYNC if worker.is_async else b""))
    reader = _Reader(sock)
    frame, call, send, encode = reader.frame, worker.call, sock.sendall, framing.encode
    while True:
        got = frame()
        if got is not None and got[0] == framing.INVOKE_TAGGED and worker.is_async and not once:
            return _serve_tagged(sock, worker, got[1], reader.buffer)
        if got is None or got[0] != framing.INVOKE:
            return 0
        invocation_id, payload = framing.decode_invoke(got[1])
        result_kind, result = call(invocation_id, payload)
        send(encode(result_kind, result))
        if once:
            return 0 if result_kind == framing.RESULT else 1
