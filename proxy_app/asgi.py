"""ASGI entry point of the apps proxy: ``daphne -p $BAI_APPS_PORT proxy_app.asgi:application``."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
django.setup()

from .app import application  # noqa: E402

__all__ = ["application"]
