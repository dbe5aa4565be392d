"""The apps proxy with serving_app's side answered by ``tests.serving_double`` (see there).

    BAI_TEST_SERVING_DOUBLE=/path/to/double.json daphne tests.serving_double_asgi:application

The JSON file is read on every call, so a test may change endpoints and routes while the proxy
runs; woken endpoints are appended, one JSON line each, to ``<file>.wakes``.
"""

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
django.setup()

from proxy_app import router  # noqa: E402
from proxy_app.asgi import application  # noqa: E402
from tests.serving_double import ENV, from_file  # noqa: E402

_path = os.environ[ENV]


def _router_view(name):
    return from_file(_path).router_view(name)


def _token_ok(endpoint_id, presented):
    return from_file(_path).token_ok(endpoint_id, presented)


def _wake(endpoint_id, reason):
    with open(f"{_path}.wakes", "a") as f:
        f.write(json.dumps({"endpoint_id": endpoint_id, "reason": reason}) + "\n")


router._router_view = _router_view
router._token_ok = _token_ok
router._wake = _wake

__all__ = ["application"]
