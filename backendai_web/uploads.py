"""Django's ASGI handler, with the body of a file upload read as the view reads it.

Django reads a whole request body into a spooled temporary file before the view
runs. For ``PUT /api/v1/folders/{id}/files/content/`` that is one more full copy
of the upload on disk, made before the view has even checked who is asking (or
the quota). ``StreamingBodyHandler`` gives that view, instead, a stream that takes
each body message from the server when the view reads it; every other request
goes through Django's handler unchanged.

The view reads in a worker thread (``asyncio.to_thread``); each read asks the event
loop for the next message. Django's listener for a client's disconnect, which
would otherwise take a body message, starts listening once the body has been read.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

from django.core.exceptions import RequestAborted

from backendai_web.handler import OneHopASGIHandler

STREAMED = re.compile(r"^/api/v1/folders/\d+/files/content/$")
_body: contextvars.ContextVar[ReceivedBody | None] = contextvars.ContextVar("body", default=None)


class ReceivedBody:
    """A request body as a readable stream over the ASGI ``receive`` callable."""

    def __init__(self, receive: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._receive = receive
        self._loop = loop
        self._buffer = bytearray()
        self._more = True
        self.done = asyncio.Event()

    async def _next(self) -> bytes:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._more = False
            self.done.set()
            raise RequestAborted("the client went away during the upload")
        if not message.get("more_body", False):
            self._more = False
            self.done.set()
        return message.get("body", b"")

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when negative); b"" at the end.
        Called from a worker thread, never on the event loop's own."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("read a streamed body from a worker thread")
        while self._more and (size < 0 or len(self._buffer) < size):
            chunk = asyncio.run_coroutine_threadsafe(self._next(), self._loop).result()
            if not self._buffer and (size < 0 or len(chunk) <= size):
                if not self._more or len(chunk) == size:
                    return chunk  # the common case: one message, no copy
            self._buffer += chunk
        if size < 0 or size >= len(self._buffer):
            out, self._buffer = bytes(self._buffer), bytearray()
        else:
            out = bytes(self._buffer[:size])
            del self._buffer[:size]
        return out

    async def receive_after_body(self) -> dict[str, Any]:
        await self.done.wait()
        return await self._receive()

    def close(self) -> None:
        self._buffer = bytearray()


class StreamingBodyHandler(OneHopASGIHandler):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("method") != "PUT" or not STREAMED.match(scope.get("path", "")):
            return await super().handle(scope, receive, send)
        body = ReceivedBody(receive, asyncio.get_running_loop())
        token = _body.set(body)
        try:
            await super().handle(scope, body.receive_after_body, send)
        finally:
            _body.reset(token)

    async def read_body(self, receive: Any) -> Any:
        body = _body.get()
        return body if body is not None else await super().read_body(receive)
