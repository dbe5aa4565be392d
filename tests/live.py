"""A live system for tests: daphne serving the test database in a child
process, and real agent processes dialling it.

Celery is eager in tests (tests/conftest.py), and the child inherits that, so
a session created through the API is scheduled inline, after commit, inside
the server — the same code path the worker runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from channels.testing.live import make_application
from daphne.testing import DaphneProcess
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

ROOT = Path(__file__).resolve().parent.parent


class LiveSystem:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.server: DaphneProcess | None = None
        self.port = 0
        self.agents: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> LiveSystem:
        get_application = partial(make_application, static_wrapper=ASGIStaticFilesHandler)
        # The forked child inherits the test database settings as they are now
        # (NAME already points at the test database), so no set-up is needed.
        self.server = DaphneProcess("127.0.0.1", get_application)
        self.server.start()
        while not self.server.ready.wait(timeout=1):
            if not self.server.is_alive():
                raise RuntimeError("the test server stopped before it was ready")
        self.port = self.server.port.value
        return self

    def start_agent(
        self, agent: Any, *extra: str, backend: str = "docker"
    ) -> subprocess.Popen[bytes]:
        """Run ``python -m agent`` for an Agent row that has ``plain_token``."""
        work_dir = self.tmp_path / f"agent-{agent.pk}"
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
        for agent_id in list(self.agents):
            self.kill_agent(agent_id, signal.SIGTERM)
        if self.server is not None:
            self.server.terminate()
            self.server.join(timeout=10)


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
