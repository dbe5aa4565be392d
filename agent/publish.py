"""One port of a kernel published on the agent's host (an SFTP session's server).

The agent listens on its public address (``--public-address``, 127.0.0.1 unless its admin
says otherwise) on a free port the kernel gets, and carries every connection there to the
kernel's port at its address on the session bridge, bytes both ways, one task per
direction, each with at most one read (256 KiB) in flight. The open connections and the
time since the last one ended are the kernel's activity: they go to the manager in the
kernel's report (``sftp`` of protocol.KERNEL_REPORT), where they keep the idle timeout away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
CONNECT_TIMEOUT = 3.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        pass


class PublishedPort:
    """A listener on ``address``:free port forwarding to ``target``; ``changed`` is called
    whenever a connection opens or ends (the agent reports the kernel then)."""

    def __init__(
        self,
        address: str,
        advertised_host: str,
        target: tuple[str, int],
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.address = address
        self.advertised_host = advertised_host
        self.target = target
        self.changed = changed
        self.port = 0
        self.connections = 0
        self.last_ended: float | None = None
        self.host_key_fingerprint = ""
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._serve, host=self.address, port=0, limit=CHUNK, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "published %s:%s -> %s:%s", self.address, self.port, self.target[0], self.target[1]
        )
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        self.changed()
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.wait_for(
                asyncio.open_connection(*self.target, limit=CHUNK), CONNECT_TIMEOUT
            )
            self._writers.add(upstream)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, TimeoutError) as exc:
            log.info("published port %s: cannot reach the kernel: %s", self.port, exc)
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
            self.connections -= 1
            self.last_ended = time.monotonic()
            self.changed()

    async def wait_target(self, timeout: float) -> bool:
        """Whether the kernel's port accepts a connection within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, probe = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.1)
                continue
            probe.close()
            return True

    def wire(self) -> dict[str, Any]:
        """This port as a kernel report carries it (protocol.SFTP_REPORT)."""
        idle = None if self.last_ended is None else round(time.monotonic() - self.last_ended, 3)
        return {
            "host": self.advertised_host,
            "port": self.port,
            "host_key_fingerprint": self.host_key_fingerprint,
            "connections": self.connections,
            "idle_for": 0.0 if self.connections else idle,
        }

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)
