"""Celery tasks: take ids, call one service, safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


def request_pass(resource_group_id: int | None) -> None:
    """Queue a scheduling pass (placeholder until the dispatcher lands)."""
    logger.debug("scheduling pass requested for group %s", resource_group_id)


@shared_task(name="scheduler_app.tasks.schedule_all")
def schedule_all() -> None:
    return None


@shared_task(name="scheduler_app.tasks.sweep_lost_agents")
def sweep_lost_agents() -> None:
    return None


@shared_task(name="scheduler_app.tasks.sweep_timeouts")
def sweep_timeouts() -> None:
    return None
