"""``bai app``: a local TCP listener whose every connection is piped through the
apps proxy's raw-TCP websocket (``/_bai/tcp/<session>/<app>``) to a port of the
session's main kernel."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

CHUNK = 64 * 1024
CLOSE_REASONS = {
    4404: "no such app, or not yours",
    4410: "the session has ended",
    4502: "the app cannot be reached (nothing listens on its port?)",
}


def _loopback_socket(url: str) -> socket.socket | None:
    """A connection for a ``*.localhost`` host, which RFC 6761 sends to loopback
    (browsers do; the system resolver may not)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host != "localhost" and not host.endswith(".localhost"):
        return None
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return socket.create_connection(("127.0.0.1", port))


async def _pipe_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    url: str,
    token: str,
    log: Callable[[str], None],
) -> None:
    try:
        sock = _loopback_socket(url)
        async with connect(
            url,
            additional_headers={"Authorization": f"Token {token}"},
            sock=sock,
            max_size=None,
            compression=None,
        ) as ws:

            async def up() -> None:
                while chunk := await reader.read(CHUNK):
                    await ws.send(chunk)
                await ws.close()

            async def down() -> None:
                async for message in ws:
                    writer.write(message if isinstance(message, bytes) else message.encode())
                    await writer.drain()

            tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
            _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else None
        log(f"closed: {CLOSE_REASONS.get(code, f'code {code}')}")
    except Exception as exc:  # noqa: BLE001 - one connection failing never stops the listener
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 403:
            log("refused by the apps proxy: no such app, not yours, or the session ended")
        else:
            log(f"connection failed: {exc}")
    finally:
        writer.close()


async def serve(
    host: str,
    port: int,
    url: str,
    token: str,
    log: Callable[[str], None],
    ready: Callable[[int], None],
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _pipe_connection(reader, writer, url, token, log)

    server = await asyncio.start_server(handle, host, port)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()
