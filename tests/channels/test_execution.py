"""Code execution through the real ASGI router, with a fake agent at the gateway.

REST (``POST /api/v1/sessions/{id}/execute/``) and the websocket
(``/ws/sessions/{id}/execute/``) → channel layer → agent gateway → agent, and
the agent's answers back, only ever to the request that asked.

Personas (tests/conftest.py): alice owns the session; bob is another plain user
and must not learn it exists; root is an admin and may run code in it.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from knox.crypto import hash_token
from knox.models import AuthToken

from agent import protocol
from backendai_web.asgi import application
from scheduler_app import reconcile
from sessions_app import consumers, execution, selectors, services
from sessions_app.errors import NotFound
from sessions_app.models import ExecutionRun, Kernel, Session, Status
from sessions_app.tokens import token_create

from .helpers import (
    active_since,
    browser,
    frame_of,
    http,
    no_frame_of,
    refused,
    registered_agent,
    running_session,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("channel_prefix")]


# --- helpers ---------------------------------------------------------------


async def token_of(user) -> str:
    return await sync_to_async(lambda: token_create(user=user)[1])()


def _path(session, what: str = "execute") -> str:
    return f"/api/v1/sessions/{session.pk}/{what}/"


async def call(method: str, path: str, token: str, body=None, *, raw: bytes | None = None):
    """One API request through the ASGI application: (status, JSON body)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    response = await http(method, path, token, data)
    return response["status"], json.loads(response["body"] or b"{}")


def execute(session, token: str, body) -> asyncio.Task:
    """An execute request in flight (the agent has to answer before it returns)."""
    return asyncio.create_task(call("POST", _path(session), token, body))


async def answer(agent, command: dict, **fields) -> None:
    """The agent's exec_result for ``command``."""
    result = {
        "type": protocol.EXEC_RESULT,
        "req_id": command["req_id"],
        "run_id": command["run_id"] or "",
        "status": protocol.EXEC_FINISHED,
        "exit_code": 0,
        "records": [],
        "completions": None,
        "reason": None,
        **fields,
    }
    await agent.send_json_to(result)


def stdout(text: str) -> dict:
    return {"kind": "stdout", "data": text, "mime": None}


async def runs_of(session) -> list[ExecutionRun]:
    return await sync_to_async(list)(ExecutionRun.objects.filter(session=session))


async def runs_when(session, settled, timeout: float = 5) -> list[ExecutionRun]:
    """The session's runs once ``settled(rows)`` holds (or as they are at the timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not settled(rows := await runs_of(session)):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    return rows


# --- REST: the round trip and the history ------------------------------------


async def test_a_query_goes_to_main1s_agent_and_its_answer_comes_back(
    running, alice, fake_agent, settings
):
    settings.BAI_EXEC_FLUSH = 0.7
    token = await token_of(alice)
    request = execute(running, token, {"mode": "query", "code": "print(41 + 1)"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert command["kernel_id"] == str(running.pk)  # main1's id is the session's
    assert (command["mode"], command["code"], command["stream"]) == (
        "query",
        "print(41 + 1)",
        False,
    )
    assert command["flush"] == 0.7 and command["options"] == {}
    assert re.fullmatch(r"[0-9a-f]{32}", command["req_id"])
    assert re.fullmatch(r"[0-9a-f]{16}", command["run_id"])  # the manager names the run
    assert await runs_of(running) == []  # recorded once the agent took it

    await answer(fake_agent, command, records=[stdout("42\n")])
    status, body = await request
    assert status == 200, body
    assert body == {
        "status": "finished",
        "run_id": command["run_id"],
        "exit_code": 0,
        "records": [stdout("42\n")],
    }
    # Written right after the answer went out (the caller does not wait for it).
    (row,) = await runs_when(running, lambda rows: rows)
    assert (row.run_id, row.mode, row.status, row.exit_code) == (
        command["run_id"],
        "query",
        "finished",
        0,
    )
    assert row.user_id == alice.pk and row.started_at < row.finished_at


async def test_a_long_run_is_continued_until_it_finishes_and_recorded_once(
    running, alice, fake_agent
):
    token = await token_of(alice)
    request = execute(running, token, {"mode": "query", "code": "slow()", "run_id": "r1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert command["run_id"] == "r1"
    await answer(fake_agent, command, status="continued", exit_code=None, records=[stdout("1\n")])
    status, body = await request
    assert (status, body["status"], body["exit_code"]) == (200, "continued", None)
    assert [r.status for r in await runs_of(running)] == ["running"]

    request = execute(running, token, {"mode": "continue", "run_id": "r1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["mode"], command["run_id"]) == ("continue", "r1")
    await answer(fake_agent, command, exit_code=3, records=[stdout("2\n")])
    status, body = await request
    assert (status, body["status"], body["exit_code"]) == (200, "finished", 3)
    (row,) = await runs_when(running, lambda rows: rows[0].status != "running")
    assert (row.run_id, row.status, row.exit_code) == ("r1", "finished", 3)


async def test_a_run_past_its_timeout_is_recorded_as_such(running, alice, fake_agent):
    token = await token_of(alice)
    request = execute(running, token, {"mode": "query", "code": "x", "options": {"timeout": 2}})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert command["options"] == {"timeout": 2}
    await answer(fake_agent, command, status="exec-timeout", exit_code=None)
    assert (await request)[1]["status"] == "exec-timeout"
    (row,) = await runs_when(running, lambda rows: rows)
    assert (row.status, row.exit_code) == ("exec-timeout", None)
    assert row.finished_at is not None


async def test_the_agents_refusal_is_a_409_in_its_words_and_leaves_no_run(
    running, alice, fake_agent
):
    token = await token_of(alice)
    request = execute(running, token, {"mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    reason = "another run (r1) is still going in this session; continue or interrupt it first"
    await answer(fake_agent, command, run_id="", exit_code=None, reason=reason)
    status, body = await request
    assert (status, body["message"]) == (409, reason)
    assert await runs_of(running) == []


async def test_completion_answers_its_matches_and_records_no_run(running, alice, fake_agent):
    token = await token_of(alice)
    request = execute(running, token, {"mode": "complete", "code": "import o"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert command["run_id"] is None
    assert command["options"] == {"cursor_pos": 8}  # the end of the code, when not given
    await answer(fake_agent, command, exit_code=None, completions=["os", "operator"])
    status, body = await request
    assert (status, body["completions"]) == (200, ["os", "operator"])
    assert await runs_of(running) == []


async def test_the_runs_list_shows_a_sessions_runs_newest_first_to_its_owner_and_admins(
    running, alice, bob, admin
):
    now = timezone.now()

    def record():
        for n, status in enumerate(["finished", "running"]):
            ExecutionRun.objects.create(
                session=running,
                user=alice,
                mode="query",
                run_id=f"r{n}",
                started_at=now + timedelta(seconds=n),
                status=status,
                exit_code=0 if status == "finished" else None,
                finished_at=now + timedelta(seconds=n) if status == "finished" else None,
            )

    await sync_to_async(record)()
    status, body = await call("GET", _path(running, "runs"), await token_of(alice))
    assert status == 200
    assert [(r["run_id"], r["status"], r["user"]) for r in body] == [
        ("r1", "running", "alice"),
        ("r0", "finished", "alice"),
    ]
    assert set(body[0]) == {
        "run_id",
        "mode",
        "user",
        "status",
        "exit_code",
        "error",
        "outcome",
        "started_at",
        "finished_at",
    }
    assert (await call("GET", _path(running, "runs"), await token_of(admin)))[0] == 200
    status, body = await call("GET", _path(running, "runs"), await token_of(bob))
    assert (status, body["message"]) == (404, "No such session.")


async def test_the_history_says_how_each_run_ended(running, alice, fake_agent):
    """A run that raised, one interrupted, one that exited 3, one past its timeout:
    each row says so (it used to say "finished" for all but the last)."""
    token = await token_of(alice)
    endings = [
        ({"exit_code": 0}, "finished"),
        ({"exit_code": 1, "error": "ZeroDivisionError"}, "error: ZeroDivisionError"),
        ({"exit_code": 1, "error": "KeyboardInterrupt"}, "interrupted"),
        ({"exit_code": 3}, "exit status 3"),
        ({"status": "exec-timeout", "exit_code": None}, "timed out"),
    ]
    for n, (fields, _) in enumerate(endings):
        request = execute(running, token, {"mode": "query", "code": "x", "run_id": f"r{n}"})
        await answer(fake_agent, await frame_of(fake_agent, protocol.EXEC), **fields)
        status, body = await request
        assert status == 200 and body.get("error") == fields.get("error"), body
    await runs_when(running, lambda rows: len(rows) == len(endings))
    status, body = await call("GET", _path(running, "runs"), token)
    assert status == 200
    assert [(r["run_id"], r["outcome"]) for r in reversed(body)] == [
        (f"r{n}", words) for n, (_, words) in enumerate(endings)
    ]
    assert [r["error"] for r in reversed(body)] == [
        "",
        "ZeroDivisionError",
        "KeyboardInterrupt",
        "",
        "",
    ]


# --- REST: who may, and in which sessions --------------------------------------


async def test_bob_cannot_run_code_in_alices_session(running, bob, fake_agent):
    status, body = await call(
        "POST", _path(running), await token_of(bob), {"mode": "query", "code": "1"}
    )
    assert (status, body["message"]) == (404, "No such session.")
    await no_frame_of(fake_agent, protocol.EXEC)
    assert await runs_of(running) == []


@pytest.mark.parametrize("session_id", ["00000000-0000-0000-0000-000000000000", "not-a-uuid"])
async def test_no_such_session_is_a_404_and_asks_no_agent(running, alice, fake_agent, session_id):
    status, body = await call(
        "POST",
        f"/api/v1/sessions/{session_id}/execute/",
        await token_of(alice),
        {"mode": "query", "code": "1"},
    )
    assert (status, body["message"]) == (404, "No such session.")
    await no_frame_of(fake_agent, protocol.EXEC)


async def test_the_token_and_the_sessions_facts_are_read_in_one_query_as_each_alone(
    running, alice, bob
):
    """The execute endpoint's token check reads main1's facts beside the token;
    each user then sees them only as the ownership rule lets them."""

    def read(user):
        _, key = token_create(user=user)
        prefix = key[: len(AuthToken.objects.filter(user=user).latest("created").token_key)]
        ((token, facts),) = selectors.token_candidates_with_main_facts(prefix, str(running.pk))
        assert token.user == user and token.digest == hash_token(key)
        alone = (
            selectors.session_main_facts_for_user(user=user, session_id=running.pk)
            if user == alice
            else None
        )
        return facts, alone

    facts, alone = await sync_to_async(read)(alice)
    assert facts == alone and facts["kernel_id"] == running.pk  # main1's id is the session's
    assert selectors.visible_main_facts(user=alice, facts=facts) == facts
    facts, _ = await sync_to_async(read)(bob)
    assert facts == alone  # read whoever asks; bob is refused after, by the rule:
    with pytest.raises(NotFound):
        selectors.visible_main_facts(user=bob, facts=facts)


async def test_a_rest_run_makes_one_query_before_its_agent_hears_of_it(
    running, alice, bob, fake_agent, monkeypatch
):
    """The token, its user and main1's facts come back in one round trip; bob's token
    reads the same query and is still told there is no such session."""
    import threading

    from django.db.backends.utils import CursorWrapper

    statements: list[str] = []
    real_execute = CursorWrapper.execute

    def counting(self, sql, params=None):
        if threading.current_thread().name.startswith("request"):  # the request's own
            statements.append(sql)
        return real_execute(self, sql, params)

    alice_token, bob_token = await token_of(alice), await token_of(bob)
    monkeypatch.setattr(CursorWrapper, "execute", counting)
    request = execute(running, alice_token, {"mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    (only,) = statements
    assert "knox_authtoken" in only and "sessions_app_kernel" in only
    await answer(fake_agent, command)
    assert (await request)[0] == 200

    statements.clear()
    status, body = await call("POST", _path(running), bob_token, {"mode": "query", "code": "1"})
    assert (status, body["message"], len(statements)) == (404, "No such session.", 1)
    await no_frame_of(fake_agent, protocol.EXEC)


async def test_an_admin_may_run_code_in_anyones_session_without_counting_as_its_owner(
    running, admin, fake_agent
):
    long_ago = timezone.now() - timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    request = execute(running, await token_of(admin), {"mode": "query", "code": "1"})
    await answer(fake_agent, await frame_of(fake_agent, protocol.EXEC))
    assert (await request)[0] == 200
    assert (await runs_when(running, lambda rows: rows))[0].user_id == admin.pk
    await asyncio.sleep(consumers_touch_gap() + 0.2)
    session = await sync_to_async(Session.objects.get)(pk=running.pk)
    assert session.last_activity_at == long_ago


def consumers_touch_gap() -> float:
    from sessions_app import loop

    return loop.TOUCH_FLUSH_GAP


async def test_every_request_of_the_owner_counts_as_activity(running, alice, fake_agent):
    long_ago = timezone.now() - timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    request = execute(running, await token_of(alice), {"mode": "interrupt"})
    await answer(fake_agent, await frame_of(fake_agent, protocol.EXEC), run_id="")
    assert (await request)[0] == 200
    assert await active_since(running, long_ago)


async def test_a_409_counts_as_activity_once_its_answer_is_out_with_nothing_logged(
    running, alice, fake_agent, monkeypatch, caplog
):
    """The activity of a refused run is written after its request ended. The write
    used to inherit the request's context, and with it (in SQLite's thread-sensitive
    mode, the embedded default) the request thread's executor, gone by then:
    ``RuntimeError: CurrentThreadExecutor already quit``, and the activity was lost."""
    from channels.db import database_sync_to_async

    from sessions_app import loop

    monkeypatch.setattr(loop, "db", lambda func: database_sync_to_async(func))  # as SQLite
    token = await token_of(alice)
    request = execute(running, token, {"mode": "query", "code": "1"})
    await answer(fake_agent, await frame_of(fake_agent, protocol.EXEC))
    assert (await request)[0] == 200
    long_ago = timezone.now() - timedelta(hours=3)
    # The first request's activity is written; the next one waits for the flush gap.
    await asyncio.sleep(0.3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    request = execute(running, token, {"mode": "query", "code": "2"})
    reason = "another run (r1) is still going in this session; continue or interrupt it first"
    await answer(fake_agent, await frame_of(fake_agent, protocol.EXEC), run_id="", reason=reason)
    assert (await request)[0] == 409
    assert await active_since(running, long_ago, timeout=loop.TOUCH_FLUSH_GAP + 2)
    failed = [r for r in caplog.records if r.name == "sessions_app.loop" or r.exc_info]
    assert not failed, [r.getMessage() for r in failed]


async def test_code_runs_in_interactive_sessions_only(alice, image, agent, fake_agent):
    def batch_session():
        session = services.session_create(
            owner=alice, spec={"image": image.reference, "type": "batch", "startup_command": "true"}
        )
        for kernel in Kernel.objects.filter(session=session):
            reconcile.kernel_apply_report(kernel=kernel, report={"status": protocol.KR_RUNNING})
        return Session.objects.get(pk=session.pk)

    batch = await sync_to_async(batch_session)()
    assert batch.status == Status.RUNNING
    token = await token_of(alice)
    status, body = await call("POST", _path(batch), token, {"mode": "query", "code": "1"})
    assert (status, body["message"]) == (409, execution.BATCH_SESSION)
    await no_frame_of(fake_agent, protocol.EXEC)
    assert await runs_of(batch) == []
    message = await refused(await browser(_path_ws(batch), alice), consumers.CLOSE_NOT_READY)
    assert message == execution.BATCH_SESSION


async def test_a_session_that_is_not_running_says_its_status(running, alice, fake_agent):
    token = await token_of(alice)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(status=Status.PREPARING)
    status, body = await call("POST", _path(running), token, {"mode": "query", "code": "1"})
    assert status == 409 and "not running yet (PREPARING)" in body["message"]
    assert body["extra"] == {"status": "PREPARING"}

    await sync_to_async(services.session_terminate)(session=running, reason="done for today")
    status, body = await call("POST", _path(running), token, {"mode": "query", "code": "1"})
    assert status == 409 and "has ended" in body["message"]
    assert "done for today" in body["message"]
    await no_frame_of(fake_agent, protocol.EXEC)


# --- REST: bad input -------------------------------------------------------------

BAD_BODIES = [
    ({}, "mode", "mode: is required"),
    ({"mode": "run"}, "mode", "must be one of query, batch, continue"),
    ({"mode": "query", "code": 5}, "code", "code: must be a string"),
    ({"mode": "query", "colour": "red"}, "colour", "colour: unknown field"),
    ({"mode": "continue"}, "run_id", "run_id: is required to continue a run"),
    ({"mode": "input", "code": "x"}, "run_id", "run_id: is required to give a run its input"),
    ({"mode": "interrupt", "code": "x"}, "code", "code: interrupt takes no code"),
    ({"mode": "query", "run_id": "a b"}, "run_id", "letters, digits, '_' and '-' only"),
    ({"mode": "query", "run_id": "r" * 65}, "run_id", "at most 64 characters"),
    ({"mode": "query", "options": {"timeout": -1}}, "options.timeout", "number of seconds"),
    ({"mode": "query", "options": {"timeout": 1e9}}, "options.timeout", "at most 86400"),
    ({"mode": "query", "options": {"timeout": "1m"}}, "options.timeout", "number of seconds"),
    ({"mode": "query", "options": []}, "options", "must be an object"),
    ({"mode": "query", "options": {"exec": "make"}}, "options.exec", "only batch take it"),
    ({"mode": "batch", "code": "x"}, "options.exec", "a batch run needs the command to run"),
    ({"mode": "batch", "options": {"exec": "x" * 70000}}, "options.exec", "at most 65536"),
    (
        {"mode": "complete", "code": "ab", "options": {"cursor_pos": 5}},
        "options.cursor_pos",
        "5 is past the end of the code (2 characters)",
    ),
    ({"mode": "query", "code": "\ud800"}, "code", "lone surrogate"),
    # Python cannot compile it (ipykernel 6 used to hang on it, run after run refused).
    ({"mode": "query", "code": "x = 1\nprint('a\u0000b')"}, "code", "NUL character (line 2)"),
    (
        {"mode": "batch", "options": {"exec": "echo a\u0000b"}},
        "options.exec",
        "NUL character (line 1), which shell commands cannot hold",
    ),
]


@pytest.mark.parametrize("body, field, words", BAD_BODIES)
async def test_a_bad_request_is_a_400_that_names_the_field_and_reaches_no_agent(
    running, alice, fake_agent, body, field, words
):
    status, answer_ = await call("POST", _path(running), await token_of(alice), body)
    assert status == 400, answer_
    assert field in answer_["extra"]["fields"], answer_
    assert words in answer_["message"], answer_
    await no_frame_of(fake_agent, protocol.EXEC, timeout=0.2)
    assert await runs_of(running) == []


async def test_a_body_that_is_not_an_object_or_not_json_is_a_400(running, alice):
    token = await token_of(alice)
    status, body = await call("POST", _path(running), token, ["query"])
    assert (status, body["message"]) == (400, "The body must be a JSON object.")
    status, body = await call("POST", _path(running), token, raw=b'{"mode": ')
    assert status == 400 and "JSON parse error" in body["message"]


async def test_code_is_bounded_by_its_utf8_size_and_may_outgrow_the_usual_body_limit(
    running, alice, fake_agent, settings
):
    settings.BAI_EXEC_MAX_CODE = 3000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    token = await token_of(alice)
    status, body = await call("POST", _path(running), token, {"mode": "query", "code": "é" * 1501})
    assert (status, body["message"]) == (
        400,
        "code: 3002 bytes of utf-8; the limit is 3000 bytes",
    )
    # 2,500 bytes of code: past the usual body limit, within the code's.
    request = execute(running, token, {"mode": "query", "code": "x" * 2500})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert len(command["code"]) == 2500
    await answer(fake_agent, command)
    assert (await request)[0] == 200
    # Other endpoints keep the usual limit; past the code's, so does this one.
    status, _ = await call("POST", "/api/v1/sessions/preview/", token, {"name": "x" * 3000})
    assert status == 413
    status, body = await call("POST", _path(running), token, raw=b"x" * 10**6)
    assert status == 413 and "the limit is" in body["message"]


# --- REST: waiting --------------------------------------------------------------


async def test_a_silent_agent_gets_a_504_that_says_so(running, alice, fake_agent, settings):
    settings.BAI_EXEC_FLUSH = 0.05
    execution.ANSWER_GRACE, grace = 0.5, execution.ANSWER_GRACE
    try:
        request = execute(running, await token_of(alice), {"mode": "query", "code": "1"})
        command = await frame_of(fake_agent, protocol.EXEC)
        status, body = await request
    finally:
        execution.ANSWER_GRACE = grace
    assert status == 504
    assert body["message"] == (
        f"main1's agent did not answer within 0.55 s; run {command['run_id']} may still be "
        "going; try again"
    )
    assert body["extra"] == {"run_id": command["run_id"]}
    # The run may be going: it is in the history as such.
    (row,) = await runs_of(running)
    assert (row.run_id, row.status, row.finished_at) == (command["run_id"], "running", None)
    # Its answer, once it comes, is still taken for the history (and dropped quietly).
    await answer(fake_agent, command)
    await no_frame_of(fake_agent, protocol.ERROR)


async def test_an_agent_that_goes_away_answers_the_waiting_request_at_once(
    running, alice, fake_agent
):
    request = execute(running, await token_of(alice), {"mode": "query", "code": "1"})
    await frame_of(fake_agent, protocol.EXEC)
    await fake_agent.disconnect()
    status, body = await asyncio.wait_for(request, 5)
    assert status == 504
    assert "agent disconnected before it answered" in body["message"]


async def test_other_requests_are_answered_while_an_execute_waits_for_its_agent(
    running, alice, fake_agent
):
    token = await token_of(alice)
    waiting = [execute(running, token, {"mode": "query", "code": str(n)}) for n in range(3)]
    commands = [await frame_of(fake_agent, protocol.EXEC) for _ in waiting]
    status, body = await call("GET", f"/api/v1/sessions/{running.pk}/", token)
    assert (status, body["status"]) == (200, "RUNNING")
    assert not any(task.done() for task in waiting)
    for command in commands:
        await answer(fake_agent, command)
    assert [(await task)[0] for task in waiting] == [200, 200, 200]


# --- the gateway: answers go only where they were asked ------------------------------


async def test_an_agent_cannot_answer_a_request_sent_to_another_agent(
    running, alice, fake_agent, make_agent
):
    other = await sync_to_async(make_agent)("agent-2")
    intruder = await registered_agent(other.plain_token)
    request = execute(running, await token_of(alice), {"mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    await answer(intruder, command, records=[stdout("forged\n")])
    refusal = await frame_of(intruder, protocol.ERROR)
    assert refusal["message"] == (
        f"exec frame refused: request {command['req_id']} was not sent to this agent"
    )
    assert not request.done()
    await answer(fake_agent, command, records=[stdout("real\n")])
    status, body = await request
    assert (status, body["records"]) == (200, [stdout("real\n")])
    await intruder.disconnect()


async def test_frames_of_unknown_requests_are_refused_and_late_ones_dropped_quietly(
    running, alice, fake_agent
):
    unknown = {
        "type": protocol.EXEC_RECORDS,
        "req_id": "0" * 32,
        "run_id": "r1",
        "records": [stdout("x")],
    }
    await fake_agent.send_json_to(unknown)
    refusal = await frame_of(fake_agent, protocol.ERROR)
    assert "was not sent to this agent" in refusal["message"]

    request = execute(running, await token_of(alice), {"mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    await answer(fake_agent, command)
    assert (await request)[0] == 200
    # The request is over: a late frame of it changes nothing and earns no error.
    await fake_agent.send_json_to({**unknown, "req_id": command["req_id"]})
    await answer(fake_agent, command)
    await no_frame_of(fake_agent, protocol.ERROR)


async def test_registration_tells_the_agent_the_output_limit(agent, settings):
    settings.BAI_EXEC_OUTPUT_LIMIT = 1 << 20
    comm = WebsocketCommunicator(
        application,
        "/ws/agent/",
        headers=[(b"authorization", f"Token {agent.plain_token}".encode())],
    )
    await comm.connect()
    await comm.send_json_to(
        {"type": protocol.REGISTER, "protocol": protocol.PROTOCOL_VERSION, "kernels": []}
    )
    registered = await comm.receive_json_from(timeout=5)
    assert registered["exec_output_limit"] == 1 << 20
    await comm.disconnect()


# --- the websocket ------------------------------------------------------------------


def _path_ws(session) -> str:
    return f"/ws/sessions/{session.pk}/execute/"


async def open_runs(session, user, *, activity: bool = False):
    """The console's socket; its ``{"type": "activity"}`` notices (the owner's
    activity was written) are left out unless ``activity``."""
    comm = await browser(_path_ws(session), user)
    assert (await comm.connect())[0]
    if not activity:
        receive = comm.receive_json_from

        async def receive_json_from(timeout: float = 1):
            while (message := await receive(timeout=timeout)) == {"type": "activity"}:
                pass
            return message

        comm.receive_json_from = receive_json_from
    return comm


async def test_a_streamed_run_sends_records_as_they_come_then_its_result(
    running, alice, fake_agent
):
    comm = await open_runs(running, alice)
    await comm.send_json_to({"type": "run", "mode": "query", "code": "for i in range(2): ..."})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["stream"], command["mode"]) == (True, "query")
    for n in range(2):
        await fake_agent.send_json_to(
            {
                "type": protocol.EXEC_RECORDS,
                "req_id": command["req_id"],
                "run_id": command["run_id"],
                "records": [stdout(f"{n}\n")],
            }
        )
        assert await comm.receive_json_from(timeout=5) == {
            "type": "records",
            "run_id": command["run_id"],
            "records": [stdout(f"{n}\n")],
        }
    await answer(fake_agent, command, exit_code=0)
    assert await comm.receive_json_from(timeout=5) == {
        "type": "result",
        "run_id": command["run_id"],
        "status": "finished",
        "exit_code": 0,
    }
    # The stream writes the history off its path, then says so: the row is there.
    assert await comm.receive_json_from(timeout=5) == {
        "type": "history",
        "run_ids": [command["run_id"]],
    }
    rows = await runs_of(running)
    assert [r.status for r in rows] == ["finished"]
    assert (rows[0].run_id, rows[0].user_id, rows[0].exit_code) == (command["run_id"], alice.pk, 0)
    await comm.disconnect()


async def test_input_interrupt_and_completion_travel_over_the_websocket(running, alice, fake_agent):
    comm = await open_runs(running, alice)
    await comm.send_json_to({"type": "run", "mode": "query", "code": "input()", "run_id": "r7"})
    command = await frame_of(fake_agent, protocol.EXEC)
    await answer(fake_agent, command, status="waiting-input", exit_code=None)
    result = await comm.receive_json_from(timeout=5)
    assert (result["type"], result["status"], result["run_id"]) == ("result", "waiting-input", "r7")

    await comm.send_json_to({"type": "input", "run_id": "r7", "code": "alice"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["mode"], command["run_id"], command["code"]) == ("input", "r7", "alice")
    await answer(fake_agent, command, status="continued", exit_code=None)
    assert (await comm.receive_json_from(timeout=5))["status"] == "continued"

    await comm.send_json_to({"type": "interrupt", "run_id": "r7"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["mode"], command["run_id"]) == ("interrupt", "r7")
    error = {"kind": "error", "data": "KeyboardInterrupt", "mime": None}
    await answer(fake_agent, command, exit_code=1, records=[error])
    assert (await comm.receive_json_from(timeout=5))["records"] == [error]
    assert (await comm.receive_json_from(timeout=5))["exit_code"] == 1

    await comm.send_json_to({"type": "complete", "code": "import o", "cursor_pos": 8})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["mode"], command["options"]) == ("complete", {"cursor_pos": 8})
    await answer(fake_agent, command, run_id="", exit_code=None, completions=["os"])
    assert (await comm.receive_json_from(timeout=5))["completions"] == ["os"]
    # One run in the history: started by the query, closed by the interrupt's answer.
    rows = await runs_when(running, lambda rows: [r.status for r in rows] == ["finished"])
    assert [(r.run_id, r.status, r.exit_code) for r in rows] == [("r7", "finished", 1)]
    await comm.disconnect()


async def test_an_open_console_is_not_activity_and_a_run_is_and_the_page_is_told(
    running, alice, fake_agent
):
    long_ago = timezone.now() - timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    comm = await open_runs(running, alice, activity=True)
    assert not await active_since(running, long_ago, timeout=1.5)
    await comm.send_json_to({"type": "run", "mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    # Once written, the page hears of it (it re-reads the session's times).
    assert await comm.receive_json_from(timeout=5) == {"type": "activity"}
    assert await active_since(running, long_ago, timeout=0.1)
    await answer(fake_agent, command)
    assert (await comm.receive_json_from(timeout=5))["type"] == "result"
    await comm.disconnect()


async def test_a_console_opened_again_shows_the_run_waiting_for_input_and_can_end_it(
    running, alice, fake_agent
):
    """A page reloaded while its run waited in input() used to know nothing of it:
    no answer box, Interrupt disabled, and every run refused."""
    comm = await open_runs(running, alice)
    await comm.send_json_to({"type": "attach"})
    attach = await frame_of(fake_agent, protocol.EXEC)
    assert (attach["mode"], attach["run_id"], attach["stream"]) == ("continue", None, True)
    await answer(fake_agent, attach, run_id="r5", status="waiting-input", exit_code=None)
    assert await comm.receive_json_from(timeout=5) == {"type": "pending", "run_id": "r5"}
    result = await comm.receive_json_from(timeout=5)
    assert (result["type"], result["run_id"], result["status"]) == ("result", "r5", "waiting-input")
    await comm.send_json_to({"type": "interrupt", "run_id": "r5"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert (command["mode"], command["run_id"]) == ("interrupt", "r5")
    await answer(fake_agent, command, run_id="r5", exit_code=1, error="KeyboardInterrupt")
    result = await comm.receive_json_from(timeout=5)
    assert (result["status"], result["exit_code"], result["error"]) == (
        "finished",
        1,
        "KeyboardInterrupt",
    )
    await comm.disconnect()


async def test_attaching_with_no_run_going_shows_nothing_and_is_not_activity(
    running, alice, fake_agent
):
    long_ago = timezone.now() - timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    comm = await open_runs(running, alice, activity=True)
    await comm.send_json_to({"type": "attach"})
    attach = await frame_of(fake_agent, protocol.EXEC)
    await answer(fake_agent, attach, run_id="", reason="no run is going in this session")
    assert await comm.receive_nothing(timeout=0.5)  # the attach's refusal is not shown
    assert not await active_since(running, long_ago, timeout=1.2)
    await comm.disconnect()


async def test_the_websocket_says_why_it_refuses_a_request_and_stays_open(
    running, alice, fake_agent
):
    comm = await open_runs(running, alice)
    cases = [
        ({"type": "run", "mode": "continue"}, "run: mode must be query or batch"),
        (
            {"type": "dance"},
            "unknown message; send run, input, interrupt, complete, attach or ping",
        ),
        ({"type": "input", "code": "x"}, "run_id: is required to give a run its input"),
        ({"type": "run", "mode": "query", "shell": "sh"}, "run: unknown field shell"),
        ({"type": "run", "mode": "query", "code": 1}, "code: must be a string"),
    ]
    for message, words in cases:
        await comm.send_json_to(message)
        assert await comm.receive_json_from(timeout=5) == {"type": "error", "message": words}
    await no_frame_of(fake_agent, protocol.EXEC, timeout=0.2)

    await comm.send_json_to({"type": "run", "mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    await answer(fake_agent, command, exit_code=None, reason="no run r9 in this session")
    reply = await comm.receive_json_from(timeout=5)
    assert reply == {"type": "error", "message": "no run r9 in this session"}
    await comm.send_json_to({"type": "ping"})
    assert (await comm.receive_json_from(timeout=5))["type"] == "pong"
    assert await runs_of(running) == []  # a refused start leaves no run
    await comm.disconnect()


async def test_a_malformed_frame_closes_the_websocket_with_4400(running, alice, fake_agent):
    comm = await open_runs(running, alice)
    await comm.send_to(text_data="[not an object")
    error = await comm.receive_json_from(timeout=5)
    assert error["code"] == consumers.CLOSE_BAD_INPUT and "not JSON" in error["message"]
    assert (await comm.receive_output(timeout=5))["code"] == consumers.CLOSE_BAD_INPUT


async def test_the_websocket_refuses_strangers_visitors_and_ended_sessions(
    running, alice, bob, image, agent
):
    await refused(await browser(_path_ws(running)), consumers.CLOSE_UNAUTHENTICATED)
    message = await refused(await browser(_path_ws(running), bob), consumers.CLOSE_NOT_FOUND)
    assert message == "No such session."
    await sync_to_async(services.session_terminate)(session=running, reason="bye")
    message = await refused(await browser(_path_ws(running), alice), consumers.CLOSE_GONE)
    assert "has ended" in message


async def test_the_websocket_closes_when_the_session_ends_under_it(running, alice, fake_agent):
    comm = await open_runs(running, alice)
    await sync_to_async(services.session_terminate)(session=running, reason="enough")
    error = await comm.receive_json_from(timeout=5)
    assert error["code"] == consumers.CLOSE_GONE and "enough" in error["message"]


async def test_an_agent_cannot_stream_into_another_agents_request(
    running, alice, fake_agent, make_agent
):
    other = await sync_to_async(make_agent)("agent-2")
    intruder = await registered_agent(other.plain_token)
    comm = await open_runs(running, alice, activity=True)
    await comm.send_json_to({"type": "run", "mode": "query", "code": "1"})
    command = await frame_of(fake_agent, protocol.EXEC)
    assert await comm.receive_json_from(timeout=5) == {"type": "activity"}
    forged = {
        "type": protocol.EXEC_RECORDS,
        "req_id": command["req_id"],
        "run_id": command["run_id"],
        "records": [stdout("forged")],
    }
    await intruder.send_json_to(forged)
    assert "not sent to this agent" in (await frame_of(intruder, protocol.ERROR))["message"]
    assert await comm.receive_nothing(timeout=0.3)
    await intruder.disconnect()
    await comm.disconnect()


async def test_a_second_session_keeps_its_own_answers(running, alice, image, fake_agent):
    other = await sync_to_async(running_session)(alice, image, size=1)
    token = await token_of(alice)
    first = execute(running, token, {"mode": "query", "code": "a"})
    second = execute(other, token, {"mode": "query", "code": "b"})
    commands = {
        c["kernel_id"]: c for c in [await frame_of(fake_agent, protocol.EXEC) for _ in "ab"]
    }
    await answer(fake_agent, commands[str(other.pk)], records=[stdout("b")])
    await answer(fake_agent, commands[str(running.pk)], records=[stdout("a")])
    assert (await first)[1]["records"] == [stdout("a")]
    assert (await second)[1]["records"] == [stdout("b")]


async def test_rest_requests_share_one_reply_channel_and_a_late_answer_reaches_no_one(
    running, alice, fake_agent, settings
):
    settings.BAI_EXEC_FLUSH = 0.05
    execution.ANSWER_GRACE, grace = 0.2, execution.ANSWER_GRACE
    token = await token_of(alice)
    try:
        gave_up = execute(running, token, {"mode": "query", "code": "1"})
        late = await frame_of(fake_agent, protocol.EXEC)
        assert (await gave_up)[0] == 504
        replies = execution._replies_here()
        channel = replies.channel
        request = execute(running, token, {"mode": "continue", "run_id": late["run_id"]})
        command = await frame_of(fake_agent, protocol.EXEC)
        # The first request's answer comes after it stopped waiting: no one takes it.
        await answer(fake_agent, late, records=[stdout("late")])
        await answer(fake_agent, command, records=[stdout("mine")])
        status, body = await request
    finally:
        execution.ANSWER_GRACE = grace
    assert (status, body["records"]) == (200, [stdout("mine")])
    # One subscription for every request of the process, and nothing left waiting.
    assert channel is not None and replies.channel == channel
    assert replies.waiting == {}
