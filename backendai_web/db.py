"""PostgreSQL connections: the pool's check of a connection it hands out, and
reading dates PostgreSQL holds and Python cannot.

**The pool's check.** A pooled connection the server closed (a restart, an
admin's ``pg_terminate_backend``) must be replaced, not handed to a request.
The check Django gives the pool (``CONN_HEALTH_CHECKS``) asks the server (an
empty query) every time: one round trip more on every request's first query,
about 0.3 ms on loopback and past 1 ms when the machine is busy (the server's
process must be scheduled to answer), twice a code run over REST.
``check_pooled_connection`` asks the server only when it has a reason to: when
something came from the server since the connection's last query (a server
that closes a connection says so and closes the socket, which turns
readable), when libpq saw it fail, or when the connection was last handed
out ``FULL_CHECK_AFTER`` seconds ago or more (a host that vanished without
closing anything). Otherwise the connection is handed out as it is. Django
has no setting for a pool's check: ``install_pool_check`` puts it in place of
Django's when the pool lends its first connection.

**Dates.**

A ``timestamptz`` column holds 4713 BC to 294276 AD (and ``±infinity``);
Python's ``datetime`` holds the years 1 to 9999. A row with a date outside
that (written by hand, or by an older release that did not bound its input)
made psycopg raise DataError on every query that read it: the owner's list,
the admin's list, terminate and every scheduling pass of its group.

Such a date now reads as the nearest date Python holds (``FAR_PAST`` or
``FAR_FUTURE``, exactly ``datetime.min`` / ``datetime.max``), so the row can be
listed, ended and judged. The scheduler treats those two values as out of
range (``scheduler_app.selectors``); nothing the API accepts comes near them.
"""

from __future__ import annotations

import select
import time
from datetime import UTC, datetime
from typing import Any

# A pooled connection last lent this long ago or more is checked with a round trip before a loan.
FULL_CHECK_AFTER = 10.0

FAR_PAST = datetime.min.replace(tzinfo=UTC)
FAR_FUTURE = datetime.max.replace(tzinfo=UTC)


def check_pooled_connection(conn: Any) -> None:
    """The pool's ``check``: returns quietly when ``conn`` may be handed out, else raises
    (the pool then drops it and takes another). See the module's docstring."""
    from psycopg import pq
    from psycopg_pool import ConnectionPool

    now = time.monotonic()
    last, conn._bai_checked_at = getattr(conn, "_bai_checked_at", None), now
    if (
        last is not None
        and now - last < FULL_CHECK_AFTER
        and conn.pgconn.status == pq.ConnStatus.OK
        and conn.info.transaction_status == pq.TransactionStatus.IDLE
        and not _readable(conn.fileno())
    ):
        return
    ConnectionPool.check_connection(conn)


def install_pool_check(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: the pool that lent ``connection`` checks the
    next ones with ``check_pooled_connection`` instead of Django's (with health
    checks off it checks none, and stays so)."""
    if connection.vendor != "postgresql" or connection.pool is None:
        return
    from psycopg_pool import ConnectionPool

    if connection.pool._check is ConnectionPool.check_connection:
        connection.pool._check = check_pooled_connection


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def install_tolerant_dates(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: register the loader on a new PostgreSQL connection."""
    if connection.vendor != "postgresql":
        return
    import psycopg
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader

    class TolerantTzLoader(BaseTzLoader):  # type: ignore[misc, valid-type]
        # Django re-registers its own loader on a cursor whose connection's
        # loader has another timezone: keep the connection's.
        timezone = connection.timezone

        def load(self, data: Any) -> datetime:
            try:
                return super().load(data)  # type: ignore[no-any-return]
            except psycopg.DataError:
                text = bytes(data)
                # "0001-12-31 10:00:00+00 BC", "-infinity": before year 1; else after 9999.
                edge = FAR_PAST if text.endswith(b"BC") or text.startswith(b"-") else FAR_FUTURE
                return edge.replace(tzinfo=self.timezone)

    connection.connection.adapters.register_loader("timestamptz", TolerantTzLoader)
