"""The daemon against a fake manager on loopback."""

from __future__ import annotations

import asyncio
import logging
import uuid
from decimal import Decimal

import pytest
import pytest_asyncio
from agent_helpers import spec

from agent import protocol
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig
from agent.daemon import EXIT_BAD_TOKEN, EXIT_OK, Agent


def make_agent(manager, tmp_path, token: str = "good-token") -> Agent:
    config = AgentConfig(
        manager=manager.url,
        token=token,
        resource_group="rg-test",
        cpu=Decimal("3"),
        mem=4 * 1024**3,
        gpus=0,
        work_dir=tmp_path / "work",
        labels={"zone": "a"},
    )
    return Agent(config, ProcessBackend(config), backoff_start=0.05, backoff_max=0.2)


@pytest_asyncio.fixture
async def running(manager, base_dir):
    agent = make_agent(manager, base_dir)
    task = asyncio.create_task(agent.run())
    yield agent
    kernels = [k.kernel_id for k in await agent.backend.list_kernels()]
    await agent.backend.destroy_kernels(kernels, "test over")
    agent.stop()
    assert await asyncio.wait_for(task, 10) == EXIT_OK


@pytest.mark.asyncio
async def test_it_registers_with_its_token_capacity_and_labels(running, manager):
    reg = await manager.frames.wait_for(type=protocol.REGISTER)
    assert manager.auth_headers[0] == "Token good-token"
    assert reg["protocol"] == protocol.PROTOCOL_VERSION
    assert reg["backend"] == "process"
    assert reg["resource_group"] == "rg-test"
    assert reg["slots"] == {"cpu": "3", "mem": str(4 * 1024**3)}
    assert reg["labels"] == {"zone": "a"}
    assert reg["kernels"] == []
    await asyncio.wait_for(running.registered.wait(), 5)
    assert running.agent_id == "agent-under-test"


@pytest.mark.asyncio
async def test_heartbeats_list_the_kernels_it_runs(running, manager):
    s = spec()
    kid = s["session_id"]
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(s)
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
    async with asyncio.timeout(5):
        while True:
            hb = await manager.frames.wait_for(type=protocol.HEARTBEAT)
            manager.frames.seen.remove(hb)
            if [k["kernel_id"] for k in hb["kernels"]] == [kid]:
                break
    assert hb["kernels"][0]["status"] == "running"
    assert hb["slots"]["cpu"] == "3"


@pytest.mark.asyncio
async def test_a_repeated_create_does_not_duplicate_the_kernel(running, manager):
    s = spec()
    kid = s["session_id"]
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(s)
    await manager.send(s)
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
    await manager.send(s)
    await asyncio.sleep(0.3)
    reports = await running.backend.list_kernels()
    assert [r.kernel_id for r in reports] == [kid]
    pids = {
        f["container_id"]
        for f in manager.frames.seen
        if f["type"] == protocol.KERNEL_STATUS and f["status"] == "running"
    }
    assert len(pids) == 1


@pytest.mark.asyncio
async def test_destroying_an_unknown_kernel_reports_it_gone(running, manager):
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(
        {"type": protocol.DESTROY_KERNELS, "kernel_ids": ["ghost"], "reason": "cleanup"}
    )
    gone = await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id="ghost")
    assert gone["status"] == "gone"


@pytest.mark.asyncio
async def test_a_batch_kernel_reports_exit_and_log_tail_through_the_socket(running, manager):
    s = spec(command="echo done; exit 7")
    kid = s["session_id"]
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(s)
    ended = await manager.frames.wait_for(
        type=protocol.KERNEL_STATUS, kernel_id=kid, status="exited"
    )
    assert ended["exit_code"] == 7
    tail = await manager.frames.wait_for(type=protocol.LOG_TAIL, kernel_id=kid)
    assert tail["data"] == "done\n"


@pytest.mark.asyncio
async def test_terminal_and_log_frames_travel_over_the_socket(running, manager):
    s = spec(command="echo hello-log; sleep 300")
    kid = s["session_id"]
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(s)
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
    await manager.send(
        {"type": protocol.TERM_OPEN, "term_id": "T", "kernel_id": kid, "cols": 80, "rows": 24}
    )
    await manager.send({"type": protocol.TERM_INPUT, "term_id": "T", "data": "echo a$((1+1))b\n"})
    await manager.frames.wait_text("T", "a2b")
    await manager.send({"type": protocol.TERM_CLOSE, "term_id": "T"})
    await manager.frames.wait_for(type=protocol.TERM_CLOSED, term_id="T")
    await asyncio.sleep(0.1)
    await manager.send(
        {"type": protocol.LOGS_FOLLOW, "kernel_id": kid, "stream_id": "L", "tail": 4096}
    )
    chunk = await manager.frames.wait_for(type=protocol.LOG_CHUNK, stream_id="L")
    assert chunk["data"] == "hello-log\n"
    await manager.send({"type": protocol.LOGS_STOP, "stream_id": "L"})


@pytest.mark.asyncio
async def test_it_reconnects_and_reregisters_its_kernels_after_the_manager_drops(running, manager):
    s = spec()
    kid = s["session_id"]
    await manager.frames.wait_for(type=protocol.REGISTER, _conn=1)
    await manager.send(s)
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
    await manager.drop()
    again = await manager.frames.wait_for(type=protocol.REGISTER, _conn=2)
    assert [k["kernel_id"] for k in again["kernels"]] == [kid]
    await manager.frames.wait_for(type=protocol.HEARTBEAT, _conn=2)


@pytest.mark.asyncio
async def test_it_keeps_retrying_while_the_manager_is_down(manager, tmp_path):
    agent = make_agent(manager, tmp_path)
    url = manager.url
    await manager.stop()
    task = asyncio.create_task(agent.run())
    await asyncio.sleep(0.5)  # several failed attempts
    assert not task.done()
    port = int(url.rsplit(":", 1)[1])
    from websockets.asyncio.server import serve

    manager.server = await serve(manager._handler, "127.0.0.1", port)
    await manager.frames.wait_for(type=protocol.REGISTER)
    agent.stop()
    assert await asyncio.wait_for(task, 5) == EXIT_OK


@pytest.mark.asyncio
async def test_it_exits_without_retry_on_a_bad_token_and_never_logs_the_token(
    manager, tmp_path, caplog
):
    secret = f"wrong-{uuid.uuid4().hex}"
    agent = make_agent(manager, tmp_path, token=secret)
    with caplog.at_level(logging.DEBUG):
        code = await asyncio.wait_for(agent.run(), 5)
    assert code == EXIT_BAD_TOKEN
    assert len(manager.auth_headers) == 1
    agent_logs = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("agent"))
    assert "unknown token" in agent_logs
    assert "Authorization: [redacted]" in agent_logs  # the handshake was logged, masked
    assert secret not in agent_logs


@pytest.mark.asyncio
async def test_following_the_log_of_an_unknown_kernel_answers_an_error_for_that_stream(
    running, manager
):
    await manager.frames.wait_for(type=protocol.REGISTER)
    await manager.send(
        {"type": protocol.LOGS_FOLLOW, "kernel_id": "ghost", "stream_id": "S9", "tail": 100}
    )
    err = await manager.frames.wait_for(type=protocol.ERROR, stream_id="S9")
    assert "ghost" in err["message"]


@pytest.mark.parametrize(
    "sent, expected",
    [
        ({"exec_output_limit": 1 << 20, "log_tail_bytes": 4096}, (1 << 20, 4096)),
        ({"exec_output_limit": 10, "log_tail_bytes": 10}, (64 * 1024, 1024)),
        ({"exec_output_limit": 1 << 40, "log_tail_bytes": 1 << 40}, (256 << 20, 16 << 20)),
        ({"exec_output_limit": True, "log_tail_bytes": "big"}, (8 << 20, 64 * 1024)),
        ({}, (8 << 20, 64 * 1024)),
    ],
)
def test_the_managers_settings_are_taken_within_the_protocols_bounds(tmp_path, sent, expected):
    agent = make_agent(type("M", (), {"url": "ws://127.0.0.1:1"})(), tmp_path)
    agent._apply_registered({"type": protocol.REGISTERED, "heartbeat_interval": 1, **sent})
    assert (agent.config.exec_output_limit, agent.config.log_tail_bytes) == expected
