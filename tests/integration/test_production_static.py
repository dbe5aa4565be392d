"""Production settings, run as docs/operations.md says: ``collectstatic`` first, then the manager.

Production serves the hashed, compressed copies of the static files that
``collectstatic`` writes (whitenoise's manifest storage). Without them every page that
names a static file answered 500 ("Missing staticfiles manifest entry"); the manager
now refuses to start and says which command to run. Each step runs in a fresh process
with production settings and a var directory (so a STATIC_ROOT) of its own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.live import ROOT, free_port, server_environment, stop_process, wait_http

pytestmark = pytest.mark.django_db

PAGES = ("/login/", "/admin/login/", "/api/docs/")


@pytest.fixture
def production_env(settings, tmp_path):
    env = server_environment(
        settings,
        BAI_PRODUCTION="true",
        SECRET_KEY="production-test-" + "k" * 50,
        ALLOWED_HOSTS="127.0.0.1",
        # As behind a proxy that redirects to HTTPS itself: the test speaks plain HTTP.
        SECURE_SSL_REDIRECT="false",
        BAI_VAR_DIR=str(tmp_path / "var"),
        BAI_CHANNEL_PREFIX=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
    )
    env.pop("BAI_DEBUG", None)
    return env


def _serve_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "backendai_web.serve",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "backendai_web.asgi:application",
    ]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback only
        return response.status, response.read().decode("utf-8", "replace")


def test_the_manager_refuses_to_start_before_static_files_are_collected(production_env):
    result = subprocess.run(
        _serve_command(free_port()),
        cwd=ROOT,
        env=production_env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "static files are not collected" in result.stderr
    assert "python manage.py collectstatic --noinput" in result.stderr


@pytest.mark.timeout(900)  # collectstatic compresses every file (gzip and brotli): ~1 CPU-minute
def test_after_collectstatic_the_login_admin_and_api_docs_pages_answer(production_env, tmp_path):
    collect = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env=production_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert collect.returncode == 0, collect.stderr
    assert (Path(production_env["BAI_VAR_DIR"]) / "staticfiles" / "staticfiles.json").is_file()

    port = free_port()
    log = open(tmp_path / "daphne.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        _serve_command(port), cwd=ROOT, env=production_env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", server, timeout=60)
        for page in PAGES:
            status, body = _get(base + page)
            assert status == 200, page
        # The pages name the collected, hashed copies, and those are served.
        _, login = _get(base + "/login/")
        assets = re.findall(r'(?:href|src)="(/static/[^"]+\.[0-9a-f]{12}\.(?:css|js))"', login)
        assert assets
        for asset in assets:
            assert _get(base + asset)[0] == 200
    finally:
        stop_process(server)
        log.close()
