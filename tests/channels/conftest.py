"""Fixtures of the websocket tests: ``running`` (alice's running session of two
kernels on ``agent``) and ``fake_agent`` (that agent's gateway connection)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agent import protocol
from backendai_web.asgi import application
from sessions_app.models import Kernel

from .helpers import running_session


@pytest.fixture
def running(alice, image, agent):
    return running_session(alice, image)


@pytest.fixture
async def fake_agent(agent, running):
    """The agent's gateway connection, registered and reporting the session's kernels."""
    kernels = await sync_to_async(list)(Kernel.objects.filter(session=running))
    comm = WebsocketCommunicator(
        application,
        "/ws/agent/",
        headers=[(b"authorization", f"Token {agent.plain_token}".encode())],
    )
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
            "kernels": [
                {
                    "kernel_id": str(k.pk),
                    "session_id": str(running.pk),
                    "status": protocol.KR_RUNNING,
                    "container_id": f"c-{k.cluster_hostname}",
                }
                for k in kernels
            ],
        }
    )
    assert (await comm.receive_json_from(timeout=5))["type"] == protocol.REGISTERED
    yield comm
    await comm.disconnect()
