"""Redis asks for a password in every mode (issue 24, item 12): the run command's embedded
Redis and the test command's own redis-server take the one made into ``var/redis_password``;
a Redis someone else runs (``REDIS_URL`` set) is left alone.

No persona: what is refused here is anyone on the machine without the password.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import skip_or_fail
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[2]


def _answers(port: int, password: str | None = None) -> bool:
    return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2).ping()


def _wait_until_up(port: int, password: str) -> None:
    for _ in range(100):
        try:
            if _answers(port, password):
                return
        except redis.ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"no Redis came up on port {port}")


def test_the_embedded_redis_of_the_run_command_asks_for_its_password(tmp_path):
    (tmp_path / "redis_password").write_text("the-run-commands-password\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "embedded_redis.py"), str(port), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_up(port, "the-run-commands-password")
        with pytest.raises(redis.AuthenticationError):
            _answers(port)
        with pytest.raises(redis.AuthenticationError):
            _answers(port, "a-guess")
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout's scripts with a var/ of their own (lib.sh finds var/ beside scripts/)."""
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed (scripts/test installs it)")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    return tmp_path


def _ensure_redis(checkout: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        ["bash", "-c", '. scripts/lib.sh && ensure_redis && printf %s "$REDIS_URL"'],
        cwd=checkout,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_test_commands_own_redis_server_asks_for_a_password_made_once(checkout):
    port = free_port()
    url = _ensure_redis(checkout, BAI_TEST_REDIS_PORT=str(port))
    password_file = checkout / "var" / "redis_password"
    password = password_file.read_text().strip()
    try:
        assert len(password) >= 32
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        parts = urlsplit(url)
        assert (parts.hostname, parts.port, parts.password) == ("127.0.0.1", port, password)
        assert _answers(port, password)
        with pytest.raises(redis.AuthenticationError):
            _answers(port)
        # Again: the same password, the same server.
        assert _ensure_redis(checkout, BAI_TEST_REDIS_PORT=str(port)) == url
    finally:
        redis.Redis(host="127.0.0.1", port=port, password=password).shutdown(nosave=True)


def test_a_redis_someone_else_runs_is_left_alone(checkout):
    assert _ensure_redis(checkout, REDIS_URL="redis://127.0.0.1:6379/0") == (
        "redis://127.0.0.1:6379/0"
    )
    assert not (checkout / "var" / "redis_password").exists()
