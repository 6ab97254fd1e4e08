"""The python adapter, running inside a function process forked from the zygote.

The handler is `module:function` resolved in the function's working directory. It takes the
decoded JSON payload, optionally a second `context` argument, may be sync or async, and returns a
JSON-serializable value: a dict with string keys is the outputs, anything else becomes
{"result": value}. Handler exceptions, SystemExit included, are results of one invocation; the
process stays warm for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import inspect
import json
import os
import socket
import sys
import traceback
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kruntimes.api import outputs as api_outputs
from runtime import framing

MAX_ERROR_MESSAGE = 4096


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
        raise LoadError("HandlerImportError", f"cannot import {module_name!r}: {_describe(exc)}") from exc
    func = getattr(module, func_name, None)
    if func is None:
        raise LoadError("HandlerNotFound", f"module {module_name!r} has no attribute {func_name!r}")
    if not callable(func):
        raise LoadError("HandlerNotCallable", f"{handler!r} is not callable")
    return func  # type: ignore[no-any-return]


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


class Worker:
    def __init__(self, func: Callable[..., Any], context: dict[str, Any]) -> None:
        self.func = func
        self.with_context = _takes_context(func)
        self.loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(func) else None
        self.context = context

    def call(self, invocation_id: str, payload: bytes) -> tuple[int, bytes]:
        try:
            arg = json.loads(payload) if payload else None
        except ValueError as exc:
            return framing.ERROR, _error("InvalidPayload", f"payload is not JSON: {exc}")
        args: list[Any] = [arg]
        if self.with_context:
            args.append(SimpleNamespace(invocation_id=invocation_id, **self.context))
        try:
            result = self.func(*args)
            if inspect.isawaitable(result):
                if self.loop is None:
                    self.loop = asyncio.new_event_loop()
                result = self.loop.run_until_complete(result)
        except BaseException as exc:
            return framing.ERROR, _error("HandlerError", _describe(exc))
        finally:
            _flush()
        try:
            return framing.RESULT, api_outputs.encode_outputs(api_outputs.outputs_from_result(result))
        except (api_outputs.OutputsError, TypeError, ValueError) as exc:
            return framing.ERROR, _error("InvalidOutput", str(exc))


def _error(kind: str, message: str) -> bytes:
    return json.dumps({"type": kind, "message": message[:MAX_ERROR_MESSAGE]}).encode()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


class _Reader:
    """Frames from the control socket, usually one recv per request."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def frame(self) -> tuple[int, bytes] | None:
        while True:
            if len(self.buffer) >= framing.HEADER.size:
                size, kind = framing.HEADER.unpack_from(self.buffer)
                end = framing.HEADER.size + size
                if len(self.buffer) >= end:
                    body = bytes(self.buffer[framing.HEADER.size : end])
                    del self.buffer[:end]
                    return kind, body
            chunk = self.sock.recv(max(65536, len(self.buffer)))
            if not chunk:
                return None
            self.buffer += chunk


def main(*, ctl_fd: int, workdir: str, handler: str, once: bool, context: dict[str, Any]) -> int:
    sock = socket.socket(fileno=ctl_fd)
    try:
        worker = Worker(load_handler(workdir, handler), context)
    except LoadError as exc:
        sock.sendall(framing.encode(framing.LOAD_ERROR, _error(exc.kind, str(exc))))
        return 3
    gc.freeze()  # what the zygote and the handler module allocated is never collected again
    sock.sendall(framing.encode(framing.READY, b""))
    reader = _Reader(sock)
    while True:
        got = reader.frame()
        if got is None or got[0] != framing.INVOKE:
            return 0
        body = got[1]
        invocation_id, payload = framing.decode_invoke(body)
        result_kind, result = worker.call(invocation_id, payload)
        sock.sendall(framing.encode(result_kind, result))
        if once:
            return 0 if result_kind == framing.RESULT else 1
