"""The process backend: kernels as process groups on this machine."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import pytest_asyncio
from agent_helpers import Frames, spec

from agent import protocol
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig


async def _group_vanishes(pgid: int, timeout: float = 3.0) -> bool:
    # Orphaned members are reaped by init shortly after they die; until then they are zombies.
    for _ in range(int(timeout / 0.05)):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(
        token="t", work_dir=tmp_path / "work", data_root=tmp_path / "data", term_grace=1.0
    )


@pytest_asyncio.fixture
async def backend(config, frames):
    b = ProcessBackend(config, frames)
    await b.start()
    yield b
    ids = [k.kernel_id for k in await b.list_kernels()]
    await b.destroy_kernels(ids, "test over")
    await b.close()


@pytest.mark.asyncio
async def test_a_batch_kernel_runs_with_its_env_and_reports_its_exit_code(backend, frames, config):
    s = spec(command='echo "host=$BACKENDAI_CLUSTER_HOST home=$HOME pwd=$(pwd)"; exit 3')
    await backend.create_kernels(s)
    kid = s["session_id"]
    await frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="preparing")
    await frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="running")
    done = await frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kid, status="exited")
    assert done["exit_code"] == 3
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=kid)
    kdir = config.work_dir / kid / "main1"
    assert tail["data"] == f"host=main1 home={kdir} pwd={kdir}\n"
    assert await backend.log_tail(kid) == tail["data"]
    [report] = await backend.list_kernels()
    assert (report.status, report.exit_code) == ("exited", 3)


@pytest.mark.asyncio
async def test_exit_zero_is_reported_as_zero(backend, frames):
    s = spec(command="true")
    await backend.create_kernels(s)
    done = await frames.wait_for(kernel_id=s["session_id"], status="exited")
    assert done["exit_code"] == 0


@pytest.mark.asyncio
async def test_data_folders_are_linked_by_name_and_shared(backend, frames, config):
    folder = config.data_root / "u1" / "shared"
    mounts = [{"name": "shared", "host_path": str(folder)}]
    s = spec("main1", "sub1", command="sleep 0.3; cat shared/from-sub1", mounts=mounts)
    s["kernels"][1]["startup_command"] = None
    await backend.create_kernels(s)
    (folder / "from-sub1").write_text("hello from sub1\n")
    await frames.wait_for(kernel_id=s["session_id"], status="exited", exit_code=0)
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    assert tail["data"] == "hello from sub1\n"
    assert (config.work_dir / s["session_id"] / "sub1" / "shared").resolve() == folder.resolve()


@pytest.mark.asyncio
async def test_a_mount_outside_the_data_root_is_refused(backend, frames, tmp_path):
    s = spec(mounts=[{"name": "etc", "host_path": "/etc"}])
    await backend.create_kernels(s)
    err = await frames.wait_for(kernel_id=s["session_id"], status="error")
    assert "outside the data root" in err["reason"]


@pytest.mark.asyncio
async def test_destroy_kills_the_whole_process_group(backend, frames):
    s = spec(command="sleep 300 & sleep 300 & wait")
    kid = s["session_id"]
    await backend.create_kernels(s)
    running = await frames.wait_for(kernel_id=kid, status="running")
    pgid = int(running["container_id"])
    await asyncio.sleep(0.2)  # let the shell start its children
    os.killpg(pgid, 0)  # the group exists
    await backend.destroy_kernels([kid], "user request")
    gone = await frames.wait_for(kernel_id=kid, status="gone")
    assert gone["reason"] == "user request"
    assert await _group_vanishes(pgid), "a process of the kernel's group survived"
    assert await backend.list_kernels() == []


@pytest.mark.asyncio
async def test_a_repeated_create_does_not_start_a_second_process(backend, frames):
    s = spec()
    await backend.create_kernels(s)
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="running")
    assert len(await backend.list_kernels()) == 1
    pids = {f["container_id"] for f in frames.seen if f.get("status") == "running"}
    assert len(pids) == 1


@pytest.mark.asyncio
async def test_destroying_an_unknown_kernel_reports_it_gone(backend, frames):
    await backend.destroy_kernels(["no-such-kernel"], "cleanup")
    await frames.wait_for(kernel_id="no-such-kernel", status="gone")


@pytest.mark.asyncio
async def test_a_create_after_destroy_does_not_revive_the_kernel(backend, frames):
    s = spec()
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="running")
    await backend.destroy_kernels([s["session_id"]], "done")
    await backend.create_kernels(s)
    assert await backend.list_kernels() == []


@pytest.mark.asyncio
async def test_the_terminal_echoes_and_follows_resizes(backend, frames):
    s = spec()
    kid = s["session_id"]
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=kid, status="running")
    await backend.term_open("t1", kid, 80, 24)
    backend.term_input("t1", "echo $BACKENDAI_CLUSTER_HOST-$((40+2))\n")
    await frames.wait_text("t1", "main1-42")
    await backend.term_resize("t1", 100, 40)
    backend.term_input("t1", "stty size\n")
    await frames.wait_text("t1", "40 100")
    await backend.term_close("t1")
    await frames.wait_for(type=protocol.TERM_CLOSED, term_id="t1")


@pytest.mark.asyncio
async def test_a_detached_terminal_can_be_reattached_within_the_grace_period(backend, frames):
    s = spec()
    kid = s["session_id"]
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=kid, status="running")
    await backend.term_open("t2", kid, 80, 24)
    backend.term_input("t2", "X=kept-state\n")
    backend.term_detach("t2")
    await backend.term_open("t2", kid, 80, 24)
    backend.term_input("t2", "echo value:$X\n")
    await frames.wait_text("t2", "value:kept-state")
    backend.term_detach("t2")
    closed = await frames.wait_for(type=protocol.TERM_CLOSED, term_id="t2", timeout=5)
    assert closed["reason"] == "detached too long"


@pytest.mark.asyncio
async def test_follow_logs_sends_the_tail_then_new_output_until_the_end(backend, frames):
    s = spec(command="echo first; sleep 0.5; echo second")
    kid = s["session_id"]
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=kid, status="running")
    await asyncio.sleep(0.2)
    chunks = [c async for c in backend.follow_logs(kid, 1024)]
    assert "".join(chunks) == "first\nsecond\n"


@pytest.mark.asyncio
async def test_a_restarted_agent_adopts_surviving_kernels(config, frames):
    first = ProcessBackend(config, frames)
    await first.start()
    s = spec(command="echo started; sleep 300")
    kid = s["session_id"]
    await first.create_kernels(s)
    running = await frames.wait_for(kernel_id=kid, status="running")
    await first.close()  # the agent goes away; the kernel keeps running

    later = Frames()
    second = ProcessBackend(config, later)
    await second.start()
    [report] = await second.list_kernels()
    assert (report.kernel_id, report.status) == (kid, "running")
    assert report.container_id == running["container_id"]
    os.killpg(int(report.container_id), signal.SIGKILL)
    ended = await later.wait_for(kernel_id=kid, status="exited")
    assert ended["exit_code"] is None  # no parent saw it end; the reason says so
    assert "unknown" in ended["reason"]
    await second.destroy_kernels([kid], "cleanup")
    await later.wait_for(kernel_id=kid, status="gone")
