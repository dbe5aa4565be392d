from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
