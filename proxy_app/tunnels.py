"""Tunnels: one websocket from an agent per proxied connection.

The proxy asks the agent (``tunnel_open`` through the agent's gateway) to connect to
a kernel's port and to dial back ``/tunnel/<id>/`` here with a signed, short-lived
token; the waiting request takes the connection when it arrives. Bytes then flow in
binary frames between this process and the agent: no channel layer, no base64.
A tunnel lands in the process that asked for it (the URL names it: one daphne process
per ``BAI_APPS_TUNNEL_URL``).

HTTP requests reuse tunnels: once an exchange ends with both sides ready for the next
one (HTTP/1.1 keep-alive), its tunnel waits in ``pool`` for the next request to the
same kernel port, so a page's many small requests cost one websocket frame each way
instead of a new connection through the agent. An idle tunnel is watched: if the app
or the agent closes it, it leaves the pool; unused for ``IDLE_SECONDS`` it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.layers import get_channel_layer
from django.conf import settings
from django.core import signing

from agent import protocol

from .access import Target

logger = logging.getLogger(__name__)

TUNNEL_SALT = "bai.apps.tunnel"
TUNNEL_TOKEN_TTL = 90  # an app's start may take most of it
OPEN_TIMEOUT = 75.0

_waiting: dict[str, asyncio.Future[Tunnel]] = {}


class TunnelFailed(Exception):
    """The agent could not reach the app (or never dialled back)."""


class Tunnel:
    """The proxy's end of one agent websocket, driven by the request that asked for it."""

    def __init__(self, receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""  # the agent's words, e.g. "nothing listens on port 8000 …"
        self.finished = asyncio.Event()
        self.reused = False  # taken from the pool (it served an exchange before)
        # A receive the pool's watcher started while the tunnel was idle: the next
        # read takes its event, so nothing that arrived in between is lost.
        self._pending: asyncio.Future[dict[str, Any]] | None = None

    async def read(self) -> bytes | None:
        """The next bytes from the app, or None once the agent closed."""
        while not self.closed:
            if self._pending is not None:  # the pool's watcher was already waiting
                pending, self._pending = self._pending, None
                event = await pending
            else:
                event = await self._receive()
            if event["type"] == "websocket.receive":
                data = event.get("bytes")
                if data is None:
                    data = (event.get("text") or "").encode()
                if data:
                    return data
            elif event["type"] == "websocket.disconnect":
                self.closed = True
                self.close_code = event.get("code")
                self.close_reason = str(event.get("reason") or "")
        return None

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the app; to an agent already gone it is dropped, and the next
        ``read`` says the tunnel closed (the server raises OSError on such a send)."""
        if data and not self.closed:
            with contextlib.suppress(OSError):
                await self._send({"type": "websocket.send", "bytes": bytes(data)})

    async def close(self) -> None:
        """Close the tunnel (if the agent has not) and end its websocket's task, always."""
        try:
            if not self.closed:
                self.closed = True
                with contextlib.suppress(OSError):  # the agent's side is already gone
                    await self._send({"type": "websocket.close", "code": 1000})
        finally:
            if self._pending is not None:
                self._pending.cancel()
            self.finished.set()

    async def retire(self) -> None:
        """Close an idle tunnel; what it heard while idle (a close, a stray byte) is dropped."""
        pending = self._pending
        if pending is not None and pending.done() and not pending.cancelled():
            if pending.exception() is None and pending.result()["type"] == "websocket.disconnect":
                self.closed = True  # the agent already closed it
        await self.close()

    def watch(self) -> asyncio.Future[dict[str, Any]]:
        """Start waiting for the next event without taking it (see ``read``)."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        return self._pending


PoolKey = tuple[str | None, str, int]


class TunnelPool:
    """Idle HTTP tunnels per kernel port, for the next request (see the module's notes)."""

    IDLE_SECONDS = 30.0
    PER_PORT = 64  # idle tunnels kept per kernel port; more are closed

    def __init__(self) -> None:
        self._idle: dict[PoolKey, list[tuple[Tunnel, asyncio.Task[None]]]] = {}

    @staticmethod
    def key(target: Target) -> PoolKey:
        return (target.agent_id, target.kernel_id, target.app.port)

    def take(self, key: PoolKey) -> Tunnel | None:
        idle = self._idle.get(key)
        while idle:
            tunnel, watcher = idle.pop()
            if tunnel.closed or tunnel.watch().done():
                continue  # it closed (or sent a stray byte) while idle: its watcher retires it
            watcher.cancel()
            tunnel.reused = True
            return tunnel
        return None

    async def give(self, key: PoolKey, tunnel: Tunnel) -> None:
        if tunnel.closed or len(self._idle.get(key, ())) >= self.PER_PORT:
            await tunnel.close()
            return
        watcher = asyncio.create_task(self._watch(key, tunnel))
        self._idle.setdefault(key, []).append((tunnel, watcher))

    def forget(self) -> None:
        """Drop every idle tunnel without closing it (their event loop is gone)."""
        self._idle.clear()

    async def _watch(self, key: PoolKey, tunnel: Tunnel) -> None:
        """While idle, a tunnel should hear nothing: any frame or a close retires it."""
        await asyncio.wait({tunnel.watch()}, timeout=self.IDLE_SECONDS)
        idle = self._idle.get(key, [])
        idle[:] = [entry for entry in idle if entry[0] is not tunnel]
        if not idle:
            self._idle.pop(key, None)
        await tunnel.retire()


pool = TunnelPool()


async def open_tunnel(target: Target) -> Tunnel:
    if target.agent_id is None:
        raise TunnelFailed("the session's main kernel has no agent")
    tunnel_id = uuid.uuid4().hex
    future: asyncio.Future[Tunnel] = asyncio.get_running_loop().create_future()
    _waiting[tunnel_id] = future
    command = {
        "type": protocol.TUNNEL_OPEN,
        "tunnel_id": tunnel_id,
        "kernel_id": target.kernel_id,
        "port": target.app.port,
        "url": f"{settings.BAI_APPS_TUNNEL_URL.rstrip('/')}/tunnel/{tunnel_id}/",
        "token": signing.dumps(tunnel_id, salt=TUNNEL_SALT),
        "start_command": target.app.start_command,
        "app_token": target.secret,
    }
    try:
        await get_channel_layer().group_send(
            protocol.agent_group(target.agent_id), protocol.gw_agent_command(command)
        )
        tunnel = await asyncio.wait_for(future, OPEN_TIMEOUT)
    except TimeoutError:
        raise TunnelFailed("the kernel's agent did not connect in time") from None
    finally:
        _waiting.pop(tunnel_id, None)
    return tunnel


async def serve_agent_end(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/tunnel/<id>/``: an agent dials back; hand its websocket to the waiting request."""
    tunnel_id = scope["path"].strip("/").split("/")[-1]
    token = (parse_qs(scope.get("query_string", b"").decode()).get("token") or [""])[0]
    await receive()  # websocket.connect
    try:
        valid = signing.loads(token, salt=TUNNEL_SALT, max_age=TUNNEL_TOKEN_TTL) == tunnel_id
    except signing.BadSignature:
        valid = False
    future = _waiting.get(tunnel_id)
    if not valid or future is None or future.done():
        await send({"type": "websocket.close", "code": 4403})
        return
    await send({"type": "websocket.accept"})
    tunnel = Tunnel(receive, send)
    future.set_result(tunnel)
    await tunnel.finished.wait()
