"""Code execution through the daemon, against a fake manager, on the process backend.

Real parts: the agent daemon, its websocket, the code runner and an ipykernel from the
venv (jupyter_client 8). One kernel and its runner serve the whole module. The kernels
run as the agent's own uid here: a root agent gives each kernel a uid of its own, and
this venv's python (built from one in root's home) is out of such a uid's reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from asyncio.subprocess import PIPE
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio
from agent_helpers import (
    FLOOD_50MB,
    CodeExecutionOnEveryBackend,
    FakeManager,
    Runs,
    assert_no_code_runner,
    spec,
    text,
)

from agent import protocol
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig
from agent.daemon import EXIT_OK, Agent

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMIT = 1024 * 1024  # the manager's exec_output_limit for this module
KERNEL_MEM = str(1024**3)  # an ipykernel and a 50 MB burst need room under RLIMIT_AS


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon():
    manager = FakeManager()
    manager.settings = {"exec_output_limit": LIMIT}
    await manager.start()
    base = Path(tempfile.mkdtemp(prefix="bai-exec-test-"))
    base.chmod(0o711)
    config = AgentConfig(
        manager=manager.url,
        token="good-token",
        cpu=Decimal(2),
        mem=4 * 1024**3,
        gpus=0,
        work_dir=base / "work",
    )
    backend = ProcessBackend(config)
    backend.isolated = False  # see the module's docstring
    agent = Agent(config, backend, backoff_start=0.05, backoff_max=0.2)
    task = asyncio.create_task(agent.run())
    await asyncio.wait_for(agent.registered.wait(), 10)
    yield agent, manager
    kernels = await backend.list_kernels()
    await backend.destroy_kernels([k.kernel_id for k in kernels], "test over")
    agent.stop()
    assert await asyncio.wait_for(task, 20) == EXIT_OK
    await manager.stop()
    shutil.rmtree(base, ignore_errors=True)


async def start_kernel(agent: Agent, manager: FakeManager) -> str:
    s = spec()
    s["kernels"][0]["slots"]["mem"] = KERNEL_MEM
    kernel_id = s["session_id"]
    await manager.send(s)
    await manager.frames.wait_for(
        type=protocol.KERNEL_STATUS, kernel_id=kernel_id, status="running"
    )
    return kernel_id


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runs(daemon):
    agent, manager = daemon
    kernel_id = await start_kernel(agent, manager)
    yield Runs(manager.frames, manager.send, kernel_id)
    await manager.send(
        {"type": protocol.DESTROY_KERNELS, "kernel_ids": [kernel_id], "reason": "test over"}
    )
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kernel_id, status="gone")


class TestCodeExecution(CodeExecutionOnEveryBackend):
    limit = LIMIT
    stream = False


async def test_50_mb_of_streamed_output_arrives_whole(runs, daemon):
    # Its speed (>= 10 MB/s) is bench/exec.py's to measure, never a timed test's.
    agent, _ = daemon
    agent.config.exec_output_limit = 64 * 1024**2
    try:
        answer = await runs.ask("query", FLOOD_50MB, stream=True, timeout=120)
    finally:
        agent.config.exec_output_limit = LIMIT
    assert (answer["status"], answer["exit_code"]) == ("finished", 0)
    assert len(text(answer["records"])) == 50_000_000


async def test_a_run_past_its_timeout_is_stopped_and_says_so(runs):
    answer, records = await runs.run("while True: pass", options={"timeout": 1})
    assert (answer["status"], answer["exit_code"]) == ("exec-timeout", None)
    after, _ = await runs.run("print('still here')")
    assert after["exit_code"] == 0


async def test_requests_that_cannot_be_served_are_refused_in_users_words(runs):
    answer = await runs.ask("query", "import time; time.sleep(30)", run_id="long", flush=0.05)
    assert answer["status"] == "continued"
    refused = await runs.ask("query", "1")
    assert refused["reason"] == (
        "another run (long) is still going in this session; continue or interrupt it first"
    )
    assert (await runs.ask("continue", run_id="r9"))["reason"] == "no run r9 in this session"
    not_waiting = await runs.ask("input", "x", run_id="long")
    assert not_waiting["reason"] == "run long is not waiting for input"
    answer, _ = await runs.run("", mode="interrupt", run_id="long")
    assert answer["exit_code"] == 1
    ghost = Runs(runs.frames, runs.send, "no-such-kernel")
    assert (await ghost.ask("query", "1"))["reason"] == (
        "kernel no-such-kernel is not running on this agent"
    )


async def test_the_runner_runs_in_the_kernel_with_its_home_env_and_limits(runs):
    code = (
        "import os, resource\n"
        "print(os.getcwd(), os.environ['BACKENDAI_SESSION_ID'], os.getuid())\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0])\n"
    )
    _, records = await runs.run(code)
    cwd, session_id, uid, address_space = text(records).split()
    assert cwd.endswith(f"/{runs.kernel_id}/main1")
    assert (session_id, int(uid), address_space) == (runs.kernel_id, os.geteuid(), KERNEL_MEM)


async def test_without_ipykernel_every_request_answers_no_code_runner(daemon):
    agent, manager = daemon
    agent.config.runner_python = "/usr/bin/no-such-python3"
    try:
        kernel_id = await start_kernel(agent, manager)
        runs = Runs(manager.frames, manager.send, kernel_id)
        answers = [await runs.ask("query", "1"), await runs.ask("complete", "import o")]
    finally:
        agent.config.runner_python = None
    for answer in answers:
        assert_no_code_runner(answer)


async def test_destroying_a_kernel_ends_its_runner_and_ipykernel(daemon):
    agent, manager = daemon
    kernel_id = await start_kernel(agent, manager)
    runs = Runs(manager.frames, manager.send, kernel_id)
    _, records = await runs.run("import os\nprint(os.getcwd())")
    home = text(records).strip()
    # The kernel's pids are its own namespace's: find its processes on the host by home.
    assert len(_processes_in(home)) >= 3  # the sandbox, the runner, its ipykernel
    await manager.send({"type": protocol.DESTROY_KERNELS, "kernel_ids": [kernel_id], "reason": "x"})
    await manager.frames.wait_for(type=protocol.KERNEL_STATUS, kernel_id=kernel_id, status="gone")
    for _ in range(100):
        if not _processes_in(home):
            break
        await asyncio.sleep(0.05)
    assert not _processes_in(home)


def _processes_in(home: str) -> list[int]:
    """The host's pids of the processes whose working directory is ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == home:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_the_first_run_of_a_fresh_runner_may_ask_for_input():
    """A fresh kernel's stdin socket dropped an input() that came before its connection
    was complete (the run then waited for ever, about one start in twenty); the runner
    reaches stdin before it says it is ready."""
    source = (Path(__file__).resolve().parents[2] / "agent" / "coderunner.py").read_text()
    run = {"op": "run", "mode": "query", "run_id": "r1", "code": "input('N: ')", "limit": LIMIT}
    for _ in range(8):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-u", "-c", source, stdin=PIPE, stdout=PIPE, limit=2**20
        )
        try:
            async with asyncio.timeout(30):
                while b'"ready"' not in await proc.stdout.readline():
                    pass
            proc.stdin.write(json.dumps(run).encode() + b"\n")
            async with asyncio.timeout(10):
                while b'"waiting"' not in await proc.stdout.readline():
                    pass
        finally:
            proc.stdin.close()
            await proc.wait()
