"""One proxied connection to a kernel's service port (``tunnel_open``).

The agent connects to the port (the container's address on its session bridge, or
the loopback of the session's own network namespace for the process backend, never the
host's: ``Backend.open_service``), then dials the apps proxy with a websocket of its
own for this one connection, and carries bytes both ways in binary frames. Nothing
of it passes through the manager's channel layer. Each direction holds at most one
read (64 KiB) in flight: it reads again only once the other side took the last
chunk (``drain`` on the TCP side, the websocket's own write buffer on the other), so
a slow reader slows the sender instead of filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from agent import protocol
from agent.backends.base import Backend, KernelError

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
CONNECT_TIMEOUT = 3.0
APP_START_TIMEOUT = 60.0  # how long a started app may take to listen


async def _dial(
    backend: Backend, kernel_id: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        backend.open_service(kernel_id, port, CHUNK), timeout=CONNECT_TIMEOUT
    )


async def _reach(backend: Backend, msg: dict[str, Any]) -> tuple[Any, Any]:
    """Connect to the kernel's port, starting its app first when nothing listens."""
    host, port = await backend.service_address(msg["kernel_id"], msg["port"])
    try:
        return await _dial(backend, msg["kernel_id"], port)
    except (OSError, TimeoutError):
        if not msg.get("start_command"):
            raise KernelError(f"nothing listens on port {port} of the kernel") from None
    await backend.start_app(
        msg["kernel_id"],
        msg["start_command"],
        {
            "BAI_APP_BIND": "127.0.0.1" if host == "127.0.0.1" else "0.0.0.0",  # noqa: S104
            "BAI_APP_PORT": str(port),
            "BAI_APP_TOKEN": msg.get("app_token") or "",
        },
    )
    deadline = time.monotonic() + APP_START_TIMEOUT
    delay = 0.05
    while True:
        try:
            return await _dial(backend, msg["kernel_id"], port)
        except (OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise KernelError(
                    f"the app did not listen on port {port} within {APP_START_TIMEOUT:.0f} s"
                ) from None
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)


async def run_tunnel(backend: Backend, msg: dict[str, Any]) -> None:
    """Carry one connection; never raises (a failure is told to the proxy)."""
    refusal = protocol.validate_command(msg)
    if refusal:
        log.warning("refusing tunnel_open: %s", refusal)
        return
    url = f"{msg['url']}?token={msg['token']}"
    try:
        reader, writer = await _reach(backend, msg)
    except (KernelError, OSError) as exc:
        log.info("tunnel %s: %s", msg["tunnel_id"], exc)
        with contextlib.suppress(OSError, WebSocketException, TimeoutError):
            async with connect(url, open_timeout=CONNECT_TIMEOUT) as ws:
                await ws.close(code=protocol.TUNNEL_FAILED, reason=str(exc)[:120])
        return
    try:
        async with connect(
            url, open_timeout=CONNECT_TIMEOUT, max_size=CHUNK * 4, compression=None, max_queue=4
        ) as ws:
            await _pump(ws, reader, writer)
    except (OSError, WebSocketException, TimeoutError) as exc:
        log.info("tunnel %s ended: %s", msg["tunnel_id"], exc)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _pump(
    ws: ClientConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    async def up() -> None:  # kernel -> proxy
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            await ws.send(data)

    async def down() -> None:  # proxy -> kernel
        with contextlib.suppress(ConnectionClosed):
            async for frame in ws:
                writer.write(frame if isinstance(frame, bytes) else frame.encode())
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done:
            # The kernel closed its side: say so, let the proxy finish reading.
            await ws.close()
        else:
            await asyncio.wait_for(tasks[0], timeout=5)
    except (TimeoutError, ConnectionClosed, OSError):
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
