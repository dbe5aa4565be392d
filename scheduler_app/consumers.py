"""The agent gateway: one websocket per agent at /ws/agent/.

Agents authenticate with ``Authorization: Token <token>`` (stored hashed),
register, then heartbeat; every heartbeat is answered with the commands that
close the gap between desired state (database) and the agent's report. The
channel-layer group of the agent carries the fast path: scheduler nudges and
browser commands (logs, terminals) in, streams out to their browser groups.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from agent import protocol
from backendai_web.websockets import LoopDispatch

from . import reconcile

logger = logging.getLogger(__name__)


def _db(func):  # type: ignore[no-untyped-def]
    """Run ORM work in the shared thread pool, not the single thread-sensitive
    executor: many agents report at once, and one slow call must not queue
    every other agent's work behind it."""
    return database_sync_to_async(func, thread_sensitive=False)


class AgentGatewayConsumer(LoopDispatch, AsyncJsonWebsocketConsumer):
    """Terminal output goes straight to the channels of the browser consumers that
    sent the terminal's commands (``reply``), not through the terminal's group:
    one direct send per frame, and none through Redis when the browser consumer
    is in this process. A terminal with no known consumer (e.g. after this
    connection replaced another) falls back to its group."""

    agent_id: str | None = None
    group: str | None = None

    async def connect(self) -> None:
        headers = dict(self.scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        token = auth[6:].strip() if auth.lower().startswith("token ") else ""
        await self.accept()
        try:
            agent = await _db(reconcile.agent_authenticate)(token=token)
        except reconcile.AgentRefused as exc:
            client = self.scope.get("client") or ("?", 0)
            logger.warning("agent connection from %s refused: %s", client[0], exc)
            await self.send_json({"type": protocol.ERROR, "message": str(exc)})
            await self.close(code=protocol.CLOSE_BAD_TOKEN)
            return
        self.agent_id = agent.pk
        self.term_routes: dict[str, set[str]] = {}

    async def disconnect(self, code: int) -> None:
        # The browser consumers that sent here go back to the agent's group
        # (where the next connection of this agent will be).
        routes = getattr(self, "term_routes", {})
        for channel in {c for channels in routes.values() for c in channels}:
            await self.channel_layer.send(
                channel, protocol.gw_term_route(None, sender=self.channel_name)
            )
        routes.clear()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.agent_id and self.group:
            await _db(reconcile.agent_disconnected)(agent_id=self.agent_id)
            logger.info("agent %s disconnected (code %s)", self.agent_id, code)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.agent_id is None:
            return
        kind = content.get("type") if isinstance(content, dict) else None
        if self.group is None and kind != protocol.REGISTER:
            await self._refuse("the first message must be register")
            return
        handler = self._handlers.get(kind or "")
        if handler is None:
            await self.send_json(
                {"type": protocol.ERROR, "message": f"unknown message type {kind!r}"}
            )
            return
        await handler(self, content)

    async def _refuse(self, message: str) -> None:
        await self.send_json({"type": protocol.ERROR, "message": message})
        await self.close(code=protocol.CLOSE_PROTOCOL)

    # --- agent -> manager --------------------------------------------------

    async def _on_register(self, msg: dict[str, Any]) -> None:
        if msg.get("protocol") not in (None, protocol.PROTOCOL_VERSION):
            await self._refuse(f"unsupported protocol {msg.get('protocol')!r}")
            return
        from sessions_app.models import Agent

        try:
            agent = await _db(
                lambda: reconcile.agent_register(
                    agent=Agent.objects.get(pk=self.agent_id), info=msg
                )
            )()
        except reconcile.AgentRefused as exc:
            await self._refuse(str(exc))
            return
        self.group = protocol.agent_group(agent.pk)
        # Only one live connection per agent: the newest one wins.
        await self.channel_layer.group_send(
            self.group, {"type": protocol.GW_AGENT_REPLACED, "channel": self.channel_name}
        )
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.send_json(
            {
                "type": protocol.REGISTERED,
                "agent_id": agent.pk,
                "heartbeat_interval": settings.BAI_AGENT_HEARTBEAT_INTERVAL,
                "log_tail_bytes": settings.BAI_LOG_TAIL_BYTES,
            }
        )
        await self._reconcile(msg.get("kernels") or [])

    async def _on_heartbeat(self, msg: dict[str, Any]) -> None:
        await self._reconcile(msg.get("kernels") or [])

    async def _reconcile(self, reports: list[dict[str, Any]] | None) -> None:
        commands = await _db(reconcile.agent_reconcile)(agent_id=self.agent_id, reports=reports)
        for command in commands:
            await self.send_json(command)

    async def _on_kernel_status(self, msg: dict[str, Any]) -> None:
        await _db(reconcile.agent_kernel_report)(agent_id=self.agent_id, report=msg)

    async def _on_log_chunk(self, msg: dict[str, Any]) -> None:
        await self.channel_layer.group_send(
            protocol.log_stream_group(str(msg.get("stream_id"))),
            {
                "type": protocol.GW_LOGS_CHUNK,
                "kernel_id": msg.get("kernel_id"),
                "data": msg.get("data", ""),
            },
        )

    async def _on_log_tail(self, msg: dict[str, Any]) -> None:
        await _db(reconcile.kernel_store_log_tail)(
            agent_id=self.agent_id,
            kernel_id=str(msg.get("kernel_id")),
            data=str(msg.get("data", "")),
        )

    async def _on_term_output(self, msg: dict[str, Any]) -> None:
        await self._to_terminal(
            str(msg.get("term_id")), {"type": protocol.GW_TERM_OUTPUT, "data": msg.get("data", "")}
        )

    async def _on_term_closed(self, msg: dict[str, Any]) -> None:
        term_id = str(msg.get("term_id"))
        await self._to_terminal(
            term_id, {"type": protocol.GW_TERM_CLOSED, "reason": msg.get("reason", "")}
        )
        self.term_routes.pop(term_id, None)

    async def _to_terminal(self, term_id: str, event: dict[str, Any]) -> None:
        channels = self.term_routes.get(term_id)
        if channels:
            for channel in channels:
                await self.channel_layer.send(channel, event)
        else:
            await self.channel_layer.group_send(protocol.terminal_group(term_id), event)

    async def _on_error(self, msg: dict[str, Any]) -> None:
        logger.warning("agent %s reports: %s", self.agent_id, msg.get("message"))

    _handlers = {
        protocol.REGISTER: _on_register,
        protocol.HEARTBEAT: _on_heartbeat,
        protocol.KERNEL_STATUS: _on_kernel_status,
        protocol.LOG_CHUNK: _on_log_chunk,
        protocol.LOG_TAIL: _on_log_tail,
        protocol.TERM_OUTPUT: _on_term_output,
        protocol.TERM_CLOSED: _on_term_closed,
        protocol.ERROR: _on_error,
    }

    # --- channel layer -> agent --------------------------------------------

    async def agent_command(self, event: dict[str, Any]) -> None:
        command = event["command"]
        reply = event.get("reply")
        term_id = command.get("term_id") if reply else None
        if term_id is None:
            await self.send_json(command)
            return
        # A browser terminal consumer: remember where this terminal's output goes.
        if command.get("type") in (protocol.TERM_DETACH, protocol.TERM_CLOSE):
            channels = self.term_routes.get(term_id)
            if channels is not None:
                channels.discard(reply)
                if not channels:
                    del self.term_routes[term_id]
            await self.send_json(command)
            return
        self.term_routes.setdefault(term_id, set()).add(reply)
        await self.send_json(command)
        if event.get("ack") is not None:
            # It came through the group: say where to send from now on.
            await self.channel_layer.send(
                reply, protocol.gw_term_route(self.channel_name, ack=event["ack"])
            )

    async def agent_reconcile(self, event: dict[str, Any]) -> None:
        await self._reconcile(None)

    async def agent_replaced(self, event: dict[str, Any]) -> None:
        if event.get("channel") != self.channel_name:
            logger.info("agent %s: a newer connection took over", self.agent_id)
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None
            await self.close(code=protocol.CLOSE_REPLACED)
