"""agent.publish: a kernel's port published on the agent's host, carried by splice threads."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os

import pytest

from agent import publish
from agent.publish import PublishedPort


async def _echo_server() -> tuple[asyncio.base_events.Server, int, list[bytes]]:
    """A target that answers each connection with the SHA-256 of what it read, after EOF."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # to EOF: the relay must pass the client's half-close on
        received.append(data)
        writer.write(hashlib.sha256(data).digest() + data[:1024])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], received


async def _published(target_port: int, changes: list[int]) -> PublishedPort:
    port = PublishedPort("127.0.0.1", "127.0.0.1", ("127.0.0.1", target_port))
    port.changed = lambda: changes.append(port.connections)
    await port.start()
    return port


@pytest.fixture(params=["splice", "copy"])
def mover(request, monkeypatch) -> str:
    """Both ways of moving the bytes: splice(2), and the copy loop used where it is refused."""
    if request.param == "copy":

        def refused(*args, **kwargs):
            raise OSError(errno.EINVAL, "splice refused")

        monkeypatch.setattr(publish.os, "splice", refused)
    return request.param


async def test_it_carries_bytes_both_ways_and_passes_the_clients_end_on(mover) -> None:
    server, target, received = await _echo_server()
    changes: list[int] = []
    port = await _published(target, changes)
    payload = os.urandom(8 * 2**20 + 12345)  # several splice rounds, an odd tail
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer == hashlib.sha256(payload).digest() + payload[:1024]
        assert received == [payload]
        await asyncio.wait_for(_until(lambda: port.connections == 0), 5)
        assert changes == [1, 0]  # opened, then ended: the agent reports both
        assert port.wire()["connections"] == 0 and port.wire()["idle_for"] is not None
    finally:
        await port.close()
        server.close()


async def test_it_counts_open_connections_and_close_ends_them() -> None:
    server, target, _ = await _echo_server()
    changes: list[int] = []
    port = await _published(target, changes)
    try:
        conns = [await asyncio.open_connection("127.0.0.1", port.port) for _ in range(3)]
        await asyncio.wait_for(_until(lambda: port.connections == 3), 5)
        assert port.wire()["connections"] == 3 and port.wire()["idle_for"] == 0.0
    finally:
        await port.close()
        server.close()
    for reader, writer in conns:
        # The relay ended them: each client sees its end instead of hanging.
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    await asyncio.wait_for(_until(lambda: port.connections == 0), 5)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port.port)


async def test_a_connection_past_the_bound_is_closed_at_once(monkeypatch) -> None:
    monkeypatch.setattr(publish, "MAX_CONNECTIONS", 1)
    server, target, _ = await _echo_server()
    port = await _published(target, [])
    try:
        first = await asyncio.open_connection("127.0.0.1", port.port)
        await asyncio.wait_for(_until(lambda: port.connections == 1), 5)
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert port.connections == 1
        first[1].write(b"still carried")
        first[1].write_eof()
        assert (await asyncio.wait_for(first[0].read(), 5)).endswith(b"still carried")
    finally:
        await port.close()
        server.close()


async def test_an_unreachable_kernel_ends_the_connection() -> None:
    server, target, _ = await _echo_server()
    server.close()
    await server.wait_closed()
    port = await _published(target, [])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await asyncio.wait_for(_until(lambda: port.connections == 0), 5)
    finally:
        await port.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.02)
