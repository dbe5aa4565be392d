"""Django's ASGI handler with its middleware run in one thread hop per request.

Django's own ASGI handler builds the middleware chain for async use. Ours is a
mix: a middleware that can only run synchronously (WhiteNoise, the body limits)
puts everything outside it in a thread, and everything inside it that can run
either way (sessions, common, CSRF, auth, messages, clickjacking, axes) runs on
the event loop, where Django's ``MiddlewareMixin`` sends each ``process_request``
and ``process_response`` to the request's thread and back: about a dozen thread
round trips a request, and a sync view one more out of the loop and back in. On
loopback that was most of a request's time (a view that answers "ok" took ~4 ms
through daphne against ~0.2 ms in the test client).

Here the chain is built for synchronous use and called in the request's thread
once: every middleware and a sync view run there, one after the other. A
coroutine view (``sessions_app.api.AsyncApiView``) is still run on the event
loop by Django (``async_to_sync``), as it was inside the sync part of the mixed
chain: waiting there holds no database connection (its ORM work goes through
``loop.db``). Only the order of the hops changes; every middleware and view does
what it did.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: Any) -> Any:
        # Thread-sensitive: the request's own thread (ASGIHandler gives each
        # request a context of its own), as Django runs a sync view.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
