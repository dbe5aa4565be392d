"""What the async code of sessions_app shares (the browser websockets, the code
runs' API): database work off the event loop, and session activity written in
batches."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

from channels.db import database_sync_to_async

from . import services

logger = logging.getLogger(__name__)

# All the streams and runs of a process share one write of their sessions'
# activity, at most this often.
TOUCH_FLUSH_GAP = 1.0


def db(func):  # type: ignore[no-untyped-def]
    """ORM work in the shared thread pool: the single thread-sensitive executor
    would queue every consumer of the process behind one call. SQLite (the
    embedded default) takes one writer at a time whatever the thread, and its
    in-memory test database refuses a second thread: it keeps the one thread.
    Like every ``database_sync_to_async`` call, it gives its connection back
    when done: nothing waits on the loop while holding one."""
    from django.db import connection

    return database_sync_to_async(func, thread_sensitive=connection.vendor == "sqlite")


class _TouchBatch:
    """The sessions with stream activity, written to the database together.

    One per event loop (so one per daphne process): at most one write in flight
    and at most one every ``TOUCH_FLUSH_GAP`` seconds, whatever the number of open
    streams. It runs in the shared thread pool (``thread_sensitive=False``): the
    single thread-sensitive executor is where every consumer of the process
    would otherwise queue behind a database connect (CONN_MAX_AGE is 0).
    """

    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.written: asyncio.Future[bool] | None = None  # the pending ones' write
        self.task: asyncio.Task[None] | None = None
        self.last_flush = 0.0

    def add(self, session_id: str) -> asyncio.Future[bool]:
        self.pending.add(session_id)
        if self.written is None:
            self.written = asyncio.get_running_loop().create_future()
        written = self.written
        if self.task is None or self.task.done():
            # The batch is the loop's, not the caller's: a context of its own. In the
            # caller's (a REST run's), its database work would go to that request's
            # thread, gone once the request answers ("CurrentThreadExecutor already
            # quit" under SQLite's thread-sensitive ``db``, and the activity lost).
            self.task = asyncio.get_running_loop().create_task(
                self._flush(), context=contextvars.Context()
            )
        return written

    async def _flush(self) -> None:
        while self.pending:
            wait = self.last_flush + TOUCH_FLUSH_GAP - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            ids, self.pending = self.pending, set()
            written, self.written = self.written, None
            self.last_flush = time.monotonic()
            try:
                await db(_touch_sessions)(ids)
            except Exception:  # noqa: BLE001 - activity is best effort; never kill a stream
                logger.warning("touching sessions %s failed", sorted(ids), exc_info=True)
                if written is not None:
                    written.set_result(False)
            else:
                if written is not None:
                    written.set_result(True)


def _touch_sessions(ids: set[str]) -> None:
    for session_id in ids:
        services.session_touch(session_id=session_id)


_touch_batches: dict[asyncio.AbstractEventLoop, _TouchBatch] = {}


def touch_later(session_id: str) -> asyncio.Future[bool]:
    """Count activity on a session (idle timeout), written within ``TOUCH_FLUSH_GAP``;
    the future says, once done, whether it was written."""
    loop = asyncio.get_running_loop()
    batch = _touch_batches.get(loop)
    if batch is None:
        for old in [old for old in _touch_batches if old.is_closed()]:
            del _touch_batches[old]
        batch = _touch_batches[loop] = _TouchBatch()
    return batch.add(session_id)
