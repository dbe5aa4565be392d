"""Ending a session goes through the reconcile path: the user-facing service
marks the kernels TERMINATING and asks the agent's gateway to reconcile; the
gateway's reconcile sends the destroy, with the reason the user gave."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agent import protocol
from backendai_web.asgi import application
from sessions_app import services
from sessions_app.models import Session, Status

pytestmark = pytest.mark.django_db(transaction=True)


async def _registered_agent(token: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Token {token}".encode())]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to(
        {
            "type": protocol.REGISTER,
            "protocol": protocol.PROTOCOL_VERSION,
            "hostname": "node-a",
            "backend": "docker",
            "slots": {"cpu": "8", "mem": str(16 * 2**30)},
            "kernels": [],
        }
    )
    registered = await comm.receive_json_from(timeout=5)
    assert registered["type"] == protocol.REGISTERED
    assert registered["log_tail_bytes"] > 0  # the manager's one setting travels to the agent
    return comm


async def test_terminating_a_running_session_makes_its_agent_destroy_the_kernels(
    alice, image, agent
):
    comm = await _registered_agent(agent.plain_token)
    session = await sync_to_async(services.session_create)(
        owner=alice, spec={"image": image.reference, "cluster_size": 2}
    )
    create = await comm.receive_json_from(timeout=5)
    assert create["type"] == protocol.CREATE_KERNELS
    reports = [
        {"kernel_id": k["kernel_id"], "session_id": str(session.pk), "status": "running"}
        for k in create["kernels"]
    ]
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": reports})
    await comm.receive_nothing(timeout=0.5)

    await sync_to_async(services.session_terminate)(session=session, reason="done for today")

    destroy = await comm.receive_json_from(timeout=5)
    assert destroy["type"] == protocol.DESTROY_KERNELS
    assert sorted(destroy["kernel_ids"]) == sorted(r["kernel_id"] for r in reports)
    assert destroy["reason"] == "done for today"
    ended = await sync_to_async(Session.objects.get)(pk=session.pk)
    assert ended.status == Status.TERMINATING

    gone = [{**r, "status": protocol.KR_GONE} for r in reports]
    for report in gone:
        await comm.send_json_to({"type": protocol.KERNEL_STATUS, **report})
    await comm.send_json_to({"type": protocol.HEARTBEAT, "kernels": []})
    await comm.receive_nothing(timeout=0.5)
    ended = await sync_to_async(Session.objects.get)(pk=session.pk)
    assert ended.status == Status.TERMINATED
    await comm.disconnect()
