"""Live pushes to browsers and agents over the channel layer (the service layer's).

Pushes happen after commit only (never for a rolled-back change) and are
batched per transaction: every status change of a transaction becomes one
message per owner, so a scheduling pass that places thousands of sessions
sends one message per user, not one per session.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import defaultdict
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

from agent import protocol

logger = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _run(coro: Any) -> Any:
    """Run ``coro`` on one long-lived event loop of this process.

    async_to_sync would make a new loop per call, and the channel layer a new
    Redis connection per loop: a few milliseconds on every push. The loop is
    re-made in a forked child (its thread does not survive a fork).
    """
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="live-pushes", daemon=True).start()
        loop = _loop
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=10)


class _Batch:
    """Status changes of one transaction, pushed together after its commit."""

    def __init__(self, hooks: list[Any]) -> None:
        # Django replaces connection.run_on_commit with a new list on commit and
        # on rollback: while it is still the same list, this batch is pending.
        self.hooks = hooks
        self.by_owner: dict[int, dict[tuple[str, str], dict[str, str]]] = defaultdict(dict)

    def __call__(self) -> None:
        group_send_many(
            [
                (
                    protocol.user_group(owner_id),
                    {"type": "sessions.changed", "sessions": list(sessions.values())},
                )
                for owner_id, sessions in self.by_owner.items()
            ]
        )


def session_changed(
    *, owner_id: int, session_id: str, status: str, reason: str, kernel: str = ""
) -> None:
    """Queue a push of a session's (or one of its kernels') new status to the
    owner's browsers. ``kernel`` is the kernel's hostname for kernel changes."""
    item = {"id": session_id, "kernel": kernel, "status": status, "reason": reason}
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        group_send(protocol.user_group(owner_id), {"type": "sessions.changed", "sessions": [item]})
        return
    batch = getattr(connection, "_bai_live_batch", None)
    if batch is None or batch.hooks is not connection.run_on_commit:
        batch = _Batch(connection.run_on_commit)
        connection._bai_live_batch = batch
        transaction.on_commit(batch, robust=True)
    batch.by_owner[owner_id][(session_id, kernel)] = item


def status_changed(obj: Any) -> None:
    """Queue the push of a session's or a kernel's new status (after commit).

    Services call it after a transition they won; models push nothing.
    """
    if hasattr(obj, "cluster_hostname"):  # a kernel: its session's owner follows it
        session_changed(
            owner_id=obj.session.owner_id,
            session_id=str(obj.session_id),
            status=obj.status,
            reason=obj.status_reason,
            kernel=obj.cluster_hostname,
        )
    else:
        session_changed(
            owner_id=obj.owner_id,
            session_id=str(obj.pk),
            status=obj.status,
            reason=obj.status_reason,
        )


def kernels_changed(*, kernel_ids: list[Any], status: str, reason: str) -> None:
    """The push of many kernels' one move (the scheduler's bulk path), in one query."""
    from .models import Kernel

    rows = Kernel.objects.filter(pk__in=kernel_ids).values_list(
        "session_id", "session__owner_id", "cluster_hostname"
    )
    for session_id, owner_id, hostname in rows:
        session_changed(
            owner_id=owner_id,
            session_id=str(session_id),
            status=status,
            reason=reason,
            kernel=hostname,
        )


def group_send(group: str, message: dict[str, Any]) -> None:
    """Send now, from sync code. A dead channel layer is logged, not raised:
    the database already holds the truth, and heartbeats and page loads catch up."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        _run(layer.group_send(group, message))
    except Exception:  # noqa: BLE001 - best effort, see docstring
        logger.warning("push to %s failed", group, exc_info=True)


def group_send_many(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Several sends in one trip into the event loop (a pass touches many users)."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def send_all() -> None:
        results = await asyncio.gather(
            *(layer.group_send(group, message) for group, message in messages),
            return_exceptions=True,
        )
        for (group, _), result in zip(messages, results, strict=True):
            if isinstance(result, Exception):
                logger.warning("push to %s failed: %s", group, result)

    try:
        _run(send_all())
    except Exception:  # noqa: BLE001 - best effort, as group_send
        logger.warning("pushes failed", exc_info=True)
