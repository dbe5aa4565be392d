"""Fixtures of the websocket tests: ``running`` (alice's running session of two
kernels on ``agent``) and ``fake_agent`` (that agent's gateway connection)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agent import protocol
from sessions_app.models import Kernel

from .helpers import registered_agent, running_session


@pytest.fixture
def running(alice, image, agent):
    return running_session(alice, image)


@pytest.fixture
async def fake_agent(agent, running):
    """The agent's gateway connection, registered and reporting the session's kernels."""
    kernels = await sync_to_async(list)(Kernel.objects.filter(session=running))
    comm = await registered_agent(
        agent.plain_token,
        [
            {
                "kernel_id": str(k.pk),
                "session_id": str(running.pk),
                "status": protocol.KR_RUNNING,
                "container_id": f"c-{k.cluster_hostname}",
            }
            for k in kernels
        ],
    )
    yield comm
    await comm.disconnect()
