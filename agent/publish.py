"""One port of a kernel published on the agent's host (an SFTP session's server).

The agent listens on its public address (``--public-address``, 127.0.0.1 unless its admin
says otherwise) on a free port the kernel gets, and carries every connection there to the
kernel's port at its address on the session bridge, bytes both ways. Each direction is one
thread that moves the bytes inside the kernel with ``splice(2)`` through a pipe (1 MiB at a
time, never copied into Python), so a 1 GB transfer costs the agent a few hundred ms of CPU
instead of the seconds an asyncio copy loop spent on small reads; where splice is refused it
falls back to ``recv_into``/``sendall`` with one 256 KiB buffer. At most ``MAX_CONNECTIONS``
are carried at once (two threads each); more are closed at once. The open connections and the
time since the last one ended are the kernel's activity: they go to the manager in the
kernel's report (``sftp`` of protocol.KERNEL_REPORT), where they keep the idle timeout away.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 256 * 1024  # the fallback copy's buffer
SPLICE_CHUNK = 1 << 20  # bytes per splice(2); the pipe is grown to this where the kernel allows
CONNECT_TIMEOUT = 3.0
MAX_CONNECTIONS = 64  # carried at once per published port; an SFTP client opens one or two


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then end ``dst``'s sending side. Blocking;
    run in a thread of its own. Errors end the copy quietly (the peer went away)."""
    moved = [0]
    try:
        try:
            _splice(src, dst, moved)
        except OSError as exc:
            # Refused for these sockets (never the case on Linux for TCP, but cheap to keep):
            # copy instead, unless bytes already went through the pipe.
            if moved[0] or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            _copy(src, dst)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        # One side is gone: end both, so the other direction's thread stops too.
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _splice(src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, SPLICE_CHUNK)
        fin, fout = src.fileno(), dst.fileno()
        while True:
            n = os.splice(fin, write_end, SPLICE_CHUNK, flags=os.SPLICE_F_MOVE)
            if n == 0:
                return
            moved[0] += n
            while n:
                n -= os.splice(read_end, fout, n, flags=os.SPLICE_F_MOVE)
    finally:
        os.close(read_end)
        os.close(write_end)


def _copy(src: socket.socket, dst: socket.socket) -> None:
    buffer = memoryview(bytearray(CHUNK))
    while n := src.recv_into(buffer):
        dst.sendall(buffer[:n])


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
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sockets: set[socket.socket] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.address, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, where = infos[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(where)
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(listener))
        log.info(
            "published %s:%s -> %s:%s", self.address, self.port, self.target[0], self.target[1]
        )
        return self.port

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        carried: set[asyncio.Task[None]] = set()
        while True:
            try:
                client, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if listener.fileno() < 0:
                    return
                log.info("published port %s: accept failed: %s", self.port, exc)
                await asyncio.sleep(0.1)
                continue
            if self.connections >= MAX_CONNECTIONS:
                log.warning(
                    "published port %s: %s connections open, refusing one",
                    self.port,
                    MAX_CONNECTIONS,
                )
                client.close()
                continue
            task = asyncio.create_task(self._serve(client))
            carried.add(task)
            task.add_done_callback(carried.discard)

    async def _serve(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.connections += 1
        self._sockets.add(client)
        self.changed()
        upstream: socket.socket | None = None
        try:
            client.setblocking(False)
            upstream = socket.socket(socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET)
            self._sockets.add(upstream)
            upstream.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(upstream, self.target), CONNECT_TIMEOUT)
            client.setblocking(True)
            upstream.setblocking(True)
            ends = []
            for src, dst in ((client, upstream), (upstream, client)):
                done = loop.create_future()
                ends.append(done)
                threading.Thread(
                    target=self._run_pump,
                    args=(src, dst, loop, done),
                    daemon=True,
                    name=f"publish-{self.port}",
                ).start()
            await asyncio.gather(*ends)
        except (OSError, TimeoutError) as exc:
            log.info("published port %s: cannot reach the kernel: %s", self.port, exc)
        finally:
            for s in (client, upstream):
                if s is not None:
                    self._sockets.discard(s)
                    s.close()
            self.connections -= 1
            self.last_ended = time.monotonic()
            self.changed()

    @staticmethod
    def _run_pump(
        src: socket.socket,
        dst: socket.socket,
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[None],
    ) -> None:
        try:
            _pump(src, dst)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

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
        listener, self._listener = self._listener, None
        accepting, self._accepting = self._accepting, None
        if listener is not None:
            listener.close()
        if accepting is not None:
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(accepting, 2)
        # Ending both sides wakes the threads' splice; each connection's task then closes them.
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
