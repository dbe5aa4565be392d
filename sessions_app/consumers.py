"""Browser websockets: live session status (logs and terminal join later)."""

from __future__ import annotations

import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agent import protocol

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_GONE = 4410
CLOSE_BAD_INPUT = 4400


class SessionsConsumer(AsyncJsonWebsocketConsumer):
    """Pushes ``{"type": "sessions.changed", "sessions": [...]}`` for the user's sessions."""

    groups: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.group = protocol.user_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Nothing to ask of this stream; keep-alive pings are answered.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def sessions_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "sessions.changed", "sessions": event["sessions"]})
