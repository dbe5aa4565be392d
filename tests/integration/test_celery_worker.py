"""Sessions created through the API are placed by a running Celery worker,
with nobody calling the scheduler by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from backendai_web.celery import app as celery_app
from sessions_app.models import Session, Status
from tests.live import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(tmp_path):
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the worker shares the test database, which needs PostgreSQL")
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "backendai_web",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "-Q",
            "celery",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": url,
            "CELERY_TASK_ALWAYS_EAGER": "false",
            "BAI_STORAGE_ROOT": str(settings.BAI_STORAGE_ROOT),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    # This process now sends tasks to the broker instead of running them inline.
    settings.CELERY_TASK_ALWAYS_EAGER = False
    celery_app.conf.task_always_eager = False
    yield proc
    settings.CELERY_TASK_ALWAYS_EAGER = True
    celery_app.conf.task_always_eager = True
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


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
        print((tmp_path / "worker.log").read_text(errors="replace")[-4000:])
        raise
    assert {k.agent_id for k in session.kernels.all()} == {agent.pk}
