"""Celery tasks: take ids, call one service, safe to run twice.

Triggers coalesce: a burst of requests for the same group queues one pass
(a Redis flag marks "a pass is queued"; the pass clears it when it starts, so
a request arriving during a pass queues the next one).

A worker killed with passes queued for it takes those messages with it, and
their flags would hold back every request until they expire: they expire
after ``BAI_PASS_QUEUED_TTL`` seconds (a queued pass normally starts within
milliseconds), and a worker that starts clears them all and queues a pass of
every group, so scheduling resumes the moment a replacement is up. Beat's
backstop (``schedule_all``) covers the rest.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import redis
from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from backendai_web import metrics
from backendai_web import redis as shared_redis

logger = logging.getLogger(__name__)


def _flags() -> redis.Redis:
    return shared_redis.client()


def _flag_prefix() -> str:
    # Keyed by database too: test runs and a dev server may share one Redis.
    return f"bai:pass-queued:{settings.DATABASES['default']['NAME']}:"


def _flag(group_id: int | None) -> str:
    return f"{_flag_prefix()}{group_id if group_id is not None else 'all'}"


def request_pass(resource_group_id: int | None) -> None:
    """Queue a scheduling pass unless one is already queued for that group."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        schedule_group.delay(resource_group_id)
        return
    try:
        first = _flags().set(_flag(resource_group_id), 1, nx=True, ex=settings.BAI_PASS_QUEUED_TTL)
    except redis.RedisError:
        logger.warning("redis unavailable; the beat backstop will schedule", exc_info=True)
        return
    if first:
        schedule_group.delay(resource_group_id)


def clear_queued_flags() -> int:
    """Forget every "pass queued" flag of this database; returns how many there were."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", _flag_prefix()) + "*"
    keys = list(_flags().scan_iter(match=pattern, count=1000))
    return _flags().delete(*keys) if keys else 0


@worker_ready.connect
def _resume_scheduling(**kwargs: Any) -> None:
    """A worker that starts may replace one killed with passes queued: the
    flags of those lost passes would hold back every request until they
    expire. Clear them and queue a pass of every group."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    try:
        cleared = clear_queued_flags()
    except redis.RedisError:
        logger.warning("redis unavailable; the beat backstop will schedule", exc_info=True)
        return
    logger.info("worker ready: %d queued-pass flag(s) cleared; queueing a pass", cleared)
    request_pass(None)


@shared_task(name="scheduler_app.tasks.schedule_group", ignore_result=True)
def schedule_group(resource_group_id: int | None) -> None:
    from . import services

    if not settings.CELERY_TASK_ALWAYS_EAGER:
        _flags().delete(_flag(resource_group_id))
    for group_id in services.schedulable_group_ids(resource_group_id):
        result = services.schedule_pass(group_id=group_id)
        # Counted once committed (schedule_pass returns after its commit).
        metrics.observe("bai_scheduler_pass_seconds", result.seconds, group=result.group)
        if result.placed_sessions:
            metrics.inc("bai_scheduler_placed_sessions", result.placed_sessions, group=result.group)
            metrics.inc("bai_scheduler_placed_kernels", result.placed_kernels, group=result.group)


@shared_task(name="scheduler_app.tasks.schedule_all", ignore_result=True)
def schedule_all() -> None:
    """Beat backstop."""
    request_pass(None)


@shared_task(name="scheduler_app.tasks.sweep_lost_agents", ignore_result=True)
def sweep_lost_agents() -> None:
    from . import reconcile

    reconcile.sweep_lost_agents()


@shared_task(name="scheduler_app.tasks.sweep_timeouts", ignore_result=True)
def sweep_timeouts() -> None:
    """End sessions past their idle timeout, lifetime limit or batch timeout."""
    from . import sweeps

    sweeps.sweep_timeouts()


@shared_task(name="scheduler_app.tasks.sweep_folder_usage", ignore_result=True)
def sweep_folder_usage() -> None:
    """Measure the usage of folders that sessions mount (kernels write past quotas)."""
    from . import sweeps

    sweeps.sweep_folder_usage()
