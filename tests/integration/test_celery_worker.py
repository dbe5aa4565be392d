"""Sessions created through the API are placed by a running Celery worker,
with nobody calling the scheduler by hand; a worker killed in the middle of a
pass does not stall scheduling once another one is up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings

from backendai_web.celery import app as celery_app
from scheduler_app import tasks
from scheduler_app.locks import LOCKS
from sessions_app import services
from sessions_app.models import Session, Status
from tests.live import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the worker shares the test database, which needs PostgreSQL")
    return (
        f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    )


class Worker:
    """A ``celery worker`` process on the test database, logging to ``log``."""

    def __init__(self, log: Path, *pool: str) -> None:
        self.log_path = log
        self.log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "backendai_web", "worker", *pool]
            + ["--loglevel", "INFO", "-Q", "celery", "--without-gossip", "--without-mingle"],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": _database_url(),
                "CELERY_TASK_ALWAYS_EAGER": "false",
                "BAI_STORAGE_ROOT": str(settings.BAI_STORAGE_ROOT),
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool's children can be killed with it
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> float:
        """Block until the worker consumes; returns the monotonic time it was seen ready."""
        wait_for(lambda: " ready." in self.text(), timeout=60, what="the worker to be ready")
        return time.monotonic()

    def kill(self) -> None:
        """SIGKILL, no warm shutdown: what the OOM killer or a lost node does."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture
def workers(tmp_path):
    """Start workers with ``workers(name, *pool_args)``; all are stopped at the end."""
    _database_url()
    started: list[Worker] = []

    def start(name: str, *pool: str) -> Worker:
        started.append(Worker(tmp_path / f"{name}.log", *pool))
        return started[-1]

    # This process now sends tasks to the broker instead of running them inline.
    settings.CELERY_TASK_ALWAYS_EAGER = False
    celery_app.conf.task_always_eager = False
    yield start
    settings.CELERY_TASK_ALWAYS_EAGER = True
    celery_app.conf.task_always_eager = True
    for worker in started:
        worker.stop()


@pytest.fixture
def worker(workers):
    return workers("worker", "--pool", "solo")


def test_the_worker_places_a_session_created_through_the_api(
    worker, api, alice, image, agent, tmp_path
):
    response = api(alice).post(
        "/api/v1/sessions/",
        {"image": image.reference, "cluster_mode": "multi-node", "cluster_size": 2},
        format="json",
    )
    assert response.status_code == 201, response.json()
    session_id = response.json()["id"]

    def scheduled():
        session = Session.objects.get(pk=session_id)
        return session.status == Status.SCHEDULED and session

    try:
        session = wait_for(scheduled, timeout=60, what="the worker to place the session")
    except AssertionError:
        print(worker.text()[-4000:])
        raise
    assert {k.agent_id for k in session.kernels.all()} == {agent.pk}


def test_a_worker_killed_mid_pass_stalls_scheduling_no_longer_than_its_replacement_takes_to_start(
    workers, alice, image, agent, group
):
    def launch(name: str) -> Session:
        return services.session_create(owner=alice, spec={"image": image.reference, "name": name})

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    doomed = workers("doomed", "--pool", "prefork", "--concurrency", "1")
    doomed.wait_ready()
    # Hold the group's lock, so the worker's pass stops in the middle, waiting for it.
    holder = psycopg.connect(_database_url(), autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", [LOCKS["resource_group"], group.pk])
    first = launch("first")
    wait_for(
        lambda: holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = %s AND objid = %s",
            [LOCKS["resource_group"], group.pk],
        ).fetchone()[0],
        timeout=30,
        what="the worker's pass to wait for the group's lock",
    )
    # A session arrives during the pass: its pass is queued, and the flag says so.
    second = launch("second")
    wait_for(lambda: broker.llen("celery") == 0, what="the worker to take the queued pass")
    assert broker.exists(tasks._flag(group.pk))

    doomed.kill()
    holder.close()
    replacement = workers("replacement", "--pool", "solo")
    ready = replacement.wait_ready()

    def placed() -> bool:
        return all(Session.objects.get(pk=s.pk).status == Status.SCHEDULED for s in (first, second))

    try:
        wait_for(placed, timeout=15, what="a pass by the replacement worker")
    except AssertionError:
        print(replacement.text()[-4000:])
        raise
    assert time.monotonic() - ready <= 5
