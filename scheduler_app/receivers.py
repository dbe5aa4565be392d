"""scheduler_app's answers to sessions_app's signals."""

from django.dispatch import receiver

from sessions_app.signals import scheduling_requested


@receiver(scheduling_requested)
def _queue_pass(sender: object, resource_group_id: int | None = None, **kwargs: object) -> None:
    from .tasks import request_pass

    request_pass(resource_group_id)
