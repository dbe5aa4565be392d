"""The channel layer: channels_redis's pub/sub layer, with local sends kept local.

A ``send()`` to a channel of this very process (the channel name is in the
loop layer's own table) is put on that channel's queue directly instead of
going out to Redis and coming back on the subscriber connection. Channel names
are unique to the process that made them, so no other process could have
received the message: delivery is the same, minus two Redis hops, the wait
for the layer's one publish lock (the stock layer awaits every PUBLISH round
trip under a single lock per Redis host, so every send of the process queues
behind every other) and the subscriber connection's one-message-at-a-time
reader. Everything else (groups, other processes' channels) is unchanged.

The terminal path uses it: the browser consumer and the agent gateway address
each other by channel name once they know it (see the consumers), so with both
in one daphne process a keystroke and its echo never touch Redis.

A group of one member can be kept local too: an agent's gateway, the one live
connection of its agent (the newest wins), claims its agent's group
(``claim_group``), and a ``group_send`` to that group from this process goes
straight to the gateway's queue (a code run's command, for one). Sends from other
processes, and to groups nobody here claimed, go through Redis as before. A claim
ends when the gateway lets go of the group (``release_group``); while a newer
connection of the same agent registers in another process, a command sent here
still reaches the old connection, as a group send would, and hears that it
closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer
from channels_redis.utils import _wrap_close


class LocalFirstLoopLayer(RedisPubSubLoopLayer):  # type: ignore[misc]
    async def send(self, channel: str, message: dict[str, Any]) -> None:
        queue = self.channels.get(channel)
        if queue is not None:
            # Serialized as on the wire: the receiver gets its own copy, as ever.
            queue.put_nowait(self.channel_layer.serialize(message))
            return
        await super().send(channel, message)


class LocalFirstPubSubChannelLayer(RedisPubSubChannelLayer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims: dict[str, str] = {}  # group -> its one member, a channel of this process

    def claim_group(self, group: str, channel: str) -> None:
        """``channel`` (of this process) is from now on the one member of ``group``."""
        self.claims[group] = channel

    def release_group(self, group: str, channel: str) -> None:
        if self.claims.get(group) == channel:
            del self.claims[group]

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        layer = self._get_layer()
        channel = self.claims.get(group)
        if channel is not None and channel in layer.channels:
            await layer.send(channel, message)
        else:
            await layer.group_send(group, message)

    def _get_layer(self) -> LocalFirstLoopLayer:
        loop = asyncio.get_running_loop()
        try:
            return self._layers[loop]  # type: ignore[no-any-return]
        except KeyError:
            layer = LocalFirstLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            self._layers[loop] = layer
            _wrap_close(self, loop)
            return layer
