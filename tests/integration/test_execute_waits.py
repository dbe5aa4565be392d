"""A code run that waits for its agent holds nothing the rest of the server needs.

The execute view gives the database connection its checks took back to the pool
before it waits, on the event loop, for the agent's answer. A live daphne with a
pool of two connections, an agent that never answers, and four code runs waiting on
it: other requests are still answered at once. (A view that kept the connection its
authentication took until the request ended would take the pool's two: the next
request would wait for one until the pool's timeout.)

Persona: ``alice`` runs code in her own session; the agent is a silent stand-in.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from websockets.sync.client import connect

from agent import protocol
from scheduler_app import reconcile
from sessions_app import services
from sessions_app.models import Kernel
from tests.conftest import skip_or_fail
from tests.live import LiveSystem

pytestmark = pytest.mark.django_db(transaction=True)

WAITING = 4


def _request(url: str, token: str, body: dict | None = None) -> tuple[int, dict, float]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
            status, data = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, data = error.code, error.read()
    return status, json.loads(data), time.monotonic() - started


def _running_session(owner, image):
    session = services.session_create(owner=owner, spec={"image": image.reference})
    for kernel in Kernel.objects.filter(session=session):
        reconcile.kernel_apply_report(kernel=kernel, report={"status": protocol.KR_RUNNING})
    return session


def test_requests_are_answered_while_code_runs_wait_for_a_silent_agent(
    tmp_path, group, image, agent, alice, make_token, channel_prefix
):
    if connection.vendor != "postgresql":
        skip_or_fail("a live server shares the test database: run on PostgreSQL (DATABASE_URL)")
    session = _running_session(alice, image)
    token = make_token(alice)
    system = LiveSystem(tmp_path).start(
        BAI_DB_POOL_MIN="0", BAI_DB_POOL_MAX="2", BAI_DB_POOL_TIMEOUT="20", BAI_EXEC_FLUSH="0.05"
    )
    try:
        with connect(
            f"{system.ws_url}/ws/agent/",
            additional_headers={"Authorization": f"Token {agent.plain_token}"},
        ) as silent_agent:
            report = {"kernel_id": str(session.pk), "status": protocol.KR_RUNNING}
            silent_agent.send(json.dumps({"type": protocol.REGISTER, "kernels": [report]}))
            assert json.loads(silent_agent.recv(timeout=10))["type"] == protocol.REGISTERED
            execute = f"{system.url}/api/v1/sessions/{session.pk}/execute/"
            with ThreadPoolExecutor(WAITING) as pool:
                runs = [
                    pool.submit(_request, execute, token, {"mode": "query", "code": "1"})
                    for _ in range(WAITING)
                ]
                commands = []
                while len(commands) < WAITING:
                    frame = json.loads(silent_agent.recv(timeout=10))
                    if frame["type"] == protocol.EXEC:
                        commands.append(frame)
                # Every run now waits for its answer (for up to 10 s).
                status, body, took = _request(f"{system.url}/api/v1/sessions/", token)
                assert (status, len(body)) == (200, 1)
                assert took < 2, f"the list took {took:.1f} s while runs waited"
                assert not any(run.done() for run in runs)
                answers = [run.result() for run in runs]
        assert [status for status, _, _ in answers] == [504] * WAITING
        assert all("did not answer within 10.05 s" in body["message"] for _, body, _ in answers)
    finally:
        system.stop()
