"""Code execution end to end on a real engine: the REST API and the websocket of a live
daphne, a real agent, and the code runner's ipykernel in main1 of the Python image.

Personas: ``alice`` owns the session; ``bob`` may not run code in it by any path.
"""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sessions_app.models import Agent, AgentStatus, ExecutionRun, Image, Status
from tests.docker.test_apps_proxy import _api
from tests.docker.test_cluster_system import PYTHON_IMAGE, _wait_status, engine  # noqa: F401
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def session(engine, group, live_system, make_agent, make_token, alice):  # noqa: F811
    """alice's running Python session on a live stack: (its id, alice's token)."""
    Image.objects.update_or_create(reference=PYTHON_IMAGE, defaults={"supports_ssh": True})
    node = make_agent("node-a", cpu="2", mem=4 * 2**30)
    live_system.start_agent(node, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    token = make_token(alice)
    status, body = _api(
        live_system,
        token,
        "POST",
        "/api/v1/sessions/",
        {"image": PYTHON_IMAGE, "resources": {"cpu": 1, "mem": "512m"}},
    )
    assert status == 201, body
    _wait_status(body["id"], Status.RUNNING)
    return body["id"], token


def run(live, token, session_id, **body):
    status, answer = _api(live, token, "POST", f"/api/v1/sessions/{session_id}/execute/", body)
    assert status == 200, answer
    return answer


def until_done(live, token, session_id, answer, **ask):
    """Continue a run until it finishes; every answer in order."""
    answers = [answer]
    deadline = time.monotonic() + 60
    while answers[-1]["status"] == "continued":
        assert time.monotonic() < deadline, answers
        answers.append(
            run(live, token, session_id, mode="continue", run_id=answer["run_id"], **ask)
        )
    return answers


def text_of(answers, kind="stdout"):
    return "".join(r["data"] for a in answers for r in a["records"] if r["kind"] == kind)


def test_state_persists_between_runs_and_a_long_run_is_continued_to_its_end(session, live_system):
    session_id, token = session
    # The first run starts the kernel's runner (an ipykernel): it may take past the flush.
    first = run(live_system, token, session_id, mode="query", code="x = 41")
    first = until_done(live_system, token, session_id, first)[-1]
    assert (first["status"], first["exit_code"], first["records"]) == ("finished", 0, [])
    second = run(live_system, token, session_id, mode="query", code="x + 1")
    assert second["records"] == [{"kind": "result", "data": "42", "mime": "text/plain"}]

    started = time.monotonic()
    long = run(
        live_system,
        token,
        session_id,
        mode="query",
        code="import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(1)",
    )
    assert long["status"] == "continued"  # answered after the flush, the run still going
    answers = until_done(live_system, token, session_id, long)
    assert time.monotonic() - started >= 9
    assert len(answers) >= 4
    assert text_of(answers) == "".join(f"{i}\n" for i in range(10))
    assert (answers[-1]["status"], answers[-1]["exit_code"]) == ("finished", 0)

    def settled() -> list[ExecutionRun]:
        # A run that ended is written right after its answer went out.
        rows = list(ExecutionRun.objects.filter(session_id=session_id).order_by("started_at"))
        return rows if len(rows) == 3 and all(r.status != "running" for r in rows) else []

    runs = wait_for(settled, timeout=10, what="the three runs' rows as they ended")
    assert [(r.status, r.exit_code) for r in runs] == [("finished", 0)] * 3
    assert runs[2].run_id == long["run_id"]
    assert (runs[2].finished_at - runs[2].started_at).total_seconds() >= 9


def test_a_run_is_interrupted_and_a_waiting_one_takes_its_input(session, live_system):
    session_id, token = session
    warm = run(live_system, token, session_id, mode="query", code="pass")
    until_done(live_system, token, session_id, warm)
    spin = run(live_system, token, session_id, mode="query", code="import time\ntime.sleep(300)")
    assert spin["status"] == "continued"
    busy = _api(
        live_system,
        token,
        "POST",
        f"/api/v1/sessions/{session_id}/execute/",
        {"mode": "query", "code": "1"},
    )
    assert busy[0] == 409 and f"another run ({spin['run_id']}) is still going" in busy[1]["message"]
    stopped = run(live_system, token, session_id, mode="interrupt", run_id=spin["run_id"])
    answers = until_done(live_system, token, session_id, stopped)
    assert (answers[-1]["status"], answers[-1]["exit_code"]) == ("finished", 1)
    assert "KeyboardInterrupt" in text_of(answers, "error")

    asking = run(
        live_system,
        token,
        session_id,
        mode="query",
        code="name = input('name? ')\nprint('hi', name)",
    )
    assert asking["status"] == "waiting-input"
    assert "name? " in text_of([asking])
    answered = run(
        live_system, token, session_id, mode="input", run_id=asking["run_id"], code="alice"
    )
    answers = until_done(live_system, token, session_id, answered)
    assert "hi alice\n" in text_of(answers)
    assert answers[-1]["exit_code"] == 0

    def settled() -> list[dict]:
        # A run that ended is written right after its answer went out.
        status, runs = _api(live_system, token, "GET", f"/api/v1/sessions/{session_id}/runs/")
        assert status == 200
        return runs if all(r["status"] != "running" for r in runs) else []

    runs = wait_for(settled, timeout=10, what="the runs' rows as they ended")
    assert [(r["status"], r["exit_code"]) for r in runs] == [
        ("finished", 0),
        ("finished", 1),
        ("finished", 0),
    ]


def _socket(live, session_id, token):
    return connect(
        f"{live.ws_url}/ws/sessions/{session_id}/execute/",
        additional_headers={"Authorization": f"Token {token}"},
        open_timeout=30,
    )


def test_the_websocket_streams_records_as_the_run_writes_them(session, live_system):
    session_id, token = session
    with _socket(live_system, session_id, token) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "run",
                    "mode": "query",
                    "code": "import time\nfor i in range(3):\n    print(i, flush=True)\n"
                    "    time.sleep(0.5)",
                }
            )
        )
        messages, seen = [], []
        while not messages or messages[-1]["type"] != "result":
            messages.append(json.loads(ws.recv(timeout=30)))
            seen.append(time.monotonic())
        result = messages[-1]
        records = [m for m in messages if m["type"] == "records"]
        # Streamed: the records came in pieces, a while apart, before the result.
        assert len(records) >= 2, messages
        assert seen[messages.index(records[-1])] - seen[messages.index(records[0])] >= 0.5
        assert "".join(r["data"] for m in records for r in m["records"]) == "0\n1\n2\n"
        assert (result["status"], result["exit_code"]) == ("finished", 0)

        ws.send(json.dumps({"type": "complete", "code": "import o", "cursor_pos": 8}))
        completion = json.loads(ws.recv(timeout=30))
        if completion["type"] == "history":  # the run above is in the history now
            assert completion["run_ids"] == [result["run_id"]]
            completion = json.loads(ws.recv(timeout=30))
        assert completion["type"] == "result" and "os" in completion["completions"]


def test_bob_can_run_nothing_in_alices_session(session, live_system, make_token, bob):
    session_id, _ = session
    bob_token = make_token(bob)
    status, body = _api(
        live_system,
        bob_token,
        "POST",
        f"/api/v1/sessions/{session_id}/execute/",
        {"mode": "query", "code": "open('/home/work/x', 'w')"},
    )
    assert (status, body["message"]) == (404, "No such session.")
    with _socket(live_system, session_id, bob_token) as ws:
        refusal = json.loads(ws.recv(timeout=10))
        assert (refusal["code"], refusal["message"]) == (4404, "No such session.")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 4404
    assert not ExecutionRun.objects.filter(session_id=session_id).exists()
