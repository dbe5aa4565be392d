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

**The request's thread is reused.** Django gives each request a thread of its
own (asgiref's ``ThreadSensitiveContext``): a new one, started at the request's
first hop and joined at its end. Here each request still has one thread for
its whole life (every hop of it, as Django's thread-sensitive code expects),
but the thread comes from a free list and goes back to it once free, as
asgiref's ``ThreadSensitiveContext(executor=...)`` is meant to be used. A
request's database connections go back to the pool at its end
(``request_finished``), as before, so a kept thread holds none.

**``request_started`` in the request's thread.** Django sends it from the event
loop before the view, which takes a thread hop of its own for its receivers
(closing the thread's old database connections); here it is sent in the
request's thread just before the middleware, in the hop the request takes anyway.
That takes a copy of Django's ``ASGIHandler.handle`` (5.2; check it at each
upgrade). Worth it: a request refused after its token's check answered 0.40 ms
sooner at p50 with it than with Django's own ``handle``, and took ~5 % less of
daphne's CPU (two daphnes by turns, 1,500 requests each, twice; 2026-11-27).

**Work after the answer.** ``after_response(func)`` runs ``func`` in the
request's thread once the answer has been sent, when Django closes the
response (or, when the request ended without one because the client left,
after it), before the thread's database connections go back to the pool. A
code run's history row is written so, off the run's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections
from django.urls import set_script_prefix

logger = logging.getLogger(__name__)

# Idle request threads kept for the next requests; past this, a finished request's
# thread ends (a burst of many requests at once leaves no crowd of idle threads).
KEPT_THREADS = 32


class AfterResponse:
    """What a request does once its answer is out (``after_response``)."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []
        self.done = False

    def run(self) -> None:
        """Run what is pending. Called by the response's ``close()`` (once sent:
        in the request's thread, just before ``request_finished`` gives its
        connections back), or by ``run_alone`` for a request that ended with no
        response closed (its client left, maybe while its view still ran)."""
        self.done = True
        while self.pending:
            func = self.pending.pop(0)
            try:
                func()
            except Exception:
                logger.exception("work after a response failed")

    def run_alone(self) -> None:
        try:
            self.run()
        finally:
            close_old_connections()


_after: contextvars.ContextVar[AfterResponse | None] = contextvars.ContextVar(
    "after_response", default=None
)


def after_response(func: Callable[[], None]) -> None:
    """Run ``func`` once this request's answer is out, in the request's thread;
    at once outside a request served by ``OneHopASGIHandler`` (the test client,
    a shell). Its errors are logged, never the client's."""
    after = _after.get()
    if after is None or after.done:
        func()
    else:
        after.pending.append(func)


class RequestThreads:
    """Single-thread executors, each lent to one request at a time."""

    def __init__(self, keep: int = KEPT_THREADS) -> None:
        self.keep = keep
        self.idle: list[ThreadPoolExecutor] = []
        self.lock = threading.Lock()

    def borrow(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        """Keep ``executor`` for another request once its thread is free: the view
        of a request whose client left may still be running there."""
        executor.submit(int).add_done_callback(lambda _: self._keep(executor))

    def _keep(self, executor: ThreadPoolExecutor) -> None:
        with self.lock:
            if len(self.idle) < self.keep:
                self.idle.append(executor)
                return
        executor.shutdown(wait=False)


class OneHopASGIHandler(ASGIHandler):
    threads = RequestThreads()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.borrow()
        after = AfterResponse()
        token = _after.set(after)
        try:
            async with ThreadSensitiveContext(executor=executor):
                try:
                    await self.handle(scope, receive, send)
                finally:
                    if not after.done:  # no response was closed: the client left
                        # In the request's thread, so after its view (if it still runs).
                        await sync_to_async(after.run_alone, thread_sensitive=True)()
        finally:
            _after.reset(token)
            self.threads.give_back(executor)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle`` (5.2), except that ``request_started``
        is sent in the request's thread just before its view (``_respond``), not
        in a thread hop of its own before: one hop fewer a request."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request(request: Any, send: Any) -> Any:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left during the send
                await self.send_response(response, send)
            return response

        # The disconnect listener goes first: it raises nothing that would keep
        # process_request from being cancelled.
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await sync_to_async(response.close)()
        body_file.close()

    def _respond(self, request: Any) -> Any:
        signals.request_started.send(sender=self.__class__, scope=request.scope)
        return self.get_response(request)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: Any) -> Any:
        # Thread-sensitive: the request's own thread (ASGIHandler gives each
        # request a context of its own), as Django runs a sync view.
        response = await sync_to_async(self._respond, thread_sensitive=True)(request)
        after = _after.get()
        if after is not None:
            # Django's handler closes a response in the request's thread once sent.
            response._resource_closers.append(after.run)
        return response
