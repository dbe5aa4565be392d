"""ASGI entry point of the apps proxy: ``python -m proxy_app.serve -p $BAI_APPS_PORT`` (uvicorn)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
django.setup()

from .app import application  # noqa: E402

__all__ = ["application"]
