"""How many terminals each user holds: the per-user limit (``BAI_MAX_TERMINALS_PER_USER``),
counted across sessions and daphne processes.

A terminal holds a place from the moment its socket is accepted until its
shell is gone. The places live in Redis, one sorted set per user: the member
is the terminal id, the score the time its claim lapses. So nothing is lost
with a process:

- an open socket renews its claim every ``RENEW_EVERY`` seconds for ``LEASE``
  seconds, so the terminals of a daphne process that died free their places
  within ``LEASE``;
- a socket that closes without ending its shell (a tab closed, a network
  drop) leaves the shell on its agent for the agent's grace period
  (``term_detach``, ``--term-grace``, 120 s by default), and the place is held
  as long (``DETACHED_KEPT``); re-attaching to the same terminal id takes the
  same place again, never a second one;
- a shell that ended (the user closed it, it exited, its session ended)
  frees its place at once.

Redis trouble never blocks a terminal: the limit is then not enforced, and
the failure is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from bai_common.units import format_duration

logger = logging.getLogger(__name__)

LEASE = 90.0
RENEW_EVERY = 30.0
# The agent's default grace period for a detached shell (agent --term-grace).
DETACHED_KEPT = 120.0

# Atomically: forget lapsed claims; take (or renew) this terminal's place
# unless the user already holds the limit. Returns {taken (0/1), places held}.
_CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[4])
local held = redis.call('ZCARD', KEYS[1])
if not mine and held >= tonumber(ARGV[3]) then
  return {0, held}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
if mine then return {1, held} end
return {1, held + 1}
"""
_KEY_TTL = int(max(LEASE, DETACHED_KEPT)) + 60

_clients: dict[asyncio.AbstractEventLoop, tuple[aioredis.Redis, Any]] = {}


def _now() -> float:
    return time.time()


def _client() -> tuple[aioredis.Redis, Any]:
    """One client (and the claim script) per event loop: its connections belong to that loop."""
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None:
        for old in [old for old in _clients if old.is_closed()]:
            del _clients[old]
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        found = _clients[loop] = (client, client.register_script(_CLAIM))
    return found


def _key(user_id: Any) -> str:
    # The deployment's namespace: its database and its channel-layer prefix
    # (test runs and a dev server may share one Redis).
    database = settings.DATABASES["default"]["NAME"]
    prefix = settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "")
    return f"bai:terminals:{database}:{prefix}:{user_id}"


def refusal(*, limit: int, held: int) -> str:
    """The reason a user over the limit reads."""
    return (
        f"Too many terminals: at most {limit} per user, and you have {held} open. "
        "Close one (a closed tab's shell is kept for "
        f"{format_duration(timedelta(seconds=DETACHED_KEPT))} in case it reconnects), "
        "then try again."
    )


async def claim(*, user_id: Any, term_id: str) -> tuple[bool, int]:
    """Take a place for ``term_id`` (or keep the one it holds); returns
    (taken, places the user holds, this one included when taken)."""
    limit = settings.BAI_MAX_TERMINALS_PER_USER
    now = _now()
    try:
        _, script = _client()
        taken, held = await script(
            keys=[_key(user_id)], args=[now, now + LEASE, limit, term_id, _KEY_TTL]
        )
    except redis.RedisError:
        logger.warning("terminal places unknown (redis); %s not counted", term_id, exc_info=True)
        return True, 0
    return bool(taken), int(held)


async def _set(user_id: Any, term_id: str, lapses: float) -> None:
    try:
        client, _ = _client()
        await client.zadd(_key(user_id), {term_id: lapses})
        await client.expire(_key(user_id), _KEY_TTL)
    except redis.RedisError:
        logger.warning("terminal %s: its place could not be kept", term_id, exc_info=True)


async def renew(*, user_id: Any, term_id: str) -> None:
    """The socket is still open: hold the place for another ``LEASE``."""
    await _set(user_id, term_id, _now() + LEASE)


async def detach(*, user_id: Any, term_id: str) -> None:
    """The socket closed and the agent keeps the shell: hold the place as long."""
    await _set(user_id, term_id, _now() + DETACHED_KEPT)


async def release(*, user_id: Any, term_id: str) -> None:
    """The shell is gone: free its place."""
    try:
        client, _ = _client()
        await client.zrem(_key(user_id), term_id)
    except redis.RedisError:
        logger.warning("terminal %s: its place could not be freed", term_id, exc_info=True)
