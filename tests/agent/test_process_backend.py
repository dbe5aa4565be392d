"""The process backend: kernels as process groups on this machine."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import stat
from pathlib import Path

import pytest
import pytest_asyncio
from agent_helpers import Frames, spec

from agent import protocol
from agent.backends.base import NOFILE_LIMIT
from agent.backends.process import ProcessBackend
from agent.config import AgentConfig
from tests.conftest import skip_or_fail


async def _group_vanishes(pgid: int, timeout: float = 3.0) -> bool:
    # Orphaned members are reaped by init shortly after they die; until then they are zombies.
    for _ in range(int(timeout / 0.05)):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


AS_ROOT = os.geteuid() == 0


@pytest.fixture
def config(base_dir: Path) -> AgentConfig:
    return AgentConfig(
        token="t", work_dir=base_dir / "work", data_root=base_dir / "data", term_grace=1.0
    )


def needs_root() -> None:
    if not AS_ROOT:
        skip_or_fail("only an agent running as root can run kernels as other uids")


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
async def test_a_read_only_mount_is_refused_with_a_clear_reason(backend, frames, config):
    folder = config.data_root / "u1" / "data"
    folder.mkdir(parents=True)
    mounts = [{"name": "data", "host_path": str(folder), "readonly": True}]
    s = spec(command="touch data/written", mounts=mounts)
    await backend.create_kernels(s)
    err = await frames.wait_for(kernel_id=s["session_id"], status="error")
    assert "the process backend cannot mount 'data' read-only; use a Docker agent" in err["reason"]
    assert not (folder / "written").exists()


@pytest.mark.parametrize("escape", ["/etc", "{root}/u1/../../outside", "{root}/u1/link-to-etc"])
@pytest.mark.asyncio
async def test_a_mount_outside_the_data_root_is_refused_and_never_linked(
    backend, frames, config, escape
):
    (config.data_root / "u1").mkdir(parents=True)
    (config.data_root / "u1" / "link-to-etc").symlink_to("/etc")
    s = spec(mounts=[{"name": "etc", "host_path": escape.format(root=config.data_root)}])
    await backend.create_kernels(s)
    err = await frames.wait_for(kernel_id=s["session_id"], status="error")
    assert "outside the data root" in err["reason"]
    assert not (config.work_dir / s["session_id"]).exists()  # nothing made, nothing linked
    assert [k.status for k in await backend.list_kernels()] == ["error"]


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


async def _batch_output(backend, frames, command: str, **slots: str) -> tuple[int, str]:
    s = spec(command=command)
    if slots:
        s["kernels"][0]["slots"] = slots
    await backend.create_kernels(s)
    done = await frames.wait_for(kernel_id=s["session_id"], status="exited")
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    return done["exit_code"], tail["data"]


@pytest.mark.asyncio
async def test_a_kernel_runs_as_an_unprivileged_uid_and_cannot_read_the_agents_token(
    backend, frames, base_dir, monkeypatch
):
    needs_root()
    token_file = base_dir / "local-agent.token"  # as scripts/run leaves it: 0600, the agent's
    token_file.write_text("the-agent-token")
    token_file.chmod(0o600)
    monkeypatch.setenv("BACKENDAI_AGENT_TOKEN", "the-agent-token")
    code, out = await _batch_output(
        backend,
        frames,
        f"id -u; cat {token_file} || echo no-token-file;"
        f" cat /proc/{os.getpid()}/environ || echo no-agent-environ;"
        " env | grep -c the-agent-token",
    )
    uid, *rest = out.splitlines()
    assert int(uid) >= backend.config.kernel_uid_base  # neither root nor any account
    assert "the-agent-token" not in out
    assert "no-token-file" in rest
    assert "no-agent-environ" in rest
    assert rest[-1] == "0"  # the token is in no variable of the kernel


@pytest.mark.asyncio
async def test_the_kernel_environment_holds_nothing_of_the_agents(backend, frames, monkeypatch):
    monkeypatch.setenv("BACKENDAI_AGENT_TOKEN", "the-agent-token")
    monkeypatch.setenv("AGENT_ONLY_SETTING", "x")
    code, out = await _batch_output(backend, frames, "env | cut -d= -f1 | sort")
    names = set(out.split())
    assert "BACKENDAI_AGENT_TOKEN" not in names and "AGENT_ONLY_SETTING" not in names
    assert {"BACKENDAI_SESSION_ID", "HOME", "PATH", "TMPDIR"} <= names


@pytest.mark.asyncio
async def test_each_kernel_has_a_private_home_that_other_kernels_cannot_enter(
    backend, frames, config
):
    needs_root()
    s = spec("main1", "sub1", command="sleep 0.5; ls ../sub1 && echo entered || echo refused")
    s["kernels"][1]["startup_command"] = None
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=s["session_id"], status="exited")
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    assert tail["data"].strip().endswith("refused")
    homes = [config.work_dir / s["session_id"] / host for host in ("main1", "sub1")]
    owners = {h.stat().st_uid for h in homes}
    assert len(owners) == 2 and 0 not in owners  # a uid each
    assert {stat.S_IMODE(h.stat().st_mode) for h in homes} == {0o700}


@pytest.mark.asyncio
async def test_a_kernel_runs_under_rlimits_from_its_memory_slot(backend, frames):
    code, out = await _batch_output(
        backend, frames, "ulimit -v; ulimit -n; ulimit -c", cpu="1", mem=str(256 * 1024**2)
    )
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # never raised above the agent's
    nofile = min(NOFILE_LIMIT, hard_nofile if hard_nofile >= 0 else NOFILE_LIMIT)
    assert out.split() == [str(256 * 1024), str(nofile), "0"]  # KiB, files, core blocks


@pytest.mark.asyncio
async def test_a_kernel_asking_for_almost_nothing_gets_the_agents_floor(backend, frames, caplog):
    code, out = await _batch_output(backend, frames, "ulimit -v", cpu="0.0000000001", mem="0.5")
    assert out.split() == [str(16 * 1024)]  # 16 MiB, never "unlimited"
    assert "raised to cpu=0.01 mem=16777216" in caplog.text


@pytest.mark.asyncio
async def test_destroy_kills_a_process_that_left_the_kernels_group(backend, frames, config):
    needs_root()
    marker = f"sleep 300.{os.getpid()}"  # a duration no other process of this machine sleeps
    s = spec(command=f"setsid {marker} & sleep 300")
    kid = s["session_id"]
    await backend.create_kernels(s)
    await frames.wait_for(kernel_id=kid, status="running")
    await asyncio.sleep(0.3)
    escaped = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).startswith(marker)]
    assert escaped, "the escaping process did not start"
    await backend.destroy_kernels([kid], "done")
    await frames.wait_for(kernel_id=kid, status="gone")
    for _ in range(40):
        if not any(p.exists() and _cmdline(p).startswith(marker) for p in escaped):
            break
        await asyncio.sleep(0.05)
    assert not any(p.exists() and _cmdline(p).startswith(marker) for p in escaped)


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.asyncio
async def test_a_data_folder_is_shared_by_the_kernel_group_and_closed_to_others(
    backend, frames, config
):
    folder = config.data_root / "u1" / "shared"
    folder.mkdir(parents=True)
    folder.chmod(0o777)  # as an older manager left it
    mounts = [{"name": "shared", "host_path": str(folder)}]
    code, out = await _batch_output_with_mounts(backend, frames, "echo hi > shared/note", mounts)
    assert code == 0
    assert (folder / "note").read_text() == "hi\n"
    if AS_ROOT:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2770
        assert folder.stat().st_gid == config.kernel_uid_base


async def _batch_output_with_mounts(backend, frames, command, mounts):
    s = spec(command=command, mounts=mounts)
    await backend.create_kernels(s)
    done = await frames.wait_for(kernel_id=s["session_id"], status="exited")
    tail = await frames.wait_for(type=protocol.LOG_TAIL, kernel_id=s["session_id"])
    return done["exit_code"], tail["data"]
