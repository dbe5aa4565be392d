"""Browser websockets over the real ASGI router (origin, login, ownership, streams).

A fake agent connected to the gateway stands in for the node daemon, so each
stream is checked end to end: browser → consumer → channel layer → gateway →
agent, and back.

Personas (tests/conftest.py): alice owns the sessions; bob is another plain
user and must not learn they exist; root is an admin and may attach.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from agent import protocol
from backendai_web.asgi import application
from scheduler_app import reconcile
from sessions_app import consumers, services, terminals
from sessions_app.models import Kernel, Session, Status

from .helpers import (
    HOST,
    active_since,
    browser,
    cookie_for,
    frame_of,
    no_frame_of,
    refused,
    running_session,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _own_channel_prefix(settings):
    """Other test runs share this Redis: a prefix of our own keeps their pushes out."""
    layers = dict(settings.CHANNEL_LAYERS)
    default = dict(layers["default"])
    default["CONFIG"] = {**default["CONFIG"], "prefix": f"t{uuid.uuid4().hex[:10]}"}
    settings.CHANNEL_LAYERS = {**layers, "default": default}


def _term_path(session, term: str | None = None, **params) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"term": term, **params}.items() if v is not None)
    return f"/ws/sessions/{session.pk}/terminal/" + (f"?{query}" if query else "")


# --- the sessions list stream ------------------------------------------------


async def test_the_sessions_stream_refuses_an_anonymous_visitor_with_a_reason(db):
    message = await refused(await browser("/ws/sessions/"), consumers.CLOSE_UNAUTHENTICATED)
    assert "Log in" in message


async def test_the_sessions_stream_pushes_the_owners_status_changes_only(alice, bob, image, agent):
    mine = await browser("/ws/sessions/", alice)
    theirs = await browser("/ws/sessions/", bob)
    assert (await mine.connect())[0] and (await theirs.connect())[0]

    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )

    seen = {}
    while "SCHEDULED" not in seen:
        push = await mine.receive_json_from(timeout=5)
        assert push["type"] == "sessions.changed"
        for item in push["sessions"]:
            assert item["id"] == str(session.pk)
            seen.setdefault(item["status"], item)
    assert seen["PENDING"]["reason"] == "created"
    assert "placed" in seen["SCHEDULED"]["reason"]
    assert await theirs.receive_nothing(timeout=0.3)
    await mine.disconnect()
    await theirs.disconnect()


async def test_the_sessions_stream_answers_pings_and_rejects_other_messages(alice):
    comm = await browser("/ws/sessions/", alice)
    await comm.connect()
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from(timeout=5) == {"type": "pong"}
    await comm.send_json_to({"type": "subscribe", "user": 1})
    assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from(timeout=5) == {"type": "pong"}
    await comm.disconnect()


async def _connects(user, origin: bytes | None, host: bytes | None = b"localhost:8000") -> bool:
    headers = [(b"cookie", await sync_to_async(cookie_for)(user))]
    headers += [(b"origin", origin)] if origin is not None else []
    headers += [(b"host", host)] if host is not None else []
    comm = WebsocketCommunicator(application, "/ws/sessions/", headers=headers)
    connected, _ = await comm.connect()
    if connected:
        await comm.disconnect()
    return connected


# A frame that is not a message closes the stream with 4400 and says why:
# never 1011 (a crash), and at bounded cost.
MALFORMED_FRAMES = [
    pytest.param({"text_data": "not json"}, "not JSON", id="not JSON"),
    pytest.param({"text_data": '["ping"]'}, "JSON object", id="not an object"),
    pytest.param(
        {"text_data": '{"type": "ping", "x": "\\ud800"}'}, "lone surrogate", id="a lone surrogate"
    ),
    pytest.param({"text_data": '{"\\udfff": 1}'}, "lone surrogate", id="a lone surrogate in a key"),
    pytest.param({"text_data": "[" * 100_000 + "]" * 100_000}, "limit", id="100,000 deep"),
    pytest.param({"text_data": '{"a":' * 50 + "1" + "}" * 50}, "nested deeper", id="50 deep"),
    pytest.param(
        {"text_data": '{"type": "ping", "pad": "' + "x" * 5000 + '"}'}, "limit", id="too big"
    ),
    pytest.param({"bytes_data": b'{"type": "ping"}'}, "binary", id="binary"),
]


async def closed_for_bad_input(comm: WebsocketCommunicator) -> str:
    """The stream answers with an error saying why, then closes with 4400."""
    message = await comm.receive_json_from(timeout=5)
    assert message["type"] == "error" and message["code"] == consumers.CLOSE_BAD_INPUT
    assert await comm.receive_output(timeout=5) == {
        "type": "websocket.close",
        "code": consumers.CLOSE_BAD_INPUT,
    }
    return message["message"]


@pytest.mark.parametrize("frame, why", MALFORMED_FRAMES)
async def test_the_sessions_stream_closes_with_4400_on_a_malformed_frame(alice, frame, why):
    comm = await browser("/ws/sessions/", alice)
    await comm.connect()
    await comm.send_to(**frame)
    assert why in await closed_for_bad_input(comm)


async def test_a_foreign_origin_is_refused_before_anything_else(alice, settings):
    pass


@pytest.mark.parametrize(
    "origin",
    [
        b"http://evil.example",
        b"http://localhost:9999",  # another page served on this machine
        b"http://127.0.0.1:8000",  # same port, another host name: another origin
        b"https://localhost:8000.evil.example",
        b"null",  # a sandboxed frame or a file:// page
    ],
)
async def test_a_foreign_origin_is_refused_in_the_default_mode(alice, origin):
    assert not await _connects(alice, origin)


async def test_a_page_of_the_site_itself_may_open_a_socket_in_the_default_mode(alice):
    assert await _connects(alice, b"http://localhost:8000")


async def test_an_origin_without_a_host_header_is_refused(alice):
    assert not await _connects(alice, b"http://localhost:8000", host=None)


async def test_a_host_outside_allowed_hosts_is_refused_even_from_its_own_origin(alice):
    assert not await _connects(alice, b"http://evil.example", host=b"evil.example")


async def test_a_client_without_an_origin_is_not_logged_in_by_its_cookie(alice):
    """Browsers always send an Origin: a client without one gets in only with a token."""
    comm = WebsocketCommunicator(
        application,
        "/ws/sessions/",
        headers=[HOST, (b"cookie", await sync_to_async(cookie_for)(alice))],
    )
    await refused(comm, consumers.CLOSE_UNAUTHENTICATED)


async def test_an_origin_listed_in_csrf_trusted_origins_is_accepted(alice, settings):
    """A proxy in front may rewrite Host: its public origin is listed instead."""
    settings.CSRF_TRUSTED_ORIGINS = ["https://bai.example.org"]
    assert await _connects(alice, b"https://bai.example.org", host=b"localhost:8000")


# --- terminal: refusals ----------------------------------------------------------


async def test_the_terminal_refuses_an_anonymous_visitor(running):
    await refused(await browser(_term_path(running)), consumers.CLOSE_UNAUTHENTICATED)


async def test_another_users_terminal_is_simply_not_found(running, bob):
    message = await refused(await browser(_term_path(running), bob), consumers.CLOSE_NOT_FOUND)
    assert message == "No such session."


@pytest.mark.parametrize("bad_id", ["not-a-uuid", str(uuid.uuid4())])
async def test_a_bad_session_id_is_not_found(alice, bad_id):
    comm = await browser(f"/ws/sessions/{bad_id}/terminal/", alice)
    await refused(comm, consumers.CLOSE_NOT_FOUND)


async def test_an_ended_session_has_no_terminal(running, alice):
    await sync_to_async(services.session_terminate)(session=running, reason="done")
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(status=Status.TERMINATED)
    message = await refused(await browser(_term_path(running), alice), consumers.CLOSE_GONE)
    assert "ended" in message


async def test_a_session_still_starting_says_so_and_the_page_retries(alice, image, agent):
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    message = await refused(await browser(_term_path(session), alice), consumers.CLOSE_NOT_READY)
    assert "not running yet" in message


@pytest.mark.parametrize(
    "params",
    [{"term": "../../etc"}, {"term": "x" * 40}, {"cols": "0"}, {"rows": "100000"}, {"cols": "abc"}],
)
async def test_bad_terminal_parameters_are_refused(running, alice, params):
    path = f"/ws/sessions/{running.pk}/terminal/?" + "&".join(f"{k}={v}" for k, v in params.items())
    await refused(await browser(path, alice), consumers.CLOSE_BAD_INPUT)


# --- terminal: the stream --------------------------------------------------------


async def test_terminal_input_reaches_the_agent_and_its_output_reaches_the_browser(
    running, alice, fake_agent
):
    tab = str(uuid.uuid4())
    comm = await browser(_term_path(running, tab, cols=100, rows=30), alice)
    assert (await comm.connect())[0]
    opened = await frame_of(fake_agent, protocol.TERM_OPEN)
    assert opened["kernel_id"] == str(running.pk)  # main1's kernel id is the session id
    assert (opened["cols"], opened["rows"]) == (100, 30)
    term_id = opened["term_id"]
    assert tab.replace("-", "") in term_id and running.pk.hex in term_id
    assert await comm.receive_json_from(timeout=5) == {"type": "ready", "term": tab}

    await comm.send_json_to({"type": "input", "data": "echo $BACKENDAI_CLUSTER_HOST\r"})
    sent = await frame_of(fake_agent, protocol.TERM_INPUT)
    assert sent == {
        "type": protocol.TERM_INPUT,
        "term_id": term_id,
        "data": "echo $BACKENDAI_CLUSTER_HOST\r",
    }

    await fake_agent.send_json_to(
        {"type": protocol.TERM_OUTPUT, "term_id": term_id, "data": "main1\r\n$ "}
    )
    assert await comm.receive_json_from(timeout=5) == {"type": "output", "data": "main1\r\n$ "}

    await comm.send_json_to({"type": "resize", "cols": 120, "rows": 40})
    resized = await frame_of(fake_agent, protocol.TERM_RESIZE)
    assert (resized["term_id"], resized["cols"], resized["rows"]) == (term_id, 120, 40)

    await comm.disconnect()
    detached = await frame_of(fake_agent, protocol.TERM_DETACH)
    assert detached["term_id"] == term_id


async def test_a_reconnect_with_the_same_tab_id_reattaches_to_the_same_shell(
    running, alice, fake_agent
):
    tab = str(uuid.uuid4())
    first = await browser(_term_path(running, tab), alice)
    await first.connect()
    term_id = (await frame_of(fake_agent, protocol.TERM_OPEN))["term_id"]
    await first.disconnect()
    await frame_of(fake_agent, protocol.TERM_DETACH)

    again = await browser(_term_path(running, tab), alice)
    await again.connect()
    assert (await frame_of(fake_agent, protocol.TERM_OPEN))["term_id"] == term_id

    other_tab = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await other_tab.connect()
    assert (await frame_of(fake_agent, protocol.TERM_OPEN))["term_id"] != term_id
    await again.disconnect()
    await other_tab.disconnect()


async def test_oversized_and_malformed_input_is_answered_with_an_error_and_not_forwarded(
    running, alice, fake_agent, settings
):
    settings.BAI_TERMINAL_MAX_INPUT = 1024
    comm = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await comm.connect()
    await frame_of(fake_agent, protocol.TERM_OPEN)
    await comm.receive_json_from(timeout=5)  # ready

    await comm.send_json_to({"type": "input", "data": "x" * 1025})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and "limit is 1024 bytes" in error["message"]
    # Multi-byte characters count as the bytes they take.
    await comm.send_json_to({"type": "input", "data": "é" * 600})
    assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    for bad in (
        {"type": "input", "data": 42},
        {"type": "input"},
        {"type": "resize", "cols": "80", "rows": 24},
        {"type": "resize", "cols": True, "rows": 24},
        {"type": "resize", "cols": 0, "rows": 24},
        {"type": "shell", "command": "rm -rf /"},
    ):
        await comm.send_json_to(bad)
        assert (await comm.receive_json_from(timeout=5))["type"] == "error", bad
    await no_frame_of(fake_agent, protocol.TERM_INPUT)
    await no_frame_of(fake_agent, protocol.TERM_RESIZE, timeout=0.1)

    await comm.send_json_to({"type": "input", "data": "x" * 1024})
    assert len((await frame_of(fake_agent, protocol.TERM_INPUT))["data"]) == 1024
    await comm.disconnect()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"type": "input", "data": "ls\\ud800"}', id="input with a lone surrogate"),
        pytest.param(
            '{"type": "input", "data": ' + "[" * 100_000 + "]" * 100_000 + "}", id="100,000 deep"
        ),
        pytest.param("{not json", id="not JSON"),
    ],
)
async def test_a_malformed_terminal_frame_closes_with_4400_and_reaches_no_agent(
    running, alice, fake_agent, text
):
    comm = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await comm.connect()
    await frame_of(fake_agent, protocol.TERM_OPEN)
    await comm.receive_json_from(timeout=5)  # ready

    loop = asyncio.get_running_loop()
    started = loop.time()
    await comm.send_to(text_data=text)
    assert await closed_for_bad_input(comm)
    assert loop.time() - started < 2
    await no_frame_of(fake_agent, protocol.TERM_INPUT)


async def test_a_kernels_log_stream_closes_with_4400_on_a_malformed_frame(
    running, alice, fake_agent
):
    comm = await browser(f"/ws/sessions/{running.pk}/kernels/main1/logs/", alice)
    await comm.connect()
    assert (await comm.receive_json_from(timeout=5))["type"] == "state"
    await comm.send_to(text_data='{"type": "ping", "x": "\\ud800"}')
    assert "lone surrogate" in await closed_for_bad_input(comm)


async def test_closing_the_shell_ends_it_and_the_agents_close_reaches_the_browser(
    running, alice, fake_agent
):
    comm = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await comm.connect()
    term_id = (await frame_of(fake_agent, protocol.TERM_OPEN))["term_id"]
    await comm.receive_json_from(timeout=5)  # ready
    await comm.send_json_to({"type": "close"})
    assert (await frame_of(fake_agent, protocol.TERM_CLOSE))["term_id"] == term_id
    await fake_agent.send_json_to(
        {"type": protocol.TERM_CLOSED, "term_id": term_id, "reason": "exited with code 0"}
    )
    assert await comm.receive_json_from(timeout=5) == {
        "type": "closed",
        "reason": "exited with code 0",
    }
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 1000}
    # Closed by the agent: nothing to detach.
    await no_frame_of(fake_agent, protocol.TERM_DETACH)


async def test_the_terminal_says_so_when_the_session_ends_under_it(running, alice, fake_agent):
    comm = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await comm.connect()
    await frame_of(fake_agent, protocol.TERM_OPEN)
    await comm.receive_json_from(timeout=5)  # ready
    await sync_to_async(services.session_terminate)(
        session=running, reason="terminated by its owner"
    )
    error = await frame_of(comm, "error")
    assert error["code"] == consumers.CLOSE_GONE
    assert "terminated by its owner" in error["message"]
    assert (await comm.receive_output(timeout=5))["code"] == consumers.CLOSE_GONE


async def test_an_admin_may_attach_and_an_api_client_may_use_a_token(
    running, admin, alice, fake_agent
):
    comm = await browser(_term_path(running, str(uuid.uuid4())), admin)
    assert (await comm.connect())[0]
    await frame_of(fake_agent, protocol.TERM_OPEN)
    assert (await comm.receive_json_from(timeout=5))["type"] == "ready"
    await comm.disconnect()

    from sessions_app.tokens import token_create

    token = await sync_to_async(lambda: token_create(user=alice)[1])()
    comm = await browser(_term_path(running, str(uuid.uuid4())), token=token, origin=None)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "ready"
    await comm.disconnect()


async def test_keystrokes_count_as_activity_and_an_open_terminal_alone_does_not(
    running, alice, fake_agent
):
    long_ago = timezone.now() - timezone.timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    comm = await browser(_term_path(running, str(uuid.uuid4())), alice)
    await comm.connect()
    await comm.receive_json_from(timeout=5)  # ready
    assert not await active_since(running, long_ago, timeout=1.5)
    await comm.send_json_to({"type": "input", "data": "ls\r"})
    await frame_of(fake_agent, protocol.TERM_INPUT)
    assert await active_since(running, long_ago)
    await comm.disconnect()


async def test_an_open_log_stream_is_not_activity(running, alice, fake_agent):
    long_ago = timezone.now() - timezone.timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    comm = await browser(f"/ws/sessions/{running.pk}/kernels/main1/logs/", alice)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "state"
    assert not await active_since(running, long_ago, timeout=1.5)
    await comm.disconnect()


async def test_an_admin_looking_in_does_not_count_as_the_owners_activity(
    running, admin, fake_agent
):
    long_ago = timezone.now() - timezone.timedelta(hours=3)
    await sync_to_async(Session.objects.filter(pk=running.pk).update)(last_activity_at=long_ago)
    comm = await browser(_term_path(running, str(uuid.uuid4())), admin)
    await comm.connect()
    await comm.receive_json_from(timeout=5)
    await comm.send_json_to({"type": "input", "data": "ls\r"})
    await frame_of(fake_agent, protocol.TERM_INPUT)
    session = await sync_to_async(Session.objects.get)(pk=running.pk)
    assert session.last_activity_at == long_ago
    await comm.disconnect()


# --- terminal: the per-user limit ----------------------------------------------------


@pytest.fixture
def clock(monkeypatch):
    """The time the terminal places are counted with; tests move it on."""
    now = [time.time()]
    monkeypatch.setattr(terminals, "_now", lambda: now[0])
    return now


async def _open(session, user, fake_agent, tab: str | None = None) -> WebsocketCommunicator:
    comm = await browser(_term_path(session, tab or str(uuid.uuid4())), user)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "ready"
    await frame_of(fake_agent, protocol.TERM_OPEN)
    return comm


async def test_a_terminal_past_the_users_limit_is_refused_with_4429_saying_the_limit_and_how_many_are_open(
    running, alice, image, fake_agent, settings
):
    settings.BAI_MAX_TERMINALS_PER_USER = 2
    other = await sync_to_async(running_session)(alice, image, size=1)
    first = await _open(running, alice, fake_agent)
    second = await _open(other, alice, fake_agent)  # another session counts too

    message = await refused(
        await browser(_term_path(running, str(uuid.uuid4())), alice), consumers.CLOSE_TOO_MANY
    )

    assert "at most 2 per user, and you have 2 open" in message
    await no_frame_of(fake_agent, protocol.TERM_OPEN, timeout=0.3)
    await first.disconnect()
    await second.disconnect()


async def test_reattaching_to_the_same_shell_takes_no_second_place(
    running, alice, fake_agent, settings, clock
):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    tab = str(uuid.uuid4())
    first = await _open(running, alice, fake_agent, tab)
    await first.disconnect()
    await frame_of(fake_agent, protocol.TERM_DETACH)

    again = await _open(running, alice, fake_agent, tab)
    await again.disconnect()


async def test_a_closed_tabs_shell_holds_its_place_until_the_agent_lets_it_go(
    running, alice, fake_agent, settings, clock
):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    tab = await _open(running, alice, fake_agent)
    await tab.disconnect()  # the tab is closed; the agent keeps the shell for its grace period
    await frame_of(fake_agent, protocol.TERM_DETACH)

    message = await refused(
        await browser(_term_path(running, str(uuid.uuid4())), alice), consumers.CLOSE_TOO_MANY
    )
    assert "a closed tab's shell is kept for 2 min" in message

    clock[0] += terminals.DETACHED_KEPT + 1
    later = await _open(running, alice, fake_agent)
    await later.disconnect()


async def test_a_shell_that_ended_frees_its_place_at_once(running, alice, fake_agent, settings):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    comm = await _open(running, alice, fake_agent)
    await comm.send_json_to({"type": "close"})
    term_id = (await frame_of(fake_agent, protocol.TERM_CLOSE))["term_id"]
    await fake_agent.send_json_to(
        {"type": protocol.TERM_CLOSED, "term_id": term_id, "reason": "exited with code 0"}
    )
    assert (await frame_of(comm, "closed"))["reason"] == "exited with code 0"
    assert (await comm.receive_output(timeout=5))["code"] == 1000

    again = await _open(running, alice, fake_agent)
    await again.disconnect()


async def test_the_places_of_a_process_that_died_lapse_after_the_lease(
    running, alice, fake_agent, settings, clock
):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    # Another daphne process took a place and died without a word.
    taken, held = await terminals.claim(user_id=alice.pk, term_id="gone-with-its-process")
    assert (taken, held) == (True, 1)
    await refused(
        await browser(_term_path(running, str(uuid.uuid4())), alice), consumers.CLOSE_TOO_MANY
    )

    clock[0] += terminals.LEASE + 1
    comm = await _open(running, alice, fake_agent)
    await comm.disconnect()


async def test_an_open_terminal_keeps_its_place_past_the_lease(
    running, alice, fake_agent, settings, clock, monkeypatch
):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    monkeypatch.setattr(terminals, "RENEW_EVERY", 0.05)
    comm = await _open(running, alice, fake_agent)
    clock[0] += terminals.LEASE - 1
    await asyncio.sleep(0.3)  # renewed meanwhile, at the moved clock
    clock[0] += 2  # past the first lease, within the renewed one

    await refused(
        await browser(_term_path(running, str(uuid.uuid4())), alice), consumers.CLOSE_TOO_MANY
    )
    await comm.disconnect()


async def test_each_user_has_places_of_their_own(running, alice, admin, fake_agent, settings):
    settings.BAI_MAX_TERMINALS_PER_USER = 1
    mine = await _open(running, alice, fake_agent)
    looking_in = await _open(running, admin, fake_agent)  # the admin's own place
    await mine.disconnect()
    await looking_in.disconnect()


# --- logs --------------------------------------------------------------------------


def _logs_path(session, kernel: str) -> str:
    return f"/ws/sessions/{session.pk}/kernels/{kernel}/logs/"


async def test_logs_refuse_anonymous_visitors_other_users_and_unknown_kernels(running, alice, bob):
    await refused(await browser(_logs_path(running, "sub1")), consumers.CLOSE_UNAUTHENTICATED)
    await refused(await browser(_logs_path(running, "sub1"), bob), consumers.CLOSE_NOT_FOUND)
    message = await refused(
        await browser(_logs_path(running, "sub9"), alice), consumers.CLOSE_NOT_FOUND
    )
    assert "No such kernel" in message
    await refused(
        await browser(f"/ws/sessions/{uuid.uuid4()}/kernels/main1/logs/", alice),
        consumers.CLOSE_NOT_FOUND,
    )


async def test_a_kernels_log_is_followed_live_and_stopped_on_disconnect(running, alice, fake_agent):
    sub1 = await sync_to_async(Kernel.objects.get)(session=running, cluster_hostname="sub1")
    comm = await browser(_logs_path(running, "sub1"), alice)
    assert (await comm.connect())[0]
    state = await comm.receive_json_from(timeout=5)
    assert state["type"] == "state" and state["live"] is True and state["kernel"] == "sub1"
    follow = await frame_of(fake_agent, protocol.LOGS_FOLLOW)
    assert follow["kernel_id"] == str(sub1.pk)
    assert follow["tail"] == 65536
    stream_id = follow["stream_id"]

    for n in range(3):
        await fake_agent.send_json_to(
            {
                "type": protocol.LOG_CHUNK,
                "kernel_id": str(sub1.pk),
                "stream_id": stream_id,
                "data": f"line {n}\n",
            }
        )
    for n in range(3):
        assert await comm.receive_json_from(timeout=5) == {"type": "chunk", "data": f"line {n}\n"}

    await comm.disconnect()
    stop = await frame_of(fake_agent, protocol.LOGS_STOP)
    assert stop["stream_id"] == stream_id


async def test_the_same_kernel_may_be_addressed_by_its_id(running, alice, fake_agent):
    comm = await browser(_logs_path(running, str(running.pk)), alice)
    await comm.connect()
    assert (await comm.receive_json_from(timeout=5))["kernel"] == "main1"
    assert (await frame_of(fake_agent, protocol.LOGS_FOLLOW))["kernel_id"] == str(running.pk)
    await comm.disconnect()


async def test_an_ended_kernel_sends_its_kept_tail_and_says_it_ended(running, alice):
    sub1 = await sync_to_async(Kernel.objects.get)(session=running, cluster_hostname="sub1")
    await sync_to_async(reconcile.kernel_apply_report)(
        kernel=sub1, report={"status": protocol.KR_EXITED, "exit_code": 0}
    )
    await sync_to_async(reconcile.kernel_store_log_tail)(
        agent_id=sub1.agent_id, kernel_id=str(sub1.pk), data="bye\n"
    )
    comm = await browser(_logs_path(running, "sub1"), alice)
    assert (await comm.connect())[0]
    state = await comm.receive_json_from(timeout=5)
    assert state["live"] is False and "ended" in state["message"]
    assert await comm.receive_json_from(timeout=5) == {"type": "chunk", "data": "bye\n"}
    ended = await comm.receive_json_from(timeout=5)
    assert ended["type"] == "ended" and ended["status"] == Status.TERMINATED
    assert (await comm.receive_output(timeout=5))["type"] == "websocket.close"


async def test_a_followed_log_says_when_its_kernel_ends(running, alice, fake_agent):
    comm = await browser(_logs_path(running, "main1"), alice)
    await comm.connect()
    await comm.receive_json_from(timeout=5)  # state
    await frame_of(fake_agent, protocol.LOGS_FOLLOW)
    await sync_to_async(services.session_terminate)(session=running, reason="by its owner")
    await fake_agent.send_json_to(
        {
            "type": protocol.KERNEL_STATUS,
            "kernel_id": str(running.pk),
            "session_id": str(running.pk),
            "status": protocol.KR_GONE,
        }
    )
    ended = await frame_of(comm, "ended")
    assert ended["status"] == Status.TERMINATED
    await comm.disconnect()
