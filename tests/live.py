"""A live system for tests: daphne serving the test database in a child
process, and real agent processes dialling it.

The server is a fresh ``python -m backendai_web.serve`` (daphne; never a fork of the test process:
a fork would inherit asgiref's executor threads without their threads, and
hang). It gets the test's settings through the environment: the test database,
Celery eager (a session created through the API is scheduled inline, after
commit, inside the server — the same code path the worker runs), a channel
prefix of its own, and the agent timings.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback only
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def server_environment(settings: Any, **extra: str) -> dict[str, str]:
    """The environment that gives a server process this test's settings."""
    from django.db import connection

    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_TASK_ALWAYS_EAGER": "true",
        "BAI_STORAGE_ROOT": str(settings.BAI_STORAGE_ROOT),
        "BAI_AGENT_HEARTBEAT_INTERVAL": str(settings.BAI_AGENT_HEARTBEAT_INTERVAL),
        "BAI_AGENT_LOST_TIMEOUT": str(settings.BAI_AGENT_LOST_TIMEOUT),
        "BAI_LOG_TAIL_BYTES": str(settings.BAI_LOG_TAIL_BYTES),
        **extra,
    }


class LiveSystem:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.process_work_dirs: list[Path] = []
        self.server: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.apps_port = 0
        self.apps: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, **extra_env: str) -> LiveSystem:
        """Start daphne; ``extra_env`` adds to (or overrides) its environment."""
        from django.conf import settings

        self.port = free_port()
        self.apps_port = free_port()
        env = server_environment(
            settings,
            BAI_CHANNEL_PREFIX=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
            BAI_VAR_DIR=str(self.tmp_path / "var"),
            BAI_APPS_PORT=str(self.apps_port),
            BAI_APPS_ORIGIN=self.apps_origin,
            BAI_APPS_TUNNEL_URL=f"ws://127.0.0.1:{self.apps_port}",
            BAI_MANAGER_ORIGIN=self.url,
            **extra_env,
        )
        self.env = env
        self.server_log = open(self.tmp_path / "daphne.log", "wb")  # noqa: SIM115
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "backendai_web.serve",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "backendai_web.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.server_log,
            stderr=subprocess.STDOUT,
        )
        wait_http(f"{self.url}/login/", self.server)
        return self

    @property
    def apps_origin(self) -> str:
        return f"http://apps.localhost:{self.apps_port}"

    def start_apps(self, **extra_env: str) -> LiveSystem:
        """The apps proxy (proxy_app) on its own port, as scripts/run starts it.

        ``extra_env`` adds to its environment."""
        self.apps_log = open(self.tmp_path / "apps.log", "wb")  # noqa: SIM115
        self.apps = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy_app.serve",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.apps_port),
            ],
            cwd=ROOT,
            env={**self.env, **extra_env},
            stdout=self.apps_log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            if self.apps.poll() is not None:
                raise RuntimeError(f"the apps proxy exited with {self.apps.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.apps_port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def start_agent(
        self, agent: Any, *extra: str, backend: str = "docker"
    ) -> subprocess.Popen[bytes]:
        """Run ``python -m agent`` for an Agent row that has ``plain_token``."""
        from django.conf import settings

        work_dir = self.tmp_path / f"agent-{agent.pk}"
        if backend == "process":
            # Process kernels run as uids of their own, which bubblewrap binds their homes
            # as: the way to them must be searchable (pytest's tmp_path is not).
            work_dir = Path(tempfile.mkdtemp(prefix="bai-live-agent-"))
            work_dir.chmod(0o711)
            self.process_work_dirs.append(work_dir)
        log = open(self.tmp_path / f"agent-{agent.pk}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent",
                "--manager",
                self.ws_url,
                "--token",
                agent.plain_token,
                "--backend",
                backend,
                "--work-dir",
                str(work_dir),
                # Confined to the storage root, as scripts/run starts its agent.
                "--data-root",
                str(settings.BAI_STORAGE_ROOT),
                *extra,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            # The token goes by environment: never on a command line (ps shows those).
            env={**os.environ, "PYTHONUNBUFFERED": "1", "BACKENDAI_AGENT_TOKEN": agent.plain_token},
        )
        self.agents[agent.pk] = proc
        return proc

    def kill_agent(self, agent_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.agents.pop(agent_id)
        proc.send_signal(sig)
        proc.wait(timeout=10)

    def agent_log(self, agent_id: str) -> str:
        path = self.tmp_path / f"agent-{agent_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        from agent.backends import sandbox

        for agent_id in list(self.agents):
            self.kill_agent(agent_id, signal.SIGTERM)
        for work_dir in self.process_work_dirs:
            for netns in (work_dir / ".netns").glob("*"):
                sandbox.remove_netns(netns)
            shutil.rmtree(work_dir, ignore_errors=True)
        if self.apps is not None:
            stop_process(self.apps)
            self.apps_log.close()
        if self.server is not None:
            stop_process(self.server)
            self.server_log.close()


def start_bai(config: Path, *args: str) -> subprocess.Popen[str]:
    """The ``bai`` client (``python -m bai_client``, as the console script runs it)
    with the config file ``config``, left running, its output read as it comes."""
    return subprocess.Popen(
        [sys.executable, "-m", "bai_client", *args],
        cwd=ROOT,
        env={**os.environ, "BAI_CONFIG": str(config), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt_after(proc: subprocess.Popen[str], line: str, timeout: float = 60) -> str:
    """Press Ctrl-C for ``proc`` once it has written ``line``; its stderr once it exited."""
    try:
        assert proc.stdout is not None and proc.stdout.readline() == line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    finally:
        stop_process(proc)
    return err


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (state, not sleeps)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value: {last!r}")
