from django.apps import AppConfig


class SchedulerAppConfig(AppConfig):
    name = "scheduler_app"
    verbose_name = "Scheduler"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (answers sessions_app's signals)
