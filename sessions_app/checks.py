"""System checks: configuration mistakes show up in `manage.py check`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register

from backendai_web.env import redis_password


@register()
def storage_root_check(app_configs: Any, **kwargs: Any) -> list[Any]:
    root = settings.BAI_STORAGE_ROOT
    if not root.is_absolute():
        return [Error("BAI_STORAGE_ROOT must be an absolute path", id="bai.E001")]
    return []


@register(deploy=True)
def production_check(app_configs: Any, **kwargs: Any) -> list[Any]:
    problems: list[Any] = []
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        problems.append(
            Warning(
                "SQLite is the embedded default; use PostgreSQL (DATABASE_URL) in production.",
                id="bai.W001",
            )
        )
    if not redis_password(settings.REDIS_URL):
        problems.append(
            Error(
                "REDIS_URL carries no password: anything that reaches the Redis can drive"
                " the agents through the channel layer.",
                hint="Give Redis a password (requirepass) and put it in REDIS_URL as"
                " redis://:PASSWORD@HOST:PORT/0.",
                id="bai.E002",
            )
        )
    if "127.0.0.1" in settings.REDIS_URL or "localhost" in settings.REDIS_URL:
        if not getattr(settings, "PRODUCTION", False):
            problems.append(Warning("REDIS_URL points at a local embedded Redis.", id="bai.W002"))
    return problems
