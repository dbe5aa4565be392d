"""``python -m proxy_app.serve -b HOST -p PORT``: the apps proxy on uvicorn.

The apps proxy (``proxy_app.asgi:application``: apps, the ``bai app`` relay, agents' tunnels,
the inference router) runs in one uvicorn process, with httptools parsing HTTP, the
sans-I/O protocol of ``websockets`` for websockets and uvloop's event loop. It costs about
half the CPU per proxied request of daphne/Twisted, whose request parsing, access log and
socket writes were a third of the router's time.

What the proxy relies on, and where uvicorn gives it:

- **Bodies stream both ways with backpressure**: a request's body reaches the application
  as it arrives (reading stops while more than 64 KiB wait for the application), and a
  response's ``send`` waits while the caller's socket buffer is full. Nothing is spooled
  to disk or queued whole in memory.
- **Websockets**: a message is at most ``WS_MAX_MESSAGE`` (daphne's 1 MiB, as before);
  reading stops until the application took the last message, and ``send`` waits for a
  slow peer. Pings every 20 s; a peer silent for 20 s more is closed.
- **Bounded request heads**: httptools itself bounds neither the target nor the headers,
  so ``BoundedHttpToolsProtocol`` answers 431 to a request whose target passes
  ``TARGET_LIMIT``, whose head passes ``HEAD_LIMIT`` or which has more than ``MAX_HEADERS``
  headers, before any of it reaches the application.
- **A request head arrives in time**: uvicorn bounds idle time between requests
  (``timeout_keep_alive``, disarmed by the first byte of the next request) but not the
  time a head takes, so a caller that connects and then sends nothing, or a head a byte
  at a time, would hold its connection for ever. ``BoundedHttpToolsProtocol`` gives a
  head ``HEAD_TIMEOUT_S`` from the connection (or from the next request's first byte) to
  its end, then closes the connection: with a 408 when part of a head came, quietly when
  nothing did (as any idle connection; a 408 there could pass for the answer to a request
  the client sends at that moment).
- **A caller that leaves**: uvicorn's ``send`` to a gone caller returns without a word, so
  the proxy watches ``receive()`` for ``http.disconnect`` while it relays an answer
  (``forward.py``) and then closes that tunnel.
- Answers carry the app's own headers only: no ``server`` or ``date`` of the proxy's (an
  app's would be doubled), no access log, and ``X-Forwarded-For`` from callers is never
  trusted (the proxy sets its own toward apps).

One process: a tunnel lands in the process that asked for it (``tunnels.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

logger = logging.getLogger("proxy_app.serve")  # also when run as __main__

TARGET_LIMIT = 64 * 1024  # a request target (path and query), as the manager's daphne allows
HEAD_LIMIT = 80 * 1024  # the target and all header names and values together
MAX_HEADERS = 500  # as Twisted's
WS_MAX_MESSAGE = 1024 * 1024  # a websocket message, in or out of the proxy (daphne's default)
HEAD_TIMEOUT_S = 20.0  # a request head must be whole this long after it began
KEEP_ALIVE_S = 30  # an idle kept-alive connection of a caller is closed after this
SHUTDOWN_GRACE_S = 5  # on SIGTERM, requests still running then are cancelled


class HeadTooLarge(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request head bounded (see the module's notes)."""

    _head_bytes = 0
    _too_large = ""
    _head_clock: asyncio.TimerHandle | None = None
    _head_begun = False  # part of a head came, not its end

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_clock()  # the first head: nothing sent yet counts too

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._too_large = ""
        self._head_begun = True
        if self._head_clock is None:  # a kept-alive connection's next request
            self._start_head_clock()

    def on_headers_complete(self) -> None:
        self._head_begun = False
        self._stop_head_clock()
        super().on_headers_complete()

    def _start_head_clock(self) -> None:
        self._head_clock = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def _stop_head_clock(self) -> None:
        if self._head_clock is not None:
            self._head_clock.cancel()
            self._head_clock = None

    def _head_too_slow(self) -> None:
        self._head_clock = None
        if self.transport.is_closing():
            return
        if self._head_begun and (self.cycle is None or self.cycle.response_complete):
            self._refuse_and_close(408, f"its head took over {HEAD_TIMEOUT_S:g} s")
        else:  # nothing sent yet (an idle connection), or an answer is being written
            self.transport.close()

    def _refuse_and_close(self, status: int, why: str) -> None:
        body = f"Request refused: {why}.".encode()
        self.transport.write(
            STATUS_LINE[status]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        self.transport.close()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > HEAD_LIMIT:
            self._refuse(f"request head over {HEAD_LIMIT // 1024} KiB")

    def _refuse(self, why: str) -> None:
        self._too_large = why
        raise HeadTooLarge(why)

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > TARGET_LIMIT:
            self._refuse(f"request target over {TARGET_LIMIT // 1024} KiB")
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            self._refuse(f"more than {MAX_HEADERS} headers")
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            super().send_400_response(msg)
            return
        self._refuse_and_close(431, self._too_large)


def config(host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        "proxy_app.asgi:application",
        host=host,
        port=port,
        http=BoundedHttpToolsProtocol,
        ws="websockets-sansio",
        ws_max_size=WS_MAX_MESSAGE,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        loop="uvloop",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        log_config=None,  # Django's logging (settings.LOGGING) applies, as in the manager
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m proxy_app.serve", description=__doc__)
    parser.add_argument("-b", "--bind", default="127.0.0.1", help="address to listen on")
    parser.add_argument("-p", "--port", type=int, required=True, help="port to listen on")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    settings = config(args.bind, args.port)
    settings.load()  # imports the application: Django is set up, its logging too
    # uvicorn logs each websocket's path with its query at INFO: an agent's tunnel token.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logger.info("apps proxy on http://%s:%s (uvicorn, one process)", args.bind, args.port)
    uvicorn.Server(settings).run()


if __name__ == "__main__":
    main()
