"""The processes' synchronous Redis clients: one per URL and timeout, made on first use.

A client holds a connection pool and is safe to share between threads. Keys that belong to
one database's data carry the database's name (``keyed``): test runs and a dev server may
share one Redis.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings

_clients: dict[tuple[str, float | None], redis.Redis] = {}
_lock = threading.Lock()


def client(*, timeout: float | None = 5.0) -> redis.Redis:
    """The client of ``settings.REDIS_URL`` whose calls give up after ``timeout`` seconds."""
    key = (settings.REDIS_URL, timeout)
    found = _clients.get(key)
    if found is None:
        with _lock:
            found = _clients.get(key)
            if found is None:
                found = _clients[key] = redis.Redis.from_url(
                    settings.REDIS_URL,
                    socket_timeout=timeout,
                    socket_connect_timeout=min(timeout, 2.0) if timeout else 2.0,
                )
    return found


def keyed(prefix: str) -> str:
    """``prefix`` with this database's name: ``bai:x:`` → ``bai:x:<db name>:``."""
    return f"{prefix}{settings.DATABASES['default']['NAME']}:"
