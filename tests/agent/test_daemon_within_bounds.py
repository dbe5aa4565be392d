"""Everything the daemon sends passes the manager's checks (agent/protocol.py validate)."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from agent_helpers import spec

from agent import protocol
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig
from agent.daemon import EXIT_OK, Agent


@pytest.mark.asyncio
async def test_every_frame_the_daemon_sends_is_within_the_protocols_bounds(manager, base_dir):
    config = AgentConfig(
        manager=manager.url,
        token="good-token",
        resource_group="rg-test",
        cpu=Decimal("1.5"),
        mem=4 * 1024**3,
        gpus=0,
        work_dir=base_dir / "work",
        labels={"zone": "a"},
    )
    agent = Agent(config, ProcessBackend(config), backoff_start=0.05, backoff_max=0.2)
    task = asyncio.create_task(agent.run())
    try:
        s = spec(command="echo hello-log; sleep 300")
        kid = s["session_id"]
        await manager.frames.wait_for(type=protocol.REGISTER)
        await manager.send(s)
        await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
        await manager.send(
            {"type": protocol.TERM_OPEN, "term_id": "T-1", "kernel_id": kid, "cols": 80, "rows": 24}
        )
        await manager.send(
            {"type": protocol.TERM_INPUT, "term_id": "T-1", "data": "echo a$((1+1))b\n"}
        )
        await manager.frames.wait_text("T-1", "a2b")
        await manager.send({"type": protocol.TERM_CLOSE, "term_id": "T-1"})
        await manager.frames.wait_for(type=protocol.TERM_CLOSED, term_id="T-1")
        await manager.send(
            {"type": protocol.LOGS_FOLLOW, "kernel_id": kid, "stream_id": "L1", "tail": 4096}
        )
        await manager.frames.wait_for(type=protocol.LOG_CHUNK, stream_id="L1")
        await manager.send(
            {"type": protocol.LOGS_FOLLOW, "kernel_id": "ghost", "stream_id": "L2", "tail": 0}
        )
        await manager.frames.wait_for(type=protocol.ERROR, stream_id="L2")
        await manager.send(
            {"type": protocol.DESTROY_KERNELS, "kernel_ids": [kid, "ghost"], "reason": "done"}
        )
        await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id="ghost")
        await manager.frames.wait_for(type=protocol.LOG_TAIL, kernel_id=kid)
        await manager.frames.wait_for(type=protocol.HEARTBEAT)
    finally:
        agent.stop()
        assert await asyncio.wait_for(task, 10) == EXIT_OK

    kinds = set()
    for frame in manager.frames.seen:
        sent = {k: v for k, v in frame.items() if k != "_conn"}  # the fake manager's own mark
        assert protocol.validate(sent) is None, (sent["type"], protocol.validate(sent))
        kinds.add(sent["type"])
    assert kinds >= {
        protocol.REGISTER,
        protocol.HEARTBEAT,
        protocol.KERNEL_STATUS,
        protocol.LOG_CHUNK,
        protocol.LOG_TAIL,
        protocol.TERM_OUTPUT,
        protocol.TERM_CLOSED,
        protocol.ERROR,
    }
