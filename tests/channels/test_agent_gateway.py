"""The agent gateway over the real ASGI router: a fake agent speaks the protocol."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agent import protocol
from backendai_web.asgi import application
from sessions_app import services
from sessions_app.models import Agent, AgentStatus, Kernel, Session, Status

pytestmark = pytest.mark.django_db(transaction=True)


def _connect(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Token {token}".encode())] if token else []
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def _register(comm: WebsocketCommunicator, kernels=None) -> dict:
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to(
        {
            "type": protocol.REGISTER,
            "protocol": protocol.PROTOCOL_VERSION,
            "hostname": "node-a",
            "backend": "docker",
            "slots": {"cpu": "8", "mem": str(16 * 2**30)},
            "labels": {},
            "version": "test",
            "kernels": kernels or [],
        }
    )
    reply = await comm.receive_json_from(timeout=5)
    assert reply["type"] == protocol.REGISTERED
    return reply


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
