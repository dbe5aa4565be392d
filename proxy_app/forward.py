"""Carrying a request over a tunnel: HTTP/1.1 (h11) and websockets (the sans-I/O
protocol of ``websockets``). Bodies stream both ways a chunk at a time."""

from __future__ import annotations

import asyncio
import contextlib
from http.cookies import SimpleCookie
from typing import Any

import h11
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from . import access, tunnels
from .access import Target
from .tunnels import Tunnel

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
}
# Never passed to an app: the manager's cookies (should a browser ever send them here);
# nor the apps origin's own (``access.is_access_cookie``).
PRIVATE_COOKIES = {"sessionid", "csrftoken", "__Host-sessionid", "__Host-csrftoken"}


class UpstreamError(Exception):
    pass


class CallerGone(Exception):
    """The caller went away while its answer was awaited or relayed: nothing more to do."""


def _cookie_header(value: bytes) -> bytes | None:
    jar = SimpleCookie()
    try:
        jar.load(value.decode("latin-1"))
    except Exception:
        return None
    kept = [
        f"{k}={m.coded_value}"
        for k, m in jar.items()
        if k not in PRIVATE_COOKIES and not access.is_access_cookie(k)
    ]
    return "; ".join(kept).encode("latin-1") if kept else None


def own_cookie_domain(scope: dict[str, Any]) -> str | None:
    """The one ``Domain`` an answer to this request may give its cookies: the app's own
    host name. None on any other host of the proxy (the inference router's bare apps
    host, whose subdomains are every user's apps): its answers' cookies stay host-only."""
    host = next((v for k, v in scope["headers"] if k.lower() == b"host"), b"")
    name = host.decode("latin-1").rsplit(":", 1)[0].lower()  # hosts are names, never IPv6
    return name if access.parse_host(name) is not None else None


def set_cookie_parts(set_cookie: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(name, [(attribute name in lower case, value)]) of a ``Set-Cookie``, read the way
    browsers read it (RFC 6265, 5.2: split at every ``;``, then each part at its first
    ``=``, blanks trimmed); None when it names no cookie.

    Not ``http.cookies``: it parses what a browser sends (``Cookie``), keeps a quoted
    value across a ``;`` (``a="x;Domain=localhost"``, where a browser sees a ``Domain``)
    and makes each unknown ``key=value`` attribute a cookie of its own."""
    pair, *attributes = set_cookie.split(";")
    name, sep, _ = pair.partition("=")
    if not sep or not name.strip():
        return None
    parts = [attribute.partition("=") for attribute in attributes]
    return name.strip(), [(key.strip().lower(), value.strip()) for key, _, value in parts]


def cookie_may_pass(set_cookie: bytes, own_domain: str | None) -> bool:
    """Whether an app's ``Set-Cookie`` reaches the browser: only a cookie of the app's own
    host. One with a wider ``Domain`` (the apps parent reaches every user's apps; the
    manager's host is a parent too, since cookies ignore ports) is dropped, and so is one
    without a name and one named like the proxy's own cookies. Every ``Domain`` counts,
    not only the last (which a browser takes)."""
    parsed = set_cookie_parts(set_cookie.decode("latin-1"))
    if parsed is None or access.is_access_cookie(parsed[0]):
        return False
    for key, value in parsed[1]:
        if key == "domain" and (
            own_domain is None or value.removeprefix(".").lower() != own_domain
        ):
            return False
    return True


def upstream_headers(scope: dict[str, Any], target: Target) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for name, value in scope["headers"]:
        name = name.lower()
        if name in HOP_BY_HOP or name == b"authorization" and target.secret:
            continue
        if name == b"cookie":
            value = _cookie_header(value)
            if value is None:
                continue
        out.append((name, value))
    if target.secret:  # an app the proxy started (Jupyter): it trusts this token
        out.append((b"authorization", b"token " + target.secret.encode()))
    client = scope.get("client")
    if client:
        out.append((b"x-forwarded-for", str(client[0]).encode()))
    return out


def _target(scope: dict[str, Any]) -> bytes:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return path + (b"?" + query if query else b"")


class StaleTunnel(UpstreamError):
    """A kept tunnel closed before answering: the request may go again on a new one."""


async def forward_http(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    tunnel: Tunnel,
    target: Target,
    first: dict[str, Any],
) -> bool:
    """One request (``first`` is its first body event) and its response over ``tunnel``.

    True when the exchange left the connection ready for another one (HTTP/1.1
    keep-alive), so the tunnel may serve the next request."""
    conn = h11.Connection(h11.CLIENT)
    headers = upstream_headers(scope, target)
    names = {n for n, _ in headers}
    body, more = first.get("body", b""), first.get("more_body", False)
    if b"content-length" not in names and (body or more):
        headers.append((b"transfer-encoding", b"chunked"))
    request = h11.Request(method=scope["method"], target=_target(scope), headers=headers)
    # What is at hand goes in one frame: the head, the body's first event and, when that
    # was all of it, the end (a request with its whole body is one frame, one agent write).
    out = conn.send(request)
    while True:
        if body:
            out += conn.send(h11.Data(data=body))
        if not more:
            break
        await tunnel.write(out)
        event = await receive()
        if event["type"] == "http.disconnect":
            raise UpstreamError("the browser went away")
        body, more = event.get("body", b""), event.get("more_body", False)
        out = b""
    await tunnel.write(out + conn.send(h11.EndOfMessage()))
    await _relay_while_caller_stays(conn, send, tunnel, receive, own_cookie_domain(scope))
    return conn.our_state is h11.DONE and conn.their_state is h11.DONE and not conn.trailing_data[0]


async def exchange(
    scope: dict[str, Any], receive: Any, send: Any, target: Target, first: dict[str, Any]
) -> None:
    """A request over a kept tunnel when one is idle, else a new one; kept again after.

    ``first`` is the request's first body event. A kept tunnel that turns out closed is
    replaced once, when the request can go again (its whole body was in ``first``)."""
    key = tunnels.pool.key(target)
    tunnel = tunnels.pool.take(key) or await tunnels.open_tunnel(target)
    reusable = False
    try:
        try:
            reusable = await forward_http(scope, receive, send, tunnel, target, first)
        except StaleTunnel:
            if first.get("more_body"):  # the body is gone with it: it cannot go again
                raise
            await tunnel.close()
            tunnel = await tunnels.open_tunnel(target)
            reusable = await forward_http(scope, receive, send, tunnel, target, first)
    finally:
        if reusable:
            await tunnels.pool.give(key, tunnel)
        else:
            await tunnel.close()


async def _relay_while_caller_stays(
    conn: h11.Connection, send: Any, tunnel: Tunnel, receive: Any, own_domain: str | None
) -> None:
    """``_relay_response``, given up with ``CallerGone`` as soon as the caller leaves.

    Once the request's body is in, the caller's next ``receive()`` is ``http.disconnect``,
    either when it leaves or when its answer is complete. A server may let ``send`` to a
    gone caller return without a word (uvicorn's does), so without this watch an answer
    that never ends (server-sent events) or never comes (a hung app) would hold its task
    and tunnel for ever. The watch is one task per request, cancelled with the answer."""
    relaying = asyncio.current_task()
    assert relaying is not None

    def on_event(watch: asyncio.Future[dict[str, Any]]) -> None:
        if relaying is not None and not watch.cancelled() and watch.exception() is None:
            if watch.result().get("type") == "http.disconnect":
                relaying.cancel()

    watch = asyncio.ensure_future(receive())
    watch.add_done_callback(on_event)
    try:
        await _relay_response(conn, send, tunnel, own_domain)
    except asyncio.CancelledError:
        if watch.done() and relaying.uncancel() == 0:
            raise CallerGone("the caller went away") from None
        raise
    finally:
        relaying = None  # the answer is complete: a disconnect now cancels nothing
        watch.cancel()


async def _relay_response(
    conn: h11.Connection, send: Any, tunnel: Tunnel, own_domain: str | None
) -> None:
    started = False
    ahead: Any = None  # an event already taken from ``conn`` (see h11.Data below)
    while True:
        event, ahead = (conn.next_event() if ahead is None else ahead), None
        if event is h11.NEED_DATA:
            data = await tunnel.read()
            if data is None and not started:
                if tunnel.reused and tunnel.close_code != 4502:
                    raise StaleTunnel("the kept connection had closed")
                raise UpstreamError(
                    "the app could not be reached"
                    if tunnel.close_code == 4502
                    else "the app closed the connection without an answer"
                )
            conn.receive_data(data or b"")
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            kept = [
                (n, v)
                for n, v in event.headers
                if n.lower() not in HOP_BY_HOP
                and (n.lower() != b"set-cookie" or cookie_may_pass(v, own_domain))
            ]
            await send(
                {"type": "http.response.start", "status": event.status_code, "headers": kept}
            )
            started = True
        elif isinstance(event, h11.Data):
            # The response's end, when it is already at hand, goes with this chunk: one send
            # instead of two. Nothing is waited for: a chunk goes on as soon as it came.
            ahead = conn.next_event()
            if isinstance(ahead, h11.EndOfMessage | h11.ConnectionClosed):
                last = {"type": "http.response.body", "body": bytes(event.data), "more_body": False}
                await send(last)
                return
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            if ahead is h11.NEED_DATA:
                ahead = None
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return


async def forward_websocket(
    scope: dict[str, Any], receive: Any, send: Any, tunnel: Tunnel, target: Target
) -> None:
    """A browser websocket (already connected, not yet accepted) to the app."""
    host = dict(scope["headers"]).get(b"host", b"app").decode("latin-1")
    path = _target(scope).decode("latin-1")
    protocols = [
        p.strip()
        for name, value in scope["headers"]
        if name.lower() == b"sec-websocket-protocol"
        for p in value.decode("latin-1").split(",")
        if p.strip()
    ]
    proto = ClientProtocol(
        parse_uri(f"ws://{host}{path}"), subprotocols=protocols or None, max_size=None
    )
    request = proto.connect()
    for name, value in upstream_headers(scope, target):
        if name in (b"host",):
            continue
        request.headers[name.decode("latin-1")] = value.decode("latin-1")
    proto.send_request(request)
    await tunnel.write(b"".join(proto.data_to_send()))
    response: Response | None = None
    # Frames read together with the 101 answer: an app that sends as soon as it accepted
    # has its first messages in the same read. They go to the browser first.
    early: list[Frame] = []
    while response is None:
        data = await tunnel.read()
        if data is None:
            await send({"type": "websocket.close", "code": 1011})
            return
        proto.receive_data(data)
        for event in proto.events_received():
            if isinstance(event, Response):
                response = event
            elif response is not None and isinstance(event, Frame):
                early.append(event)
    if response.status_code != 101 or proto.handshake_exc is not None:
        await send({"type": "websocket.close", "code": 1011})
        return
    accept: dict[str, Any] = {"type": "websocket.accept"}
    if proto.subprotocol:
        accept["subprotocol"] = proto.subprotocol
    await send(accept)

    async def to_app() -> None:
        while True:
            event = await receive()
            if event["type"] == "websocket.receive":
                if event.get("text") is not None:
                    proto.send_text(event["text"].encode())
                else:
                    proto.send_binary(event.get("bytes") or b"")
            elif event["type"] == "websocket.disconnect":
                with contextlib.suppress(Exception):
                    proto.send_close(1000)
                    await tunnel.write(b"".join(proto.data_to_send()))
                return
            await tunnel.write(b"".join(proto.data_to_send()))

    async def to_browser() -> None:
        parts: list[bytes] = []
        kind = Opcode.TEXT
        frames = early
        while True:
            for frame in frames:
                if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                    kind, parts = frame.opcode, [frame.data]
                elif frame.opcode == Opcode.CONT:
                    parts.append(frame.data)
                elif frame.opcode == Opcode.CLOSE:
                    return
                else:
                    continue
                if frame.fin:
                    payload = b"".join(parts)
                    parts = []
                    if kind == Opcode.TEXT:
                        await send({"type": "websocket.send", "text": payload.decode()})
                    else:
                        await send({"type": "websocket.send", "bytes": payload})
            pending = proto.data_to_send()
            if pending:
                await tunnel.write(b"".join(pending))
            data = await tunnel.read()
            if data is None:
                return
            proto.receive_data(data)
            frames = [event for event in proto.events_received() if isinstance(event, Frame)]

    await _pump_both(send, to_app(), to_browser())


async def relay_bytes(receive: Any, send: Any, tunnel: Tunnel) -> None:
    """A websocket of the ``bai`` client carrying a TCP connection, byte for byte."""

    async def up() -> None:
        while True:
            event = await receive()
            if event["type"] == "websocket.disconnect":
                return
            data = event.get("bytes")
            if data is None:
                data = (event.get("text") or "").encode()
            await tunnel.write(data)

    async def down() -> None:
        while True:
            data = await tunnel.read()
            if data is None:
                return
            await send({"type": "websocket.send", "bytes": data})

    await _pump_both(send, up(), down())


async def _pump_both(send: Any, *pumps: Any) -> None:
    """Run both directions of a relay; when either ends, stop the other and close the websocket."""
    tasks = [asyncio.create_task(pump) for pump in pumps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with contextlib.suppress(Exception):
        await send({"type": "websocket.close", "code": 1000})
