from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from backendai_web.db import install_pool_check, install_tolerant_dates

        from . import checks  # noqa: F401  (registers system checks)

        # A date beyond Python's range must not make its row unreadable.
        connection_created.connect(install_tolerant_dates, dispatch_uid="bai-tolerant-dates")
        # A pooled connection is checked with a round trip only when there is a reason to.
        connection_created.connect(install_pool_check, dispatch_uid="bai-pool-check")
