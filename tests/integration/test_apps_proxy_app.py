"""The apps proxy's application (proxy_app/app.py) in this process, in front of real servers
on loopback: a session's app is a real HTTP or websocket server, reached by a tunnel
straight to its port (``loopback_tunnel``) instead of through an agent. The sessions are
real rows; the owner's access cookie comes from the launcher's real one-time link.

- An app's ``Set-Cookie`` reaches the browser only for the app's own host: one with a
  wider ``Domain`` (the apps parent, the manager's host) is dropped, whatever its spelling.
- The access cookie is named after the app: another cookie of that name (tossed onto
  the parent domain) never hides the valid one.
- A websocket app's first message, sent as soon as it accepted, reaches the browser.
- A request with two ``Host`` headers is answered 400.

Personas: ``alice`` owns the session; ``bob`` is a stranger to it.
"""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connections
from websockets.asyncio.server import serve as ws_serve

from proxy_app import access, forward, tunnels
from proxy_app.app import application
from sessions_app import services
from sessions_app.models import Kernel, Session, Status
from tests.serving.test_router import loopback_tunnel

pytestmark = pytest.mark.django_db(transaction=True)

APPS = "apps.localhost:8001"

# What an app may try: (Set-Cookie, whether it reaches the browser). ``{own}`` is the
# app's own host name.
SET_COOKIES = [
    ("plain=1; Path=/; HttpOnly", True),
    ("own=1; Domain={own}; Path=/", True),
    ("own-dot=1; Domain=.{own}", True),
    ("own-case=1; domain={OWN}", True),
    ("deleted=; Max-Age=0; Path=/", True),
    ("parent=1; Domain=apps.localhost; Path=/", False),
    ("parent-dot=1; Domain=.apps.localhost", False),
    ("manager=1; Domain=localhost", False),
    ("sessionid=planted; Domain=localhost; Path=/", False),
    ("csrftoken=planted; domain=LOCALHOST", False),
    ("spaced=1; Path=/;  DOMAIN  =  apps.localhost  ", False),
    ("twice=1; Domain={own}; Domain=apps.localhost", False),
    ("twice-back=1; Domain=apps.localhost; Domain={own}", False),
    # http.cookies reads the quoted value across the ";"; a browser sees a Domain.
    ('quoted="x; Domain=localhost; y"', False),
    ("after-attr=1; x=1; Domain=localhost", False),
    ("empty-domain=1; Domain=", False),
    ("=nameless; Domain=localhost", False),
    ("bai_app_0123456789abcdef0123456789abcdef-jupyter=x; Path=/", False),
]


class CookieApp:
    """A real HTTP server on 127.0.0.1 answering every ``SET_COOKIES`` line."""

    def __init__(self) -> None:
        self.seen_cookies: list[str | None] = []
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_GET(self) -> None:
                app.seen_cookies.append(self.headers.get("Cookie"))
                own = self.headers["Host"].rsplit(":", 1)[0]
                self.send_response(200)
                for line, _ in SET_COOKIES:
                    self.send_header("Set-Cookie", line.format(own=own, OWN=own.upper()))
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback(monkeypatch):
    """Tunnels straight to 127.0.0.1:<the app's port>; the pool emptied after."""
    monkeypatch.setattr(tunnels, "open_tunnel", loopback_tunnel)
    yield
    tunnels.pool.forget()  # loopback tunnels of this test's loop, gone with it
    # The ORM ran in sync_to_async's one thread: its connection must not outlive the test.
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


def _running_session(owner, image, group, agent, port: int) -> Session:
    session = Session.objects.create(
        owner=owner,
        name=f"app-{port}",
        image=image,
        resource_group=group,
        status=Status.RUNNING,
        preopen_ports=[port],
    )
    Kernel.objects.create(
        id=session.pk,
        session=session,
        cluster_role="main",
        cluster_idx=1,
        local_rank=0,
        cluster_hostname="main1",
        image=image.reference,
        agent=agent,
        status=Status.RUNNING,
    )
    return session


def _scope(kind: str, host: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    raw, _, query = path.partition("?")
    scope = {
        "type": kind,
        "path": raw,
        "raw_path": raw.encode(),
        "query_string": query.encode(),
        "headers": [(b"host", host.encode()), *headers],
        "client": ("127.0.0.1", 40000),
        "scheme": "http" if kind == "http" else "ws",
        "http_version": "1.1",
    }
    if kind == "http":
        scope["method"] = "GET"
    return scope


async def call(host: str, path: str, headers: list[tuple[bytes, bytes]] | None = None):
    """One GET through the proxy's application: (status, header list, body)."""
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the caller stays
        return {"type": "http.disconnect"}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    await application(_scope("http", host, path, headers or []), receive, send)
    return sent[0]["status"], sent[0]["headers"], b"".join(e.get("body", b"") for e in sent[1:])


async def open_app(user, session: Session, app: str) -> tuple[str, str]:
    """(the app's host, the ``Cookie`` header) from the launcher's one-time link."""
    opened = await sync_to_async(services.app_open)(user=user, session=session, name=app)
    link = urlsplit(opened["url"])
    status, headers, _ = await call(link.netloc, f"{link.path}?{link.query}")
    assert status == 302
    set_cookie = dict(headers)[b"set-cookie"].decode()
    assert "Domain" not in set_cookie and "HttpOnly" in set_cookie
    return link.netloc, set_cookie.split(";", 1)[0]


@pytest.fixture
def cookie_app():
    app = CookieApp()
    yield app
    app.stop()


async def test_an_app_sets_cookies_for_its_own_host_only(
    loopback, cookie_app, alice, image, group, agent
):
    session = await sync_to_async(_running_session)(alice, image, group, agent, cookie_app.port)
    host, cookie = await open_app(alice, session, f"port-{cookie_app.port}")
    own = host.rsplit(":", 1)[0]
    assert cookie.startswith(f"bai_app_{session.pk.hex}-port-{cookie_app.port}=")

    status, headers, body = await call(host, "/", [(b"cookie", cookie.encode())])
    assert (status, body) == (200, b"ok")
    passed = [v.decode() for k, v in headers if k == b"set-cookie"]
    expected = [line.format(own=own, OWN=own.upper()) for line, ok in SET_COOKIES if ok]
    assert passed == expected
    # The proxy's own cookie never reaches the app.
    assert cookie_app.seen_cookies == [None]


def test_on_the_bare_apps_host_a_cookie_may_name_no_domain():
    """The inference router's host is every app's parent: a replica's cookie stays host-only."""
    assert forward.own_cookie_domain(_scope("http", APPS, "/serve/x/", [])) is None
    assert forward.cookie_may_pass(b"a=1; Path=/; HttpOnly", None)
    assert not forward.cookie_may_pass(b"a=1; Domain=apps.localhost", None)
    assert not forward.cookie_may_pass(b"a=1; Domain=localhost", None)


async def test_a_cookie_tossed_onto_the_parent_domain_does_not_lock_the_owner_out(
    loopback, cookie_app, alice, image, group, agent
):
    session = await sync_to_async(_running_session)(alice, image, group, agent, cookie_app.port)
    host, cookie = await open_app(alice, session, f"port-{cookie_app.port}")
    name = cookie.split("=", 1)[0]
    # What the browser sends after another app set the same name on apps.localhost
    # (a cookie of a wider domain may come first or last).
    for header in (f"{name}=tossed; {cookie}", f"{cookie}; {name}=tossed"):
        status, _, body = await call(host, "/", [(b"cookie", header.encode())])
        assert (status, body) == (200, b"ok"), header
    status, _, _ = await call(host, "/", [(b"cookie", f"{name}=tossed".encode())])
    assert status == 403


async def test_a_request_with_two_host_headers_is_refused_with_400(
    loopback, cookie_app, alice, image, group, agent
):
    session = await sync_to_async(_running_session)(alice, image, group, agent, cookie_app.port)
    host, cookie = await open_app(alice, session, f"port-{cookie_app.port}")
    for second in (host, "localhost:8000", APPS):
        status, _, body = await call(
            host, "/", [(b"host", second.encode()), (b"cookie", cookie.encode())]
        )
        assert status == 400, second
        assert b"The request has more than one Host header." in body
    assert cookie_app.seen_cookies == []  # nothing reached the app


async def test_a_websocket_apps_first_message_arrives_every_time(
    loopback, alice, image, group, agent
):
    """The app sends at once after accepting: its message comes in the same read as its
    101 answer, and must reach the browser, on every one of 10 opens."""

    async def greet_then_echo(ws: Any) -> None:
        await ws.send("hello from the app")
        async for message in ws:
            await ws.send(f"echo {message}")

    async with ws_serve(greet_then_echo, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        session = await sync_to_async(_running_session)(alice, image, group, agent, port)
        host, cookie = await open_app(alice, session, f"port-{port}")
        for attempt in range(10):
            to_proxy: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            from_proxy: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            await to_proxy.put({"type": "websocket.connect"})
            scope = _scope(
                "websocket",
                host,
                "/ws",
                [(b"cookie", cookie.encode()), (b"origin", f"http://{host}".encode())],
            )
            task = asyncio.create_task(application(scope, to_proxy.get, from_proxy.put))
            accepted = await asyncio.wait_for(from_proxy.get(), 10)
            assert accepted["type"] == "websocket.accept", (attempt, accepted)
            first = await asyncio.wait_for(from_proxy.get(), 10)
            assert first == {"type": "websocket.send", "text": "hello from the app"}, attempt
            await to_proxy.put({"type": "websocket.receive", "text": "ping"})
            echoed = await asyncio.wait_for(from_proxy.get(), 10)
            assert echoed == {"type": "websocket.send", "text": "echo ping"}, attempt
            await to_proxy.put({"type": "websocket.disconnect", "code": 1000})
            await asyncio.wait_for(task, 10)


async def test_a_stranger_reaches_no_app_with_the_owners_cookie_name(
    loopback, cookie_app, alice, bob, image, group, agent
):
    session = await sync_to_async(_running_session)(alice, image, group, agent, cookie_app.port)
    app = f"port-{cookie_app.port}"
    host = f"{session.pk.hex}-{app}.{APPS}"
    bobs = access.make_cookie(bob.pk, str(session.pk), app)
    name = access.cookie_name(str(session.pk), app, secure=False)
    status, _, _ = await call(host, "/", [(b"cookie", f"{name}={bobs}".encode())])
    assert status == 403
    assert cookie_app.seen_cookies == []
