"""scheduler_app's answers to sessions_app's signals."""

from django.dispatch import receiver

from sessions_app.signals import reconcile_requested, scheduling_requested


@receiver(scheduling_requested)
def _queue_pass(sender: object, resource_group_id: int | None = None, **kwargs: object) -> None:
    from .tasks import request_pass

    request_pass(resource_group_id)


@receiver(reconcile_requested)
def _reconcile_agents(sender: object, agent_ids: list[str] | None = None, **kwargs: object) -> None:
    from .reconcile import notify_agents

    notify_agents(list(agent_ids or []))
