"""The agent gateway over the real ASGI router: a fake agent speaks the protocol.

The agent is an untrusted peer: the abuse tests below send what a broken or
hostile agent might, and check that each is answered with an error, changes
nothing, and leaves the connection up.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from agent import protocol
from backendai_web.asgi import application
from scheduler_app import consumers, reconcile
from sessions_app import services
from sessions_app.models import Agent, AgentStatus, Kernel, ResourceGroup, Session, Status

# A channel prefix of our own: other test runs on this Redis stay out.
from .helpers import frame_of as _frame_of
from .helpers import register_message as _register_message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("channel_prefix")]


def _connect(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Token {token}".encode())] if token else []
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def _register(comm: WebsocketCommunicator, kernels=None, *, connect: bool = True) -> dict:
    if connect:
        connected, _ = await comm.connect()
        assert connected
    await comm.send_json_to(_register_message(kernels))
    reply = await comm.receive_json_from(timeout=5)
    assert reply["type"] == protocol.REGISTERED
    return reply


async def _error(comm: WebsocketCommunicator) -> str:
    return (await _frame_of(comm, protocol.ERROR))["message"]


def _report(kernel_id, status=protocol.KR_RUNNING, **fields) -> dict:
    return {"kernel_id": str(kernel_id), "session_id": "", "status": status, **fields}


async def _agent_row(agent_id: str) -> Agent:
    return await sync_to_async(Agent.objects.get)(pk=agent_id)


async def _kernel_row(kernel_id) -> Kernel:
    return await sync_to_async(Kernel.objects.get)(pk=kernel_id)


async def _forget_heartbeat(agent_id: str):
    """Set the agent's last heartbeat an hour back; returns that time."""
    old = timezone.now() - timedelta(hours=1)
    await sync_to_async(Agent.objects.filter(pk=agent_id).update)(last_heartbeat_at=old)
    return old


async def _heard_since(agent_id: str, old, timeout: float = 5) -> float:
    """Seconds until the agent's last heartbeat moves past ``old``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if (await _agent_row(agent_id)).last_heartbeat_at > old:
            return time.monotonic() - start
        await asyncio.sleep(0.01)
    raise AssertionError(f"no heartbeat recorded within {timeout} s")


async def _stays_up(comm: WebsocketCommunicator, agent_id: str) -> None:
    """The connection still serves the agent: a valid heartbeat is recorded."""
    old = await _forget_heartbeat(agent_id)
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": []})
    await _heard_since(agent_id, old)


async def test_a_wrong_token_is_refused_with_a_reason(agent):
    comm = _connect("not-a-token")
    await comm.connect()
    message = await comm.receive_json_from(timeout=5)
    assert message["type"] == protocol.ERROR
    assert "unknown agent token" in message["message"]
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": protocol.CLOSE_BAD_TOKEN}


async def test_a_placed_session_is_created_on_the_agent_and_runs(alice, image, agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    refreshed = await sync_to_async(Agent.objects.get)(pk=agent.pk)
    assert refreshed.status == AgentStatus.ALIVE
    assert refreshed.backend == "docker"

    session = await sync_to_async(services.session_create)(
        owner=alice,
        spec={"image": image.reference, "cluster_size": 2, "cluster_mode": "multi-node"},
    )
    # Creating the session triggered a pass (Celery, eager in tests), which
    # placed it and nudged the agent's gateway, which sends the create command. the agent's gateway, which sends the create command.
    command = await comm.receive_json_from(timeout=5)
    assert command["type"] == protocol.CREATE_KERNELS
    assert command["session_id"] == str(session.pk)
    hosts = sorted(k["hostname"] for k in command["kernels"])
    assert hosts == ["main1", "sub1"]
    main = next(k for k in command["kernels"] if k["hostname"] == "main1")
    assert main["kernel_id"] == str(session.pk)
    assert main["env"]["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1"
    assert main["env"]["BACKENDAI_CLUSTER_ROLE"] == "main"

    reports = [
        {
            "kernel_id": k["kernel_id"],
            "session_id": str(session.pk),
            "status": protocol.KR_RUNNING,
            "container_id": "c-" + k["hostname"],
        }
        for k in command["kernels"]
    ]
    for report in reports:
        await comm.send_json_to({"type": protocol.KERNEL_STATUS, **report})
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": reports})
    await comm.receive_nothing(timeout=0.5)
    session = await sync_to_async(Session.objects.get)(pk=session.pk)
    assert session.status == Status.RUNNING

    # A heartbeat that no longer lists sub1: it vanished, and the session ends with that reason.
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": reports[:1]})
    destroy = await comm.receive_json_from(timeout=5)
    assert destroy["type"] == protocol.DESTROY_KERNELS
    assert destroy["kernel_ids"] == [str(session.pk)]
    session = await sync_to_async(Session.objects.get)(pk=session.pk)
    assert session.status == Status.TERMINATING
    assert "vanished" in session.status_reason
    await comm.disconnect()


async def test_a_restarted_agent_reporting_an_ended_kernel_is_told_to_destroy_it(
    alice, image, agent
):
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    await sync_to_async(Kernel.objects.filter(pk=session.pk).update)(status=Status.TERMINATED)

    comm = _connect(agent.plain_token)
    await _register(
        comm,
        kernels=[
            {"kernel_id": str(session.pk), "session_id": str(session.pk), "status": "running"}
        ],
    )
    command = await comm.receive_json_from(timeout=5)
    assert command["type"] == protocol.DESTROY_KERNELS
    assert command["kernel_ids"] == [str(session.pk)]
    await comm.disconnect()


# --- an agent is an untrusted peer ------------------------------------------


@pytest.mark.parametrize(
    "slots, field",
    [
        ({"cpu": "1e100", "mem": "1024"}, "cpu"),
        ({"cpu": "8", "mem": "1024", "cuda.device": "-1"}, "cuda.device"),
        ({"cpu": "NaN", "mem": "1024"}, "cpu"),
    ],
    ids=["cpu 1e100", "cuda.device -1", "cpu NaN"],
)
async def test_capacity_out_of_bounds_is_refused_and_the_group_still_schedules(
    alice, image, agent, slots, field
):
    comm = _connect(agent.plain_token)
    assert (await comm.connect())[0]
    await comm.send_json_to(_register_message(slots=slots))
    refusal = await _error(comm)
    assert "register refused" in refusal and f"slots: {field}" in refusal
    row = await _agent_row(agent.pk)
    assert row.capacity_slots == agent.capacity_slots
    assert row.hostname == ""  # nothing of the refused register was recorded

    # The same connection registers properly, and a pass places a session on it.
    await _register(comm, connect=False)
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    command = await _frame_of(comm, protocol.CREATE_KERNELS)
    assert command["session_id"] == str(session.pk)
    await comm.disconnect()


async def test_a_heartbeat_with_nan_capacity_is_refused_and_not_recorded(agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    old = await _forget_heartbeat(agent.pk)
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": [], "slots": {"cpu": "NaN"}})
    assert "heartbeat refused: heartbeat.slots: cpu" in await _error(comm)
    assert (await _agent_row(agent.pk)).last_heartbeat_at == old
    await _stays_up(comm, agent.pk)
    await comm.disconnect()


@pytest.mark.parametrize(
    "field, value",
    [("exit_code", 2**40), ("container_id", "c" * 10_000)],
    ids=["exit code 2**40", "10 KB container id"],
)
async def test_a_report_out_of_bounds_is_refused_while_the_connection_stays_up(
    alice, image, agent, field, value
):
    comm = _connect(agent.plain_token)
    await _register(comm)
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    await _frame_of(comm, protocol.CREATE_KERNELS)

    report = _report(session.pk, protocol.KR_EXITED, **{field: value})
    await comm.send_json_to({"type": protocol.KERNEL_STATUS, **report})
    refusal = await _error(comm)
    assert f"kernel_status.{field}" in refusal
    assert len(refusal) < 300  # the value is described, never echoed
    kernel = await _kernel_row(session.pk)
    assert kernel.status == Status.SCHEDULED
    assert kernel.exit_code is None and kernel.container_id == ""

    # The socket is up: a valid heartbeat is answered (the kernel is not there yet).
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": []})
    again = await _frame_of(comm, protocol.CREATE_KERNELS)
    assert again["session_id"] == str(session.pk)
    await comm.disconnect()


BAD_FRAMES = {
    "oversize": lambda: json.dumps({"type": "heartbeat", "kernels": [], "x": "x" * 4_200_000}),
    "not JSON": lambda: "{type: heartbeat",
    "empty": lambda: "",
    "an array": lambda: "[1, 2, 3]",
    "a string": lambda: '"heartbeat"',
    "a lone surrogate": lambda: (
        '{"type": "kernel_status", "kernel_id": "k", "status": "error", "reason": "\\ud800"}'
    ),
    "deep nesting": lambda: '{"type": "heartbeat", "kernels": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "NaN": lambda: '{"type": "heartbeat", "kernels": [], "slots": {"cpu": NaN}}',
    "an unhashable type": lambda: '{"type": ["heartbeat"]}',
    "an unknown field": lambda: '{"type": "heartbeat", "kernels": [], "agent_id": "agent-2"}',
}


@pytest.mark.parametrize("make_frame", BAD_FRAMES.values(), ids=list(BAD_FRAMES))
async def test_a_bad_frame_is_answered_with_an_error_and_the_connection_stays_up(
    agent, make_frame, caplog
):
    comm = _connect(agent.plain_token)
    await _register(comm)
    await comm.send_input({"type": "websocket.receive", "text": make_frame()})
    assert "refused" in await _error(comm)
    await _stays_up(comm, agent.pk)
    await comm.disconnect()
    assert "refused" in caplog.text  # logged ...
    assert agent.plain_token not in caplog.text  # ... and the token never is


async def test_a_binary_frame_is_answered_with_an_error_and_the_connection_stays_up(agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert "binary frames" in await _error(comm)
    await _stays_up(comm, agent.pk)
    await comm.disconnect()


async def test_a_message_before_register_is_refused_without_closing(agent):
    comm = _connect(agent.plain_token)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": []})
    assert "first message must be register" in await _error(comm)
    assert (await _agent_row(agent.pk)).last_heartbeat_at is None
    await _register(comm, connect=False)
    await comm.disconnect()


async def test_a_register_claiming_another_group_leaves_the_agent_in_its_group(agent, group):
    gpu = await sync_to_async(ResourceGroup.objects.create)(name="gpu")
    comm = _connect(agent.plain_token)
    assert (await comm.connect())[0]
    await comm.send_json_to(_register_message(resource_group=gpu.name))
    assert (await _frame_of(comm, protocol.REGISTERED))["agent_id"] == agent.pk
    row = await _agent_row(agent.pk)
    assert row.resource_group_id == group.pk
    assert row.status == AgentStatus.ALIVE
    await comm.disconnect()


@pytest.fixture
def kernel_on_other_agent(alice, image, agent, make_agent):
    """A session whose kernel sits on agent-2 (starting, with a kept log tail)."""
    other = make_agent("agent-2")
    session = services.session_create(owner=alice, spec={"image": image.reference})
    Kernel.objects.filter(pk=session.pk).update(agent=other, log_tail="agent-2's own log")
    return Kernel.objects.get(pk=session.pk)


async def test_a_log_tail_for_another_agents_kernel_does_not_change_it(
    agent, kernel_on_other_agent, alice, image
):
    comm = _connect(agent.plain_token)
    await _register(comm)
    forged = {"type": protocol.LOG_TAIL, "kernel_id": str(kernel_on_other_agent.pk)}
    await comm.send_json_to({**forged, "data": "forged output"})
    assert "is not on this agent" in await _error(comm)
    assert (await _kernel_row(kernel_on_other_agent.pk)).log_tail == "agent-2's own log"

    # Its own kernel's tail is kept.
    own = await sync_to_async(services.session_create)(owner=alice, spec={"image": image.reference})
    await sync_to_async(Kernel.objects.filter(pk=own.pk).update)(agent=agent)
    await comm.send_json_to({"type": protocol.LOG_TAIL, "kernel_id": str(own.pk), "data": "mine"})
    await _stays_up(comm, agent.pk)  # the tail was queued before this heartbeat's reconcile
    for _ in range(100):
        if (await _kernel_row(own.pk)).log_tail == "mine":
            break
        await asyncio.sleep(0.02)
    assert (await _kernel_row(own.pk)).log_tail == "mine"
    await comm.disconnect()


async def test_a_report_about_another_agents_kernel_changes_nothing(agent, kernel_on_other_agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    report = _report(kernel_on_other_agent.pk, protocol.KR_EXITED, exit_code=0)
    await comm.send_json_to({"type": protocol.KERNEL_STATUS, **report})
    assert "is not on this agent" in await _error(comm)
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": [report]})
    await _stays_up(comm, agent.pk)
    kernel = await _kernel_row(kernel_on_other_agent.pk)
    assert kernel.status == Status.SCHEDULED
    assert kernel.exit_code is None
    await comm.disconnect()


async def _listener(group: str) -> str:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def _nothing_for(channel: str, timeout: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(get_channel_layer().receive(channel), timeout)
    except TimeoutError:
        return True
    return False


async def test_log_chunks_reach_only_streams_opened_on_that_agent(agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    stream = uuid.uuid4().hex
    browser = await _listener(protocol.log_stream_group(stream))
    chunk = {"type": protocol.LOG_CHUNK, "kernel_id": "k1", "stream_id": stream, "data": "x"}

    await comm.send_json_to(chunk)
    assert "was not opened on this agent" in await _error(comm)
    assert await _nothing_for(browser)

    # A browser asks this agent to follow kernel k1's log on that stream.
    follow = {"type": protocol.LOGS_FOLLOW, "kernel_id": "k1", "stream_id": stream, "tail": 0}
    await get_channel_layer().group_send(
        protocol.agent_group(agent.pk), protocol.gw_agent_command(follow)
    )
    assert (await _frame_of(comm, protocol.LOGS_FOLLOW))["stream_id"] == stream
    await comm.send_json_to(chunk)
    event = await asyncio.wait_for(get_channel_layer().receive(browser), 5)
    assert event == {"type": protocol.GW_LOGS_CHUNK, "kernel_id": "k1", "data": "x"}

    # The stream is bound to that kernel: another kernel's output cannot ride on it.
    await comm.send_json_to({**chunk, "kernel_id": "k2"})
    assert "another kernel" in await _error(comm)
    assert await _nothing_for(browser)
    await comm.disconnect()


async def test_terminal_output_reaches_only_terminals_opened_on_that_agent(agent):
    comm = _connect(agent.plain_token)
    await _register(comm)
    term = f"{uuid.uuid4().hex}-{uuid.uuid4().hex}"
    group_listener = await _listener(protocol.terminal_group(term))
    output = {"type": protocol.TERM_OUTPUT, "term_id": term, "data": "$ rm -rf /"}

    await comm.send_json_to(output)
    assert "is not open on this agent" in await _error(comm)
    assert await _nothing_for(group_listener)

    # A browser terminal opens it on this agent, and hears its output.
    browser = await get_channel_layer().new_channel()
    open_term = {"type": protocol.TERM_OPEN, "term_id": term, "kernel_id": "k1"}
    await get_channel_layer().group_send(
        protocol.agent_group(agent.pk),
        protocol.gw_agent_command({**open_term, "cols": 80, "rows": 24}, reply=browser, ack=1),
    )
    assert (await _frame_of(comm, protocol.TERM_OPEN))["term_id"] == term
    route = await asyncio.wait_for(get_channel_layer().receive(browser), 5)
    assert route["type"] == protocol.GW_TERM_ROUTE
    await comm.send_json_to({**output, "data": "$ "})
    event = await asyncio.wait_for(get_channel_layer().receive(browser), 5)
    assert event == {"type": protocol.GW_TERM_OUTPUT, "data": "$ "}
    await comm.disconnect()


# --- liveness under load -----------------------------------------------------


@pytest.fixture
def slow_reports(monkeypatch):
    """Each kernel report takes 15 ms more to apply; the list counts those applied."""
    applied: list[str] = []
    real = reconcile.agent_kernel_report

    def slow(**kwargs):
        time.sleep(0.015)
        applied.append(kwargs["report"]["kernel_id"])
        return real(**kwargs)

    monkeypatch.setattr(reconcile, "agent_kernel_report", slow)
    return applied


async def test_a_heartbeat_is_recorded_at_once_behind_a_flood_of_reports(
    alice, image, agent, slow_reports
):
    comm = _connect(agent.plain_token)
    await _register(comm)
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    await _frame_of(comm, protocol.CREATE_KERNELS)
    old = await _forget_heartbeat(agent.pk)

    flood = 300  # at least 4.5 s of work
    for i in range(flood):
        status = protocol.KR_PREPARING if i % 2 else protocol.KR_PULLING
        await comm.send_json_to({"type": protocol.KERNEL_STATUS, **_report(session.pk, status)})
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": []})

    assert await _heard_since(agent.pk, old) < 1.0
    assert len(slow_reports) < flood  # the reports were still being applied
    await comm.disconnect()
    await asyncio.sleep(0.1)  # the report in flight finishes on its thread


async def test_the_report_backlog_of_a_connection_is_bounded(
    alice, image, agent, slow_reports, monkeypatch
):
    monkeypatch.setattr(consumers, "BACKLOG_ITEMS", 5)
    comm = _connect(agent.plain_token)
    await _register(comm)
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference}
    )
    await _frame_of(comm, protocol.CREATE_KERNELS)
    for _ in range(20):
        report = _report(session.pk, protocol.KR_PREPARING)
        await comm.send_json_to({"type": protocol.KERNEL_STATUS, **report})
    assert "reports are waiting; this one was dropped" in await _error(comm)
    await _stays_up(comm, agent.pk)
    await comm.disconnect()
    assert len(slow_reports) <= 6
    await asyncio.sleep(0.1)


# --- the agent's group, kept local -------------------------------------------


async def test_a_command_from_the_gateways_own_process_skips_redis_until_it_disconnects(
    agent, monkeypatch
):
    """The gateway claims its agent's group: a command sent from its process goes to
    its queue, not out to Redis and back; once the agent is gone, sends go to Redis."""
    from channels_redis.pubsub import RedisSingleShardConnection

    published: list[str] = []
    real = RedisSingleShardConnection.publish

    async def publish(self, channel, message):
        published.append(channel)
        return await real(self, channel, message)

    monkeypatch.setattr(RedisSingleShardConnection, "publish", publish)
    group = protocol.agent_group(agent.pk)
    follow = {"type": protocol.LOGS_FOLLOW, "kernel_id": "k1", "stream_id": "s1", "tail": 0}
    comm = _connect(agent.plain_token)
    await _register(comm)
    published.clear()

    await get_channel_layer().group_send(group, protocol.gw_agent_command(follow))
    assert (await _frame_of(comm, protocol.LOGS_FOLLOW))["stream_id"] == "s1"
    assert not [c for c in published if group in c]

    # A newer connection of the agent takes over: the command reaches it, not the old one.
    newer = _connect(agent.plain_token)
    await _register(newer)
    await get_channel_layer().group_send(group, protocol.gw_agent_command(follow))
    assert (await _frame_of(newer, protocol.LOGS_FOLLOW))["stream_id"] == "s1"
    assert not [c for c in published if group in c]

    await newer.disconnect()
    await comm.disconnect()
    await get_channel_layer().group_send(group, protocol.gw_agent_command(follow))
    assert [c for c in published if group in c]


async def _settled(comm: WebsocketCommunicator) -> tuple[int | None, list[dict]]:
    """The frames a connection got until it went quiet after its answer to register, and
    its close code (None: open)."""
    frames: list[dict] = []
    while not await comm.receive_nothing(timeout=0.5 if frames else 10):
        out = await comm.receive_output()
        if out["type"] == "websocket.close":
            return out["code"], frames
        frames.append(json.loads(out["text"]))
    return None, frames


async def test_two_connections_registering_at_once_keep_only_one(agent):
    group = protocol.agent_group(agent.pk)
    follow = {"type": protocol.LOGS_FOLLOW, "kernel_id": "k1", "stream_id": "s1", "tail": 0}
    for attempt in range(20):
        pair = [_connect(agent.plain_token), _connect(agent.plain_token)]
        for comm in pair:
            assert (await comm.connect())[0]
        await asyncio.gather(*(c.send_json_to(_register_message()) for c in pair))
        outcomes = [await _settled(comm) for comm in pair]
        codes = [code for code, _ in outcomes]
        assert sorted(codes, key=str) == [protocol.CLOSE_REPLACED, None], (attempt, outcomes)
        survivor = pair[codes.index(None)]
        _, closed_frames = outcomes[codes.index(protocol.CLOSE_REPLACED)]
        assert any(
            f["type"] == protocol.ERROR and "newer connection" in f["message"]
            for f in closed_frames
        ), closed_frames
        # The survivor is the agent's one connection: it is heard, and commands reach it.
        await _stays_up(survivor, agent.pk)
        await get_channel_layer().group_send(group, protocol.gw_agent_command(follow))
        assert (await _frame_of(survivor, protocol.LOGS_FOLLOW))["stream_id"] == "s1"
        assert (await _agent_row(agent.pk)).status == AgentStatus.ALIVE
        await survivor.disconnect()
