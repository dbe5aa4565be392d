"""What every websocket consumer of the project shares (the browser ones in
``sessions_app.consumers`` and the agent gateway in ``scheduler_app.consumers``)."""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name

from . import metrics


class LoopDispatch:
    """Dispatch without Channels' per-message ``aclose_old_connections()``.

    Channels (4.2+) runs ``close_old_connections`` through the one thread-sensitive
    executor before *every* handler: every keystroke, every output frame, every
    agent command of every consumer in the process then waits its turn on that
    single thread, behind whatever database call sits there (a session touch that
    opens a connection takes ~10 ms). These consumers never use the ORM on the
    event loop: their queries go through ``database_sync_to_async``, which closes
    its connections itself, so the hop guards nothing here.
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


class OpenSockets:
    """Counts this consumer's socket in ``bai_websockets_open{kind=socket_kind}``
    from its accept to its disconnect (``backendai_web.metrics``)."""

    socket_kind = "other"
    _counted = False

    async def accept(self, *args: Any, **kwargs: Any) -> None:
        await super().accept(*args, **kwargs)  # type: ignore[misc]
        if not self._counted:
            self._counted = True
            metrics.hold("bai_websockets_open", 1, kind=self.socket_kind)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        if self._counted:
            self._counted = False
            metrics.hold("bai_websockets_open", -1, kind=self.socket_kind)
        await super().websocket_disconnect(message)  # type: ignore[misc]
