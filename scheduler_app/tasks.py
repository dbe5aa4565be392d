"""Celery tasks: take ids, call one service, safe to run twice.

Triggers coalesce: a burst of requests for the same group queues one pass
(a Redis flag with a short expiry marks "a pass is queued"; the pass clears
it when it starts, so a request arriving during a pass queues the next one).
"""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from django.conf import settings

logger = logging.getLogger(__name__)

_FLAG_TTL = 30  # seconds; a crashed worker cannot block passes for longer
_redis: redis.Redis | None = None


def _flags() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(settings.REDIS_URL)
    return _redis


def _flag(group_id: int | None) -> str:
    # Keyed by database too: test runs and a dev server may share one Redis.
    database = settings.DATABASES["default"]["NAME"]
    return f"bai:pass-queued:{database}:{group_id if group_id is not None else 'all'}"


def request_pass(resource_group_id: int | None) -> None:
    """Queue a scheduling pass unless one is already queued for that group."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        schedule_group.delay(resource_group_id)
        return
    try:
        first = _flags().set(_flag(resource_group_id), 1, nx=True, ex=_FLAG_TTL)
    except redis.RedisError:
        logger.warning("redis unavailable; the beat backstop will schedule", exc_info=True)
        return
    if first:
        schedule_group.delay(resource_group_id)


@shared_task(name="scheduler_app.tasks.schedule_group", ignore_result=True)
def schedule_group(resource_group_id: int | None) -> None:
    from . import services

    if not settings.CELERY_TASK_ALWAYS_EAGER:
        _flags().delete(_flag(resource_group_id))
    for group_id in services.schedulable_group_ids(resource_group_id):
        services.schedule_pass(group_id=group_id)


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
