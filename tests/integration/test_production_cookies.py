"""Under production settings (``BAI_PRODUCTION=true``, HTTPS) the manager's session and
CSRF cookies carry the ``__Host-`` prefix: a browser then takes them only from the
manager's own host, Secure, with ``Path=/`` and no ``Domain``, so an app on the apps
origin (whose parent domain may be the manager's) can neither set nor shadow them. The
pages send the CSRF token as the page gave it (``<meta name="csrf-token">``), whatever the
cookie's name.

Persona: ``alice`` logs in over HTTPS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from django.test import Client

from tests.live import ROOT

pytestmark = pytest.mark.django_db

ORIGIN = "https://testserver"  # the test client's host, over HTTPS

COOKIE_SETTINGS = [
    "SESSION_COOKIE_NAME",
    "SESSION_COOKIE_SECURE",
    "SESSION_COOKIE_PATH",
    "SESSION_COOKIE_DOMAIN",
    "CSRF_COOKIE_NAME",
    "CSRF_COOKIE_SECURE",
    "CSRF_COOKIE_PATH",
    "CSRF_COOKIE_DOMAIN",
]


def _production_settings() -> dict:
    script = (
        "import json; from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n) for n in {COOKIE_SETTINGS!r}}}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
            "BAI_PRODUCTION": "true",
            "SECRET_KEY": "k" * 60,
            "ALLOWED_HOSTS": "bai.example.org",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_production_names_the_managers_cookies_host_only(settings, alice):
    production = _production_settings()
    assert production == {
        "SESSION_COOKIE_NAME": "__Host-sessionid",
        "SESSION_COOKIE_SECURE": True,
        "SESSION_COOKIE_PATH": "/",
        "SESSION_COOKIE_DOMAIN": None,
        "CSRF_COOKIE_NAME": "__Host-csrftoken",
        "CSRF_COOKIE_SECURE": True,
        "CSRF_COOKIE_PATH": "/",
        "CSRF_COOKIE_DOMAIN": None,
    }
    for name, value in production.items():
        setattr(settings, name, value)

    browser = Client(enforce_csrf_checks=True)
    login = browser.get("/login/", secure=True)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.content.decode())[1]
    response = browser.post(
        "/login/",
        {"username": "alice", "password": "alice-pass-123", "csrfmiddlewaretoken": token},
        headers={"Origin": ORIGIN},
        secure=True,
    )
    assert response.status_code == 302, response.content[:500]
    # What a browser requires of a "__Host-" cookie, or it refuses it.
    for name in ("__Host-sessionid", "__Host-csrftoken"):
        morsel = browser.cookies[name]
        assert morsel["secure"] is True and morsel["path"] == "/" and not morsel["domain"]
    assert "sessionid" not in browser.cookies and "csrftoken" not in browser.cookies

    # The pages' scripts take the token from the page: a write with it goes through.
    page = browser.get("/", secure=True).content.decode()
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)[1]
    created = browser.post(
        "/api/v1/folders/",
        {"name": "from-the-page"},
        content_type="application/json",
        headers={"X-CSRFToken": token, "Origin": ORIGIN},
        secure=True,
    )
    assert created.status_code == 201, created.content[:500]
    refused = browser.post(
        "/api/v1/folders/",
        {"name": "no-token"},
        content_type="application/json",
        headers={"Origin": ORIGIN},
        secure=True,
    )
    assert refused.status_code == 403
