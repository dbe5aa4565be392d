"""The manager's ASGI handler runs Django's middleware in one thread hop a
request (backendai_web/handler.py): the chain is built for synchronous use, and
sync and coroutine views alike still pass through every middleware."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async

from backendai_web.asgi import django_asgi_app
from sessions_app.tokens import token_create

from .helpers import http

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
