"""The apps proxy: a plain ASGI application on the apps origin (its own port).

Every app has an origin of its own, ``http://<session hex>-<app>.<apps host>:<port>``,
so an app's pages never share cookies or storage with the manager or with another app.

- ``GET /_bai/open?t=<link>`` on an app's host: trade the launcher's one-time link for
  this app's cookie (host-only, HttpOnly), then go to ``/``.
- any other path of an app's host: the app itself, for its owner (or an admin) holding
  the cookie: HTTP with every method and streamed bodies, and websockets.
- ``/_bai/tcp/<session id>/<app>`` (websocket, ``Authorization: Token``): a TCP
  connection of the ``bai app`` client, byte for byte.
- ``/tunnel/<id>/`` (websocket): an agent dialling back for one proxied connection.
- ``/serve/<endpoint>/<path>`` on the bare apps host (no app named in it): the inference
  router (``router.py``).
- ``/_bai/probe?t=<token>``: a health check of an inference replica for the serving
  reconciler (``probe.py``).
"""

from __future__ import annotations

import html
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from django.conf import settings

from backendai_web import metrics

from . import access, forward, probe, router, tunnels

logger = logging.getLogger(__name__)

CSP = b"default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'"
TOUCH_EVERY = 10.0  # seconds between activity marks of one session
_touched: dict[str, float] = {}


async def _page(send: Any, status: int, title: str, text: str) -> None:
    body = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body><main><h1>{html.escape(title)}</h1>"
        f"<p>{html.escape(text)}</p></main></body></html>"
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-security-policy", CSP),
                (b"cache-control", b"no-store"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _activity(session_id: str) -> None:
    now = time.monotonic()
    if now - _touched.get(session_id, 0.0) >= TOUCH_EVERY:
        _touched[session_id] = now
        await sync_to_async(access.touch)(session_id)


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _cookie_values(scope: dict[str, Any], name: str) -> list[str]:
    """Every value the browser sent under ``name``: a cookie of the same name set on a
    parent domain comes along with the app's own, and must not hide it."""
    values = []
    for key, value in scope["headers"]:
        if key.lower() == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                found, sep, data = pair.strip().partition("=")
                if sep and found == name:
                    values.append(data)
    return values


def _secure(scope: dict[str, Any]) -> bool:
    return scope.get("scheme") in ("https", "wss")


def _own_origin(scope: dict[str, Any]) -> str:
    scheme = "https" if _secure(scope) else "http"
    return f"{scheme}://{_header(scope, b'host')}"


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    kind = scope["type"]
    if kind == "lifespan":
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if sum(1 for key, _ in scope["headers"] if key.lower() == b"host") > 1:
        # Which app is meant? Every part reads the host, and h11 refuses to carry such a
        # request on: answered as HTTP/1.1 says (RFC 9112, 3.2), before anything reads it.
        if kind == "websocket":
            await receive()  # websocket.connect
        await _refuse(scope, send, 400, "Bad request", "The request has more than one Host header.")
        return
    path = scope["path"]
    if kind == "websocket" and path.startswith("/tunnel/"):
        await tunnels.serve_agent_end(scope, receive, send)
        return
    if path.startswith(router.PREFIX) and access.parse_host(_header(scope, b"host")) is None:
        await router.serve(scope, receive, send)  # the router counts its own requests
        return
    if kind == "http" and path == "/_bai/probe":
        await probe.serve_probe(scope, receive, send)
        return
    tcp = kind == "websocket" and path.startswith("/_bai/tcp/")
    outcome = "unanswered"

    async def watching(message: dict[str, Any]) -> None:
        nonlocal outcome
        if message["type"] == "http.response.start":
            outcome = f"{int(message['status']) // 100}xx"
        elif message["type"] == "websocket.accept":
            outcome = "accepted"
        elif message["type"] == "websocket.close" and outcome == "unanswered":
            outcome = "refused"
        await send(message)

    try:
        await (_tcp if tcp else _app)(scope, receive, watching)
    finally:
        metrics.inc("bai_app_proxy_requests", kind="tcp" if tcp else kind, outcome=outcome)


async def _refuse(scope: dict[str, Any], send: Any, status: int, title: str, text: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + status})
    else:
        await _page(send, status, title, text)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    parsed = access.parse_host(_header(scope, b"host"))
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
    if parsed is None:
        await _refuse(scope, send, 404, "Not found", "No app is served at this address.")
        return
    session_id, app = parsed
    if scope["type"] == "http" and scope["path"] == "/_bai/open":
        await _trade_link(scope, send, session_id, app)
        return
    name = access.cookie_name(session_id, app, secure=_secure(scope))
    user_id = access.read_cookie(_cookie_values(scope, name), session_id, app)
    target = None
    if user_id is not None:
        target = await sync_to_async(access.cached_resolve)(user_id, session_id, app)
    if target is None:
        await _refuse(
            scope, send, 403, "Forbidden", "Open this app from its session's page to use it."
        )
        return
    # A page of another origin (another app among them) never drives this one.
    origin = _header(scope, b"origin")
    unsafe = scope["type"] == "websocket" or scope["method"] not in ("GET", "HEAD", "OPTIONS")
    if unsafe and origin and origin != _own_origin(scope):
        await _refuse(scope, send, 403, "Forbidden", "Requests from another origin are refused.")
        return
    if not target.running:
        await _refuse(
            scope,
            send,
            410,
            "This session has ended",
            f"The session of this app is {target.status.lower()}, so {target.app.title} "
            "is no longer available. Launch a new session from the manager.",
        )
        return
    await _activity(session_id)
    try:
        if scope["type"] == "websocket":
            await _websocket(scope, receive, send, target)
        else:
            await _http(scope, receive, send, target)
    except tunnels.TunnelFailed as exc:
        await _refuse(scope, send, 502, f"{target.app.title} is not reachable", str(exc))
    except forward.UpstreamError as exc:
        await _page(
            send,
            502,
            f"{target.app.title} is not reachable",
            f"{exc} (port {target.app.port} of the session's main kernel).",
        )
    finally:
        await _activity(session_id)


async def _websocket(scope: dict[str, Any], receive: Any, send: Any, target: Any) -> None:
    tunnel = await tunnels.open_tunnel(target)
    try:
        await forward.forward_websocket(scope, receive, send, tunnel, target)
    finally:
        await tunnel.close()


async def _http(scope: dict[str, Any], receive: Any, send: Any, target: Any) -> None:
    try:
        await forward.exchange(scope, receive, send, target, await receive())
    except forward.CallerGone:
        pass  # the browser left: its tunnel is closed, there is no one to answer


async def _trade_link(scope: dict[str, Any], send: Any, session_id: str, app: str) -> None:
    token = (parse_qs(scope.get("query_string", b"").decode()).get("t") or [""])[0]
    user_id = await sync_to_async(access.trade_link)(token, session_id, app)
    target = None
    if user_id is not None:
        target = await sync_to_async(access.cached_resolve)(user_id, session_id, app)
    if target is None:
        await _page(
            send,
            403,
            "This link does not open the app",
            "Links to apps work once, for a minute, for the user who asked: "
            "open the app again from its session's page.",
        )
        return
    secure = _secure(scope)
    # No Domain attribute: host-only, so no other app (and not the manager) receives it;
    # named after this app, so no other app's cookie shadows it (``access.cookie_name``).
    cookie = (
        f"{access.cookie_name(session_id, app, secure=secure)}="
        f"{access.make_cookie(user_id, session_id, app)}; Path=/; HttpOnly; "
        f"SameSite=Lax; Max-Age={settings.BAI_APP_COOKIE_TTL}{'; Secure' if secure else ''}"
    )
    await send(
        {
            "type": "http.response.start",
            "status": 302,
            "headers": [
                (b"location", b"/"),
                (b"set-cookie", cookie.encode()),
                (b"cache-control", b"no-store"),
                (b"referrer-policy", b"no-referrer"),
                (b"content-length", b"0"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _tcp(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()  # websocket.connect
    parts = scope["path"].strip("/").split("/")
    user = await sync_to_async(access.resolve_token_user)(_header(scope, b"authorization"))
    target = None
    if user is not None and len(parts) == 4:
        target = await sync_to_async(access.resolve)(
            user_id=user.pk, session_id=parts[2], app=parts[3]
        )
    if target is None:
        await send({"type": "websocket.close", "code": 4404})
        return
    if not target.running:
        await send({"type": "websocket.close", "code": 4410})
        return
    try:
        tunnel = await tunnels.open_tunnel(target)
    except tunnels.TunnelFailed:
        await send({"type": "websocket.close", "code": 4502})
        return
    await send({"type": "websocket.accept"})
    await _activity(target.session_id)
    try:
        await forward.relay_bytes(receive, send, tunnel)
    finally:
        await tunnel.close()
        await _activity(target.session_id)
