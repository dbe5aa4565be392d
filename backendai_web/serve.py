"""``python -m backendai_web.serve -b HOST -p PORT backendai_web.asgi:application``:
daphne (any of its arguments), with websocket message limits that fit what the
manager accepts.

daphne refuses an incoming websocket message over 1 MiB by closing the socket: an
agent's code-run answer (a frame carries up to 1 MiB of output, escaped), a kept log
tail past ~170 KiB, or a browser's code of more than 1 MiB would each end the
connection they came on (an agent's with all its kernels' streams). The limit given
here is the largest frame the gateway checks (``protocol.max_frame_chars``) or a code
run's request (``BAI_EXEC_MAX_CODE``, escaped), whichever is larger; the consumers
bound every message themselves.

daphne also hands an HTTP request's body to the application all at once: Twisted
spools the body to a temporary file, then daphne reads the whole file into the
application's queue in 8 KiB messages before the application reads the first one,
so a 1 GB upload sat in memory as 131,072 queued chunks. ``Server`` here queues,
for each chunk, only where it lies in that spooled file, and reads the bytes when
the application asks for them, 1 MiB at a time: the body is read from disk at the
application's pace and memory stays flat.
"""

from __future__ import annotations

import asyncio
import os
import sys
from functools import partial
from typing import Any

from daphne.server import Server as DaphneServer
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

BODY_CHUNK = 1024 * 1024
# Twisted drops, without a word, a connection whose request line passes 16 KiB (and answers a
# bare 400 when the line and the headers together do). A folder path
# of 4,096 characters (the API's bound), each up to 12 characters once percent-encoded, fits
# in 64 KiB: such a request reaches the API, which answers why it refuses it.
REQUEST_LINE_LIMIT = 64 * 1024


class _Span:
    """Where one chunk of a request body lies in the request's spooled content."""

    __slots__ = ("length", "offset")

    def __init__(self, offset: int, length: int) -> None:
        self.offset = offset
        self.length = length


class BodyOnDemandQueue(asyncio.Queue):
    """An application's input queue that holds body chunks as spans of the request's
    content file and reads each when the application receives it."""

    def __init__(self, content: Any) -> None:
        super().__init__()
        self._content = content
        self._offset = 0

    def put_nowait(self, item: dict[str, Any]) -> None:
        body = item.get("body") if item.get("type") == "http.request" else None
        if body:
            item = {**item, "body": _Span(self._offset, len(body))}
            self._offset += len(body)
        super().put_nowait(item)

    async def get(self) -> dict[str, Any]:
        item = await super().get()
        span = item.get("body")
        if isinstance(span, _Span):
            try:
                self._content.seek(span.offset)
                data = self._content.read(span.length)
            except ValueError:  # the content was closed: the client went away
                return {"type": "http.disconnect"}
            item = {**item, "body": data}
        return item


@implementer(IPushProducer)
class _Drain:
    """Twisted pauses this producer while a response's socket buffer is full."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's interface
        self.ready.clear()

    def resumeProducing(self) -> None:  # noqa: N802
        self.ready.set()

    def stopProducing(self) -> None:  # noqa: N802 - the connection is gone: stop waiting
        self.ready.set()


class Server(DaphneServer):
    """daphne with request bodies read on demand (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["request_buffer_size"] = BODY_CHUNK
        super().__init__(*args, **kwargs)

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> asyncio.Queue | None:
        content = getattr(protocol, "content", None) if scope.get("type") == "http" else None
        if content is None:
            return super().create_application(protocol, scope)
        # As daphne's own, with the queue above.
        assert "application_instance" not in self.connections[protocol]
        queue = BodyOnDemandQueue(content)
        scope.setdefault("asgi", {"version": "3.0"})
        instance = self.application(
            scope=scope, receive=queue.get, send=partial(self.handle_reply, protocol)
        )
        if protocol not in self.connections:
            return None
        self.connections[protocol]["application_instance"] = asyncio.ensure_future(instance)
        return queue

    async def handle_reply(self, protocol: Any, message: dict[str, Any]) -> None:
        if message.get("type") != "http.response.body":
            return await super().handle_reply(protocol, message)
        state = self.connections.get(protocol)
        drain = state.get("drain") if state is not None else None
        if not message.get("more_body", False):
            if drain is not None:
                protocol.unregisterProducer()
                del state["drain"]
            return await super().handle_reply(protocol, message)
        if drain is None and state is not None and not state.get("disconnected"):
            drain = state["drain"] = _Drain()
            protocol.registerProducer(drain, True)
        await super().handle_reply(protocol, message)
        if drain is not None:
            await drain.ready.wait()


def code_run_limit() -> int:
    """The largest code-run request that can be valid: code of ``BAI_EXEC_MAX_CODE``
    bytes and a batch's two commands, JSON escaping a byte as up to 6 characters."""
    from django.conf import settings

    from agent import protocol

    return 6 * (settings.BAI_EXEC_MAX_CODE + 2 * protocol.EXEC_COMMAND_MAX) + 4096


def websocket_limit() -> int:
    from django.conf import settings

    from agent import protocol

    return max(protocol.max_frame_chars(settings.BAI_LOG_TAIL_BYTES), code_run_limit())


def static_files_missing() -> str | None:
    """Why production cannot serve its pages yet, or None.

    Production serves the hashed, compressed copies that ``collectstatic`` writes
    (whitenoise's manifest storage); without its manifest every page that names a
    static file fails with "Missing staticfiles manifest entry".
    """
    import django
    from django.conf import settings

    django.setup()
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage

    if not isinstance(staticfiles_storage, ManifestFilesMixin):
        return None
    if staticfiles_storage.read_manifest() is not None:
        return None
    return (
        f"static files are not collected into {settings.STATIC_ROOT}: run "
        "`python manage.py collectstatic --noinput` (with the same environment) before "
        "starting the manager, and again after each upgrade"
    )


def main(argv: list[str] | None = None) -> None:
    from daphne.cli import CommandLineInterface

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    problem = static_files_missing()
    if problem:
        sys.exit(f"backendai_web.serve: {problem}")
    limit = str(websocket_limit())
    sizes = ["--websocket-max-message-size", limit, "--websocket-max-frame-size", limit]
    from twisted.web.http import HTTPChannel

    HTTPChannel.MAX_LENGTH = REQUEST_LINE_LIMIT
    HTTPChannel.totalHeadersSize = REQUEST_LINE_LIMIT + HTTPChannel.totalHeadersSize
    cli = CommandLineInterface()
    cli.server_class = Server
    cli.run([*sizes, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
