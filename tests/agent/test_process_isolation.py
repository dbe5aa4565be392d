"""Process kernels run isolated (issue 24, item 12): a kernel of bob's reaches none of the
host's loopback services (the manager's Redis, PostgreSQL, daphne), none of alice's files,
no host process; a port of bob's session is his kernels' port alone, also when alice's
kernel listens on the same number.

Personas: ``alice`` and ``bob`` each own a session on one agent; bob tries everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import pytest
import pytest_asyncio
from agent_helpers import Frames, spec

from agent import protocol
from agent.backends import sandbox
from agent.backends.base import KernelError
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig
from tests.conftest import skip_or_fail

# Connects to each port of the host's loopback given, and prints what happened.
PROBE = """python3 - {ports} <<'EOF'
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        print(port, "connected")
    except OSError as exc:
        print(port, "refused", type(exc).__name__)
EOF"""

# Serves ``who`` on a port of the kernel's loopback.
SERVE = """exec python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"{who}"); c.close()
'"""


@pytest.fixture(autouse=True)
def _isolation_available():
    problem = sandbox.problem()
    if problem:
        skip_or_fail(problem)


@pytest.fixture
def config(base_dir) -> AgentConfig:
    return AgentConfig(token="t", work_dir=base_dir / "work", data_root=base_dir / "data")


@pytest_asyncio.fixture
async def backend(config, frames):
    b = ProcessBackend(config, frames)
    await b.start()
    yield b
    await b.destroy_kernels([k.kernel_id for k in await b.list_kernels()], "test over")
    await b.close()


@contextlib.contextmanager
def host_listener():
    """A listener on the host's loopback, like daphne's or an app on the node."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


async def _run(backend: ProcessBackend, frames: Frames, command: str, **kw) -> str:
    s = spec(command=command, **kw)
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="exited")
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    return tail["data"]


async def _running(backend: ProcessBackend, frames: Frames, command: str, **kw) -> dict:
    s = spec(command=command, **kw)
    s["session_type"] = "interactive"
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="running")
    return s


async def _read_port(backend: ProcessBackend, kernel_id: str, port: int) -> bytes:
    for _ in range(100):
        try:
            reader, writer = await backend.open_service(kernel_id, port, 65536)
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)
            continue
        data = await reader.read()
        writer.close()
        return data
    raise AssertionError(f"nothing listened on port {port} of kernel {kernel_id}")


@pytest.mark.asyncio
async def test_a_kernel_reaches_no_service_on_the_hosts_loopback(backend, frames):
    # 6379: the manager's Redis, 5432: its PostgreSQL (both run on this machine's loopback
    # for the tests), and a listener standing for daphne.
    with host_listener() as daphne:
        out = await _run(backend, frames, PROBE.format(ports=f"6379 5432 {daphne}"))
    lines = out.split("\n")
    for port in ("6379", "5432", str(daphne)):
        assert f"{port} refused ConnectionRefusedError" in lines, out
    # Nor their unix sockets (PostgreSQL's, Docker's) on the node.
    sockets = (
        "/run/postgresql/.s.PGSQL.5432 /var/run/postgresql /run/docker.sock /var/run/docker.sock"
    )
    out = await _run(backend, frames, f"ls -d {sockets} 2>/dev/null | wc -l")
    assert out.strip() == "0", out


@pytest.mark.asyncio
async def test_a_kernel_sees_neither_another_users_folder_and_home_nor_host_processes(
    backend, frames, config
):
    alice_folder = config.data_root / "alice" / "private"
    alice_folder.mkdir(parents=True)
    (alice_folder / "secret.txt").write_text("alice's secret\n")
    alice = await _running(
        backend,
        frames,
        "echo alice-home > note; exec sleep 300",
        mounts=[{"name": "private", "host_path": str(alice_folder)}],
    )
    alice_home = config.work_dir / alice["session_id"] / "main1"
    assert (alice_home / "private" / "secret.txt").exists()  # hers, by its link in her home
    probe = (
        f"cat {alice_folder}/secret.txt || echo no-folder;"
        f" cat {alice_home}/note || echo no-home;"
        f" cat {alice_home}/private/secret.txt || echo no-link;"
        f" test -e /proc/{os.getpid()} && echo sees-the-agent || echo no-agent;"
        f" ls {config.work_dir} | grep -c {alice['session_id']};"
        " ls /proc | grep -c '^[0-9]'"
    )
    out = await _run(backend, frames, probe)
    assert "alice's secret" not in out and "alice-home" not in out, out
    *said, alice_dirs, processes = out.strip().split("\n")
    assert [line for line in said if not line.startswith(("cat:", "ls:"))] == [
        "no-folder",
        "no-home",
        "no-link",
        "no-agent",
    ], out
    assert alice_dirs == "0"
    assert int(processes) < 10  # its own few: the sandbox's init, the shell, ls, grep


@pytest.mark.asyncio
async def test_a_port_of_a_session_reaches_its_own_kernel_alone(backend, frames):
    port = 18080
    alice = await _running(backend, frames, SERVE.format(port=port, who="alice"))
    assert await _read_port(backend, alice["session_id"], port) == b"alice"
    # bob's session declares the same port: nothing of his listens there yet.
    bob = await _running(backend, frames, "exec sleep 300")
    with pytest.raises(ConnectionRefusedError):
        await backend.open_service(bob["session_id"], port, 65536)
    # Nor does a port of bob's reach a listener on the host's loopback.
    with host_listener() as host_port:
        with pytest.raises(ConnectionRefusedError):
            await backend.open_service(bob["session_id"], host_port, 65536)
    # bob's own app on the same number is his, and alice's stays hers.
    await backend.start_app(bob["session_id"], SERVE.format(port=port, who="bob"), {})
    assert await _read_port(backend, bob["session_id"], port) == b"bob"
    assert await _read_port(backend, alice["session_id"], port) == b"alice"


@pytest.mark.asyncio
async def test_the_kernels_of_one_cluster_session_share_their_loopback(backend, frames):
    s = spec("main1", "sub1", command=f"sleep 0.5; {PROBE.format(ports=18081)}")
    s["kernels"][1]["startup_command"] = SERVE.format(port=18081, who="sub1")
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="exited")
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    assert tail["data"].strip() == "18081 connected"


@pytest.mark.asyncio
async def test_without_isolation_the_agent_refuses_process_kernels_in_plain_words(
    backend, frames, config
):
    backend.sandbox_problem = "this node lacks bwrap (bubblewrap): install it"
    s = spec(command="touch ran")
    await backend.create_kernels(s)
    err = await frames.wait_for(kernel_id=s["session_id"], status="error")
    assert err["reason"] == "this node lacks bwrap (bubblewrap): install it"
    assert not (config.work_dir / s["session_id"]).exists()  # nothing ran, nothing made


@pytest.mark.asyncio
async def test_an_ended_session_leaves_no_network_behind(backend, frames, config):
    s = await _running(backend, frames, "exec sleep 300")
    netns = config.work_dir / ".netns" / s["session_id"]
    assert sandbox.is_netns(netns)
    await backend.destroy_kernels([s["session_id"]], "done")
    await frames.wait_for(kernel_id=s["session_id"], status="gone")
    assert not netns.exists()
    with pytest.raises(KernelError):
        await backend.open_service(s["session_id"], 18080, 65536)


def test_the_agent_says_why_it_cannot_isolate_kernels(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs an agent running as root" in sandbox.problem()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = sandbox.shutil.which
    monkeypatch.setattr(
        sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name)
    )
    problem = sandbox.problem()
    assert "lacks bwrap (bubblewrap)" in problem and "apt-get install bubblewrap" in problem


@pytest.mark.asyncio
async def test_a_kernel_whose_sandbox_fails_leaves_nothing_once_destroyed(
    backend, frames, config, monkeypatch
):
    # A sandbox that cannot start (a bind source that is gone, say): the kernel says so.
    monkeypatch.setattr(
        sandbox, "kernel_argv", lambda **kw: ["/bin/sh", "-c", "echo no sandbox >&2; exit 1"]
    )
    s = spec(command="true")
    await backend.create_kernels(s)
    err = await frames.wait_for(kernel_id=s["session_id"], status="error")
    assert "sandbox did not start" in err["reason"]
    await backend.destroy_kernels([s["session_id"]], "done")
    await frames.wait_for(kernel_id=s["session_id"], status="gone")
    assert not (config.work_dir / s["session_id"]).exists()
    assert not (config.work_dir / ".netns" / s["session_id"]).exists()
