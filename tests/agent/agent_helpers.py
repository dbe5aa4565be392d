"""Helpers shared by the agent's tests: a frame collector, a fake manager, kernel specs."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from agent import protocol


class Frames:
    """Collects the frames a backend emits, and waits for the one a test expects."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def __call__(self, frame: dict[str, Any]) -> None:
        self.seen.append(frame)
        self._changed.set()

    async def wait_for(self, timeout: float = 10.0, **match: Any) -> dict[str, Any]:
        """The first frame (seen or to come) whose fields equal ``match``."""
        async with asyncio.timeout(timeout):
            start = 0
            while True:
                for frame in self.seen[start:]:
                    if all(frame.get(k) == v for k, v in match.items()):
                        return frame
                start = len(self.seen)
                self._changed.clear()
                await self._changed.wait()

    def text(self, term_id: str) -> str:
        return "".join(
            f["data"]
            for f in self.seen
            if f["type"] == protocol.TERM_OUTPUT and f["term_id"] == term_id
        )

    async def wait_text(self, term_id: str, needle: str, timeout: float = 10.0) -> str:
        async with asyncio.timeout(timeout):
            while needle not in self.text(term_id):
                self._changed.clear()
                await self._changed.wait()
        return self.text(term_id)


class FakeManager:
    """A websocket server that speaks the manager's side of agent/protocol.py."""

    def __init__(self, token: str = "good-token", heartbeat_interval: float = 0.2) -> None:
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self.settings: dict[str, Any] = {}  # more fields of its "registered" answer
        self.frames = Frames()
        self.connections: list[ServerConnection] = []
        self.auth_headers: list[str | None] = []
        self.server = None
        self.url = ""

    async def start(self) -> None:
        self.server = await serve(self._handler, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}"

    async def _handler(self, ws: ServerConnection) -> None:
        auth = ws.request.headers.get("Authorization")
        self.auth_headers.append(auth)
        if auth != f"Token {self.token}":
            await ws.close(protocol.CLOSE_BAD_TOKEN, "unknown token")
            return
        self.connections.append(ws)
        async for raw in ws:
            msg = json.loads(raw)
            msg["_conn"] = len(self.connections)
            self.frames(msg)
            if msg["type"] == protocol.REGISTER:
                await ws.send(
                    json.dumps(
                        {
                            "type": protocol.REGISTERED,
                            "agent_id": "agent-under-test",
                            "heartbeat_interval": self.heartbeat_interval,
                            **self.settings,
                        }
                    )
                )

    async def send(self, msg: dict[str, Any]) -> None:
        await self.connections[-1].send(json.dumps(msg))

    async def drop(self) -> None:
        """Close the current connection as if the manager restarted."""
        await self.connections[-1].close(1012, "restarting")

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def _env(hostname: str, session_id: str, kernel_id: str) -> dict[str, str]:
    return {
        "BACKENDAI_CLUSTER_HOST": hostname,
        "BACKENDAI_CLUSTER_HOSTS": "main1,sub1",
        "BACKENDAI_CLUSTER_IDX": "1",
        "BACKENDAI_CLUSTER_MODE": "single-node",
        "BACKENDAI_CLUSTER_ROLE": "main" if hostname.startswith("main") else "sub",
        "BACKENDAI_CLUSTER_SIZE": "2",
        "BACKENDAI_KERNEL_ID": kernel_id,
        "BACKENDAI_SESSION_ID": session_id,
    }


def spec(
    *hosts: str, command: str | None = None, mounts: list | None = None, session_id: str = ""
) -> dict:
    session_id = session_id or uuid.uuid4().hex
    kernels = []
    for host in hosts or ("main1",):
        kernel_id = session_id if host == "main1" else uuid.uuid4().hex
        kernels.append(
            {
                "kernel_id": kernel_id,
                "hostname": host,
                "role": "main" if host == "main1" else "sub",
                "image": "native",
                "slots": {"cpu": "1", "mem": "268435456"},
                "env": _env(host, session_id, kernel_id),
                "mounts": mounts or [],
                "startup_command": command if host == "main1" else None,
                "cluster_hosts": list(hosts or ("main1",)),
            }
        )
    return {
        "type": protocol.CREATE_KERNELS,
        "session_id": session_id,
        "network": f"bai-{session_id}",
        "cluster_mode": "single-node",
        "session_type": "batch" if command else "interactive",
        "ssh": None,
        "kernels": kernels,
    }
