"""The manager as several processes behind Debian's haproxy (``scripts/webfarm``), with
real processes killed under it.

Each test starts its own farm over the test database: two daphne behind haproxy,
the apps proxy, two Celery workers (real ones: nothing runs eagerly here), beat, and
one agent with the Docker backend dialling the balancer. Persona: ``alice``, a
plain user with the minimal image.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
import redis

from backendai_web import metrics as shared
from tests.conftest import skip_or_fail
from tests.live import free_port, server_environment, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "bai-kernel/minimal:1"


def _free_block(size: int) -> int:
    """A base port with ``size`` free ports above it (the farm's fixed offsets)."""
    import socket

    for _ in range(50):
        base = free_port()
        if base + size >= 65535:
            continue
        ok = True
        for port in range(base, base + size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no block of free ports")


class Farm:
    def __init__(self, env: dict[str, str], path: Path, port: int) -> None:
        self.env, self.dir, self.port = env, path, port
        self.url = f"http://127.0.0.1:{port}"

    def run(self, command: str) -> str:
        result = subprocess.run(
            ["bash", "scripts/webfarm", command],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0 and command != "status":
            raise AssertionError(f"webfarm {command}: {result.stderr[-2000:]}")
        return result.stdout

    def pid(self, name: str) -> int:
        return int((self.dir / f"{name}.pid").read_text())

    def api(self, token: str, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.url}/api/v1/{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return json.loads(response.read() or b"{}")


@pytest.fixture
def farm(transactional_db, settings, channel_prefix, tmp_path, group, kernel_images):
    if subprocess.run(["which", "haproxy"], capture_output=True).returncode != 0 and (
        os.geteuid() != 0
    ):
        skip_or_fail("haproxy is not installed and this is not root")
    port = _free_block(23)
    env = server_environment(
        settings,
        CELERY_TASK_ALWAYS_EAGER="false",
        BAI_CHANNEL_PREFIX=channel_prefix,
        BAI_PORT=str(port),
        FARM_DIR=str(tmp_path / "farm"),
        BAI_VAR_DIR=str(tmp_path / "var"),
        BAI_AGENT_HEARTBEAT_INTERVAL="1",
    )
    farm = Farm(env, tmp_path / "farm", port)
    try:
        farm.run("up")
        yield farm
    finally:
        farm.run("down")
        _remove_containers_of_this_tests_sessions()


def _remove_containers_of_this_tests_sessions() -> None:
    """The farm's agent stops with the farm and leaves its kernels' containers: remove them."""
    import docker

    from sessions_app.models import Session

    client = docker.from_env()
    for session_id in _db(lambda: list(Session.objects.values_list("pk", flat=True))):
        label = f"ai.backend.session_id={session_id}"
        for container in client.containers.list(all=True, filters={"label": label}):
            container.remove(force=True)


@pytest.fixture
def live_server_url(farm) -> str:
    """The pages of these tests go through the balancer."""
    return farm.url


def _alice_token(users) -> str:
    from sessions_app.tokens import token_create

    return token_create(user=users["alice"])[1]


def _held_by_pid(kind: str, pids: set[int]) -> dict[int, float]:
    """Which of the daphne ``pids`` holds how many websockets of ``kind`` (the metrics'
    per-process gauges; another test's daphne may have left its own for a few seconds)."""
    from django.conf import settings

    shared.flush()
    client = redis.Redis.from_url(settings.REDIS_URL)
    held = {}
    for key in client.scan_iter(match=shared.gauges_prefix() + "*"):
        value = client.hget(key, shared.encode("bai_websockets_open", (("kind", kind),)))
        pid = int(key.decode().rsplit(":", 1)[1])
        if value and float(value) > 0 and pid in pids:
            held[pid] = float(value)
    return held


def _db(fn):
    """Run ``fn`` (ORM reads) in a thread of its own: once Playwright runs, this
    thread has an event loop, where Django refuses synchronous queries."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def test_the_pages_work_through_the_balancer_and_a_killed_daphne_loses_no_shell(
    farm, users, login, shot
):
    from sessions_app.models import Agent, AgentStatus, Session

    token = _db(lambda: _alice_token(users))
    page = login("alice", screenshot=False)
    created = farm.api(
        token,
        "POST",
        "sessions/",
        {"image": IMAGE, "name": "farm", "resources": {"cpu": "0.5", "mem": "128m"}},
    )
    sid = created["id"]
    # The live list hears of it and follows it to RUNNING (pushed through the channel layer
    # from whichever worker placed it and whichever daphne heard the agent).
    page.wait_for_function(
        "(id) => window.sessionsById.get(id) && window.sessionsById.get(id).status === 'RUNNING'",
        arg=sid,
        timeout=90_000,
    )
    page.locator(f'tr[data-id="{sid}"] [data-action="logs"]').click()
    page.wait_for_function("() => window.logsReady === true")
    shot(page, "list-and-logs-through-haproxy")

    terminal = page.context.new_page()
    terminal.goto(f"{farm.url}/sessions/{sid}/terminal/")
    terminal.wait_for_function("() => window.termReady === true")
    terminal.locator("#terminal").click()
    terminal.keyboard.type("X=farm$((6*7)); echo mark-$X\n")
    terminal.wait_for_function("() => window.termOutput.includes('mark-farm42')")

    # Kill -9 the daphne that holds the terminal (its per-process gauge says which).
    webs = {farm.pid("web1"), farm.pid("web2")}
    holders = wait_for(
        lambda: _held_by_pid("terminal", webs), timeout=60, what="the terminal's daphne"
    )
    assert len(holders) == 1
    victim = next(iter(holders))
    os.kill(victim, signal.SIGKILL)

    # The terminal comes back, to the same shell (its variable is still set) ...
    terminal.wait_for_function("() => window.termReady === false", timeout=15_000)
    terminal.wait_for_function("() => window.termReady === true", timeout=45_000)
    terminal.keyboard.type("echo again-$X\n")
    terminal.wait_for_function("() => window.termOutput.includes('again-farm42')")
    shot(terminal, "terminal-back-on-the-other-daphne")
    # ... served by the other daphne; the live list and the agent are there too.
    survivor = (webs - {victim}).pop()
    # (The killed process's gauges lapse with their lease, GAUGE_LEASE seconds.)
    wait_for(
        lambda: _held_by_pid("terminal", webs).keys() == {survivor},
        timeout=shared.GAUGE_LEASE + 10,
        what="the terminal counted on the survivor only",
    )
    page.wait_for_function("() => window.wsReady === true", timeout=45_000)
    wait_for(
        lambda: _held_by_pid("agent", webs).keys() == {survivor},
        timeout=60,
        what="the agent on the survivor",
    )
    assert _db(lambda: Agent.objects.get(pk="local").status) == AgentStatus.ALIVE
    status = farm.run("status")
    assert "DEAD" in status and status.count("UP") >= 1

    # The list still follows the session live: terminate it through the API.
    farm.api(token, "POST", f"sessions/{sid}/terminate/", {})
    page.wait_for_function(
        "(id) => ['TERMINATING', 'TERMINATED'].includes(window.sessionsById.get(id).status)",
        arg=sid,
    )
    wait_for(
        lambda: _db(lambda: Session.objects.get(pk=sid).status) == "TERMINATED",
        timeout=60,
        what="the session to terminate",
    )


def _occupied_by_agent() -> dict[str, Decimal]:
    """cpu held by each agent's live kernels, from the kernels themselves."""
    from sessions_app.models import Kernel

    held: dict[str, Decimal] = {}
    for agent_id, slots in Kernel.objects.filter(
        status__in=["SCHEDULED", "PREPARING", "PULLING", "RUNNING", "TERMINATING"]
    ).values_list("agent_id", "requested_slots"):
        held[agent_id] = held.get(agent_id, Decimal(0)) + Decimal(slots.get("cpu", "0"))
    return held


def test_a_worker_killed_in_a_burst_of_passes_leaves_nothing_stuck_lost_or_oversubscribed(
    farm, users
):
    from sessions_app.models import Agent, ResourcePolicy, Session
    from sessions_app.policy import reason_class

    ResourcePolicy.objects.update(max_concurrent_sessions=100, max_pending_sessions=100)
    token = _alice_token(users)
    agent = wait_for(
        lambda: Agent.objects.filter(pk="local", status="ALIVE").exclude(capacity_slots={}).first(),
        timeout=60,
        what="the agent to register",
    )
    capacity = Decimal(agent.capacity_slots["cpu"])
    per = Decimal("0.25")
    fits = int(capacity / per)
    burst = fits + 6
    ids = []
    worst = Decimal(0)
    for i in range(burst):
        ids.append(
            farm.api(
                token,
                "POST",
                "sessions/",
                {
                    "image": IMAGE,
                    "name": f"burst-{i}",
                    "resources": {"cpu": str(per), "mem": "64m"},
                },
            )["id"]
        )
        if i == burst // 3:
            os.kill(farm.pid("worker1"), signal.SIGKILL)  # in the middle of the burst
        worst = max([worst, *_occupied_by_agent().values()])
    assert "worker1  DEAD" in farm.run("status")

    def settled():
        nonlocal worst
        worst = max([worst, *_occupied_by_agent().values()])
        statuses = list(Session.objects.filter(pk__in=ids).values_list("status", flat=True))
        return statuses.count("RUNNING") == fits and statuses.count("PENDING") == burst - fits

    wait_for(settled, timeout=120, what=f"{fits} sessions running and the rest pending")
    # The ones that wait say why: the resources (not a lost pass).
    for reason in Session.objects.filter(pk__in=ids, status="PENDING").values_list(
        "status_reason", flat=True
    ):
        assert reason_class(reason) in {"resources", "queued_behind"}, reason
    # Free room: the survivor places every waiting session as the others end.
    running = list(
        Session.objects.filter(pk__in=ids, status="RUNNING").values_list("pk", flat=True)
    )
    for sid in running:
        farm.api(token, "POST", f"sessions/{sid}/terminate/", {})
    wait_for(
        lambda: (
            Session.objects.filter(pk__in=ids, status="RUNNING").count() == burst - fits
            and not Session.objects.filter(pk__in=ids, status="PENDING").exists()
        ),
        timeout=120,
        what="the waiting sessions to run",
    )
    assert worst <= capacity, f"agent held {worst} cpu of {capacity}"
    assert Session.objects.filter(pk__in=ids).count() == burst  # none lost
    for sid in ids:
        if Session.objects.get(pk=sid).status == "RUNNING":
            farm.api(token, "POST", f"sessions/{sid}/terminate/", {})
