"""The manager's ASGI handler runs Django's middleware in one thread hop a
request (backendai_web/handler.py): the chain is built for synchronous use, and
sync and coroutine views alike still pass through every middleware. A request's
thread is reused by later requests, and work a view leaves for after its
response runs there once the response is out (or the client left)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.signals import request_started

from backendai_web.asgi import django_asgi_app
from backendai_web.handler import OneHopASGIHandler
from sessions_app.tokens import token_create

from . import after_urls
from .helpers import HOST, http

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("channel_prefix")]


def test_the_middleware_chain_is_synchronous():
    assert not iscoroutinefunction(django_asgi_app._middleware_chain)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/api/v1/sessions/", b"", 200),  # a sync view
        ("POST", "/api/v1/sessions/{}/execute/", b'{"mode": "nope"}', 400),  # waits on the loop
        ("GET", "/api/v1/folders/999999/files/content/?path=a", b"", 404),  # a coroutine view
        ("GET", "/no-such-page/", b"", 404),
    ],
)
async def test_every_view_passes_through_the_middleware(running, alice, method, path, body, status):
    token = await sync_to_async(lambda: token_create(user=alice)[1])()
    response = await http(method, path.format(running.pk), token, body)
    headers = {k.decode().lower(): v.decode() for k, v in response["headers"]}
    assert response["status"] == status
    assert "frame-ancestors 'none'" in headers["content-security-policy"]  # CSPMiddleware
    assert headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    if status == 200:
        assert json.loads(response["body"])[0]["id"] == str(running.pk)


# --- the request's thread, and work after the response ------------------------


async def _drive(path: str, *, client_leaves: bool = False) -> None:
    """One GET through the handler, its messages out noted in ``after_urls.LOG``."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [HOST],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    asked = []

    async def receive() -> dict:
        asked.append(1)
        if len(asked) == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        if client_leaves:
            await asyncio.sleep(0.1)  # while the view runs
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays until the handler is done

    async def send(message: dict) -> None:
        after_urls.LOG.append(("send", message["type"]))

    await django_asgi_app(scope, receive, send)


async def _idle_threads_hold(count: int) -> None:
    async with asyncio.timeout(5):
        while len(OneHopASGIHandler.threads.idle) < count:
            await asyncio.sleep(0.01)


@pytest.fixture
def after_views(settings):
    settings.ROOT_URLCONF = "tests.channels.after_urls"
    after_urls.LOG.clear()
    return after_urls.LOG


async def test_work_after_the_response_runs_once_it_is_sent_in_the_views_thread(after_views):
    def started(**kwargs: object) -> None:
        after_views.append(("started", threading.get_ident()))

    request_started.connect(started)
    try:
        await _drive("/answer/")
    finally:
        request_started.disconnect(started)
    # request_started is sent once, in the view's own thread, before the view.
    (_, thread), view, *sent, after = after_views
    assert view == ("view", thread)
    assert sent == [("send", "http.response.start"), ("send", "http.response.body")]
    assert after == ("after", thread)


async def test_the_next_request_reuses_a_finished_requests_thread(after_views):
    threads = OneHopASGIHandler.threads
    while threads.idle:  # start with none kept (other tests' requests left some)
        threads.idle.pop().shutdown(wait=False)
    await _drive("/answer/")
    await _idle_threads_hold(1)
    await _drive("/answer/")
    await _idle_threads_hold(1)
    views = [t for what, t in after_views if what == "view"]
    assert views[0] == views[1]
    assert len(threads.idle) == 1  # no second thread was made


async def test_a_request_whose_client_left_still_runs_its_work_after(after_views):
    await _drive("/slow/", client_leaves=True)
    # The view finished in its thread after the client left; its work ran after it.
    assert [w for w, _ in after_views] == ["view", "after"]
    assert after_views[0][1] == after_views[1][1]


async def test_work_that_fails_after_the_response_stops_neither_the_rest_nor_the_answer(
    after_views, caplog
):
    await _drive("/failing/")
    assert [w for w, _ in after_views][-1] == "after"
    assert "work after a response failed" in caplog.text
