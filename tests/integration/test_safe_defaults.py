"""What a checkout does with no configuration at all: DEBUG off, a secret key
made once and kept private, loopback host names only, crash pages that show
nothing of the settings; and bodies nested too deep refused before parsing.

Settings are read once per process, so the defaults are checked in a fresh
``python`` with a bare environment. Persona: ``alice``, a plain user asking
for a token.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2]
# A password that must never reach a response (nothing connects with it).
DB_PASSWORD = "Sup3r-Secret-db-Pw"

PROBE = """
import json, os, sys, types
import django
django.setup()
from django.conf import settings
from django.test import Client, override_settings
from django.urls import include, path

def boom(request):
    raise RuntimeError("a bug")

urls = types.ModuleType("crash_urls")
urls.urlpatterns = [path("boom/", boom), path("", include("backendai_web.urls"))]
with override_settings(ROOT_URLCONF=urls):
    crash = Client(raise_request_exception=False).get("/boom/", HTTP_HOST="localhost")
json.dump({
    "debug": settings.DEBUG,
    "allowed_hosts": settings.ALLOWED_HOSTS,
    "secret_key": settings.SECRET_KEY,
    "crash_status": crash.status_code,
    "crash_body": crash.content.decode(),
}, sys.stdout)
"""


def _settings_in_a_fresh_process(var_dir: Path, **env: str) -> dict:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BAI_", "DJANGO_"))
        and k not in ("DEBUG", "ALLOWED_HOSTS", "SECRET_KEY")
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
            "BAI_VAR_DIR": str(var_dir),
            "DATABASE_URL": f"postgres://bai:{DB_PASSWORD}@127.0.0.1:1/nowhere",
            "LOG_LEVEL": "CRITICAL",  # the crash's traceback goes to the log, not here
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def defaults(tmp_path_factory) -> tuple[dict, Path]:
    var_dir = tmp_path_factory.mktemp("var")
    return _settings_in_a_fresh_process(var_dir), var_dir


def test_debug_is_off_unless_asked_for(defaults):
    assert defaults[0]["debug"] is False


def test_only_loopback_names_are_allowed_hosts_by_default(defaults):
    assert defaults[0]["allowed_hosts"] == ["localhost", "127.0.0.1", "[::1]"]


def test_a_crash_page_shows_nothing_of_the_settings(defaults):
    settings, _ = defaults
    assert settings["crash_status"] == 500
    body = settings["crash_body"]
    assert "Something went wrong" in body
    for secret in (DB_PASSWORD, "DATABASE_URL", "SECRET_KEY", settings["secret_key"], "a bug"):
        assert secret not in body


def test_the_secret_key_is_made_once_private_and_reused(defaults):
    settings, var_dir = defaults
    key_file = var_dir / "secret_key"
    assert key_file.read_text().strip() == settings["secret_key"]
    assert len(settings["secret_key"]) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    again = _settings_in_a_fresh_process(var_dir)
    assert again["secret_key"] == settings["secret_key"]


def test_a_secret_key_from_the_environment_writes_no_file(tmp_path):
    settings = _settings_in_a_fresh_process(tmp_path, SECRET_KEY="k" * 60)
    assert settings["secret_key"] == "k" * 60
    assert not (tmp_path / "secret_key").exists()


def test_the_host_the_run_command_serves_on_is_allowed_too(tmp_path):
    settings = _settings_in_a_fresh_process(tmp_path, BAI_HOST="10.1.2.3")
    assert settings["allowed_hosts"] == ["localhost", "127.0.0.1", "[::1]", "10.1.2.3"]


def test_debug_pages_are_an_explicit_opt_in_that_still_hides_the_database_url(tmp_path):
    settings = _settings_in_a_fresh_process(tmp_path, BAI_DEBUG="1")

    assert settings["debug"] is True
    assert "a bug" in settings["crash_body"]  # the debug page, with the traceback
    assert "DATABASE_URL" in settings["crash_body"]
    assert DB_PASSWORD not in settings["crash_body"]


def test_debug_is_refused_in_production(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
            "BAI_PRODUCTION": "true",
            "BAI_DEBUG": "1",
            "SECRET_KEY": "k" * 60,
            "ALLOWED_HOSTS": "example.org",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "BAI_DEBUG must not be set when BAI_PRODUCTION=true" in result.stderr


# --- bodies nested too deep ---------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _ask_for_a_token(extra: str) -> dict:
    body = f'{{"username": "alice", "password": "wrong", "extra": {extra}}}'
    response = APIClient().post("/api/v1/auth/token/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    return response.json()


@pytest.mark.django_db
def test_a_body_nested_100000_deep_gets_400_not_a_crash(settings, alice):
    assert settings.BAI_MAX_JSON_DEPTH == 64
    body = _ask_for_a_token(_nested(100_000))
    assert body == {
        "message": "The JSON body is nested deeper than 64 levels.",
        "extra": {"limit": 64},
    }


@pytest.mark.django_db
def test_a_body_one_level_over_the_limit_is_refused(alice):
    # The object around "extra" is one level: 63 more make 64.
    assert "nested deeper" in _ask_for_a_token(_nested(64))["message"]


@pytest.mark.django_db
def test_a_body_at_the_limit_reaches_the_view(alice):
    assert _ask_for_a_token(_nested(63))["message"] == "Wrong username or password."


@pytest.mark.django_db
def test_brackets_inside_strings_are_not_nesting(alice):
    assert _ask_for_a_token(json.dumps("[{" * 5000))["message"] == "Wrong username or password."


# --- Redis asks for a password -------------------------------------------------------------------


def _production_setup(redis_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
        "BAI_PRODUCTION": "true",
        "SECRET_KEY": "k" * 60,
        "ALLOWED_HOSTS": "example.org",
    }
    env.pop("REDIS_URL", None)
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("redis_url", [None, "redis://127.0.0.1:6379/0", "redis://bai@10.0.0.5/0"])
def test_production_refuses_to_start_with_a_redis_that_asks_for_no_password(redis_url):
    result = _production_setup(redis_url)
    assert result.returncode != 0
    assert "REDIS_URL must be set and carry a password" in result.stderr


@pytest.mark.parametrize(
    "redis_url", ["redis://:s3cret@10.0.0.5:6379/0", "redis://10.0.0.5:6379/0?password=s3cret"]
)
def test_production_starts_with_a_redis_password(redis_url):
    result = _production_setup(redis_url)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_deploy_check_calls_a_redis_without_password_an_error(settings):
    from sessions_app.checks import production_check

    settings.REDIS_URL = "redis://127.0.0.1:6390/0"
    [error] = [p for p in production_check(None) if p.id == "bai.E002"]
    assert error.level >= 40 and "REDIS_URL carries no password" in error.msg
    settings.REDIS_URL = "redis://:s3cret@127.0.0.1:6390/0"
    assert not [p for p in production_check(None) if p.id == "bai.E002"]
