"""Pure parts of the agent: option parsing, capacity detection, stream decoders, archives,
the code runs' output buffers."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

import pytest

from agent.backends.base import (
    MIN_CPU,
    MIN_MEM,
    LiveOutput,
    chunked_text,
    kernel_limits,
    overlap,
    render_env_file,
    render_ssh_environment,
    trim_tail,
)
from agent.backends.docker import (
    RUNNER,
    Demuxer,
    network_driver,
    swarm_manager,
    write_kernel_home,
)
from agent.backends.process import runner_python
from agent.coderunner import size_text
from agent.config import AgentConfig, capacity, config_from_args, detect_cpu, detect_mem
from agent.execution import AGENT_CUT, NOTICE_ROOM, Lines, Run


def test_a_bad_memory_size_on_the_command_line_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--manager", "ws://127.0.0.1:8000", "--token", "T", "--mem", "four gigs"])
    assert "'four gigs' is not a size" in capsys.readouterr().err


def test_the_command_line_gives_a_config_with_overrides_and_labels():
    cfg, _ = config_from_args(
        ["--manager", "ws://127.0.0.1:8000", "--token", "T", "--cpu", "2.5", "--mem", "4g"]
        + ["--gpus", "1", "--label", "zone=a", "--label", "disk=ssd", "--resource-group", "gpu"]
    )
    assert cfg.ws_url == "ws://127.0.0.1:8000/ws/agent/"
    assert (cfg.cpu, cfg.mem, cfg.gpus) == (Decimal("2.5"), 4 * 2**30, 1)
    assert cfg.labels == {"zone": "a", "disk": "ssd"}
    assert cfg.resource_group == "gpu"
    assert cfg.pull is False
    assert "T" not in repr(cfg)  # the token never shows up in a repr (or a log of one)
    assert capacity(cfg) == {"cpu": "2.5", "mem": str(4 * 2**30), "cuda.device": "1"}


def test_kernel_flags_set_the_tmp_size_and_the_process_kernels_uid_base():
    base = ["--manager", "ws://127.0.0.1:8000", "--token", "T"]
    cfg, _ = config_from_args(base)
    assert (cfg.kernel_tmp_size, cfg.kernel_uid_base) == (256 * 2**20, 2_000_000_000)
    cfg, _ = config_from_args(base + ["--kernel-tmp-size", "1g", "--kernel-uid-base", "3000000"])
    assert (cfg.kernel_tmp_size, cfg.kernel_uid_base) == (2**30, 3_000_000)
    with pytest.raises(SystemExit):
        config_from_args(base + ["--kernel-uid-base", "0"])


def test_capacity_is_read_from_proc_and_narrowed_by_cgroups(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree: 1 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert detect_mem(meminfo, cg) == 8000000 * 1024
    (cg / "memory.max").write_text("1073741824\n")
    assert detect_mem(meminfo, cg) == 2**30
    (cg / "cpu.max").write_text("100000 100000\n")
    assert detect_cpu(cg) == Decimal(1)
    (cg / "cpu.max").write_text("max 100000\n")
    assert detect_cpu(cg) >= 1


def test_the_agent_key_is_a_stable_fingerprint_not_the_token():
    a = AgentConfig(token="secret-token")
    assert a.agent_key == AgentConfig(token="secret-token").agent_key
    assert a.agent_key != AgentConfig(token="other").agent_key
    assert "secret" not in a.agent_key


def test_env_files_quote_values_for_sh_and_skip_what_ssh_cannot_carry():
    env = {"A": "it's", "B": "x y", "BAD-NAME": "1", "ML": "a\nb"}
    assert render_env_file(env) == "export A='it'\"'\"'s'\nexport B='x y'\nexport ML='a\nb'\n"
    assert render_ssh_environment(env) == "A=it's\nB=x y\n"


def test_a_tail_keeps_the_last_bytes():
    assert trim_tail(b"0123456789", 4) == "6789"
    assert trim_tail("é".encode() * 3, 5) == "\ufffdéé"


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


@pytest.mark.parametrize("split", [1, 3, 7, 64, 10_000])
def test_the_demuxer_rebuilds_the_stream_from_any_split(split):
    wire = b"".join(_frame(1 + i % 2, f"line {i}\n".encode()) for i in range(200))
    demux = Demuxer()
    out = b""
    for i in range(0, len(wire), split):
        out += demux.feed(wire[i : i + split])
    assert out == b"".join(f"line {i}\n".encode() for i in range(200))


@pytest.mark.parametrize(
    ("seen", "data", "expected"),
    [
        (b"", b"abc", 0),
        (b"abc", b"", 0),
        (b"1\n2\n3\n", b"3\n4\n", 2),  # the live output starts inside the tail
        (b"1\n2\n3\n", b"2\n3\n4\n", 4),
        (b"1\n2\n3\n", b"4\n5\n", 0),  # nothing in common
        (b"1\n2\n3\n", b"1\n2\n3\n", 6),  # all of it seen already
        (b"x" * 1000 + b"tail-end", b"tail-end and more", 8),
        (b"ab" * 500, b"ab" * 400 + b"c", 800),  # the longest overlap wins
        (b"q" + b"z" * 300, b"z" * 300 + b"new", 300),  # longer than the probe
    ],
)
def test_the_overlap_of_a_tail_and_live_output_is_their_longest_common_seam(seen, data, expected):
    assert overlap(seen, data) == expected


def _source(blocks):
    """A live source that gives ``blocks`` then ends."""
    queue = list(blocks)

    async def read():
        await asyncio.sleep(0)
        return queue.pop(0) if queue else None

    return read


async def _collect(live, first=b""):
    return "".join([text async for text in chunked_text(live, first)])


def test_live_output_is_given_once_after_the_tail_that_already_holds_its_start():
    async def run():
        gate = asyncio.Event()
        source = _source([b"2\n3\n", b"4\n"])

        async def read():
            await gate.wait()
            return await source()

        live = LiveOutput(read)
        gate.set()
        await asyncio.sleep(0.01)  # the live blocks arrive while the tail is read
        tail = b"1\n2\n3\n"
        live.drop_head(tail)
        return await _collect(live, tail)

    assert asyncio.run(run()) == "1\n2\n3\n4\n"


def test_a_follower_that_lags_is_told_what_it_missed_and_the_source_is_never_held():
    async def run():
        blocks = [f"{i}\n".encode() * 100 for i in range(50)]  # 200 or 300 bytes each
        live = LiveOutput(_source(blocks), limit=1000)
        await asyncio.sleep(0.1)  # the follower takes nothing while all 50 arrive
        return await _collect(live)

    text = asyncio.run(run())
    assert text.startswith("0\n" * 100 + "1\n" * 100)  # what fitted, in order
    assert "[backend.ai: 13000 bytes of output skipped here: this view fell behind]" in text
    assert "49\n" not in text  # the source was drained to its end, not held


def _run_runner(home, command):
    """Run the kernel runner with /bin/sh in a scratch HOME (no sshd: its path is
    swapped for one that does not exist, so nothing listens on the host)."""
    script = RUNNER.replace("/usr/sbin/sshd", str(home / "no-sshd"))
    return subprocess.run(
        ["/bin/sh", "-c", script, "bai-runner", command],
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )


def test_the_kernel_home_holds_the_session_keys_with_strict_modes(tmp_path):
    ssh = {"private_key": "PRIV\n", "public_key": "ssh-ed25519 K"}
    home = tmp_path / "home"
    write_kernel_home(home, {"BACKENDAI_CLUSTER_HOST": "sub1"}, ssh)
    modes = {
        name: oct((home / name).stat().st_mode & 0o777)
        for name in ("", ".ssh", ".ssh/id_session", ".ssh/authorized_keys", ".ssh/config")
    }
    assert modes == {
        "": "0o700",
        ".ssh": "0o700",
        ".ssh/id_session": "0o600",
        ".ssh/authorized_keys": "0o600",
        ".ssh/config": "0o600",
    }
    assert (home / ".ssh/id_session").read_text() == "PRIV\n"
    assert (home / ".ssh/authorized_keys").read_text() == "ssh-ed25519 K\n"
    config = (home / ".ssh/config").read_text()
    assert "Host main* sub*" in config and "Port 2200" in config
    assert (home / ".ssh/environment").read_text() == "BACKENDAI_CLUSTER_HOST=sub1\n"
    assert "BACKENDAI_CLUSTER_HOST" in (home / ".backendai_env").read_text()
    assert "PermitUserEnvironment yes" in (home / ".backendai/sshd_config").read_text()
    if os.geteuid() == 0:  # handed to the kernel user: ssh refuses keys it does not own
        assert {(p.stat().st_uid, p.stat().st_gid) for p in home.rglob("*")} == {(1000, 1000)}


def test_without_ssh_keys_no_ssh_files_are_written(tmp_path):
    write_kernel_home(tmp_path / "home", {}, None)
    assert not (tmp_path / "home" / ".ssh").exists()
    assert not (tmp_path / "home" / ".backendai" / "sshd_config").exists()


def test_an_sftp_kernels_home_has_the_keys_but_no_sshd_for_the_runner_to_start(tmp_path):
    # Its own server runs sshd on the same port with SFTP only; the runner's would take it.
    ssh = {"private_key": "PRIV\n", "public_key": "ssh-ed25519 K"}
    home = tmp_path / "home"
    write_kernel_home(home, {}, ssh, authorized_keys=["ssh-ed25519 L laptop"], sshd=False)
    assert (home / ".ssh/authorized_keys").read_text() == "ssh-ed25519 K\nssh-ed25519 L laptop\n"
    assert not (home / ".backendai" / "sshd_config").exists()


def test_the_runner_exits_with_the_startup_commands_code(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _run_runner(tmp_path, "exit 3")
    assert failed.value.returncode == 3


def test_the_runner_carries_no_secret():
    assert "PRIVATE" not in RUNNER and "BAI_RUNNER_" not in RUNNER


@pytest.mark.parametrize(
    ("slots", "cpu", "mem", "raised"),
    [
        ({"cpu": "2", "mem": "1073741824"}, Decimal(2), 2**30, ()),
        ({"cpu": "0.0000000001", "mem": 0.5}, MIN_CPU, MIN_MEM, ("cpu", "mem")),
        ({}, MIN_CPU, MIN_MEM, ("cpu", "mem")),
        ({"cpu": "0", "mem": "-5"}, MIN_CPU, MIN_MEM, ("cpu", "mem")),
        ({"cpu": "NaN", "mem": "Infinity"}, MIN_CPU, MIN_MEM, ("cpu", "mem")),
        ({"cpu": "1", "mem": str(6 * 2**20)}, Decimal(1), MIN_MEM, ("mem",)),
        ({"cpu": "0.01", "mem": str(MIN_MEM)}, MIN_CPU, MIN_MEM, ()),
    ],
)
def test_a_kernel_always_gets_limits_never_below_the_agents_floor(slots, cpu, mem, raised):
    limits = kernel_limits(slots)
    assert (limits.cpu, limits.mem, limits.raised) == (cpu, mem, raised)


@pytest.mark.parametrize(
    ("swarm", "mode", "driver"),
    [
        ({}, "multi-node", "bridge"),  # a plain engine: agents on it share a bridge
        ({"LocalNodeState": "inactive"}, "multi-node", "bridge"),
        ({"LocalNodeState": "active", "ControlAvailable": True}, "multi-node", "overlay"),
        ({"LocalNodeState": "active", "ControlAvailable": True}, "single-node", "bridge"),
        # A worker attaches to the overlay that an agent on a manager made.
        ({"LocalNodeState": "active", "ControlAvailable": False}, "multi-node", "overlay"),
    ],
)
def test_a_multi_node_session_gets_an_overlay_only_where_the_engines_form_a_swarm(
    swarm, mode, driver
):
    assert network_driver(swarm, mode) == driver


@pytest.mark.parametrize(
    ("swarm", "manager"),
    [
        ({}, False),
        ({"LocalNodeState": "inactive", "ControlAvailable": True}, False),
        ({"LocalNodeState": "active", "ControlAvailable": False}, False),
        ({"LocalNodeState": "active", "ControlAvailable": True}, True),
    ],
)
def test_only_a_swarm_manager_creates_and_removes_overlays(swarm, manager):
    assert swarm_manager(swarm) is manager


def _record(data, kind="stdout"):
    return {"kind": kind, "data": data, "mime": None}


def test_a_frame_carries_at_most_a_megabyte_of_data_cut_between_characters():
    run = Run("r1", limit=64 * 1024**2)
    for _ in range(4):
        run.add(_record("é" * 30_000))  # joined up to 64 KiB, then new records
    for _ in range(20):
        run.add(_record("ü" * 300_000, kind="stderr"))
    frames = []
    while run.pending:
        frames.append(run.take())
    sizes = [sum(len(r["data"].encode()) for r in frame) for frame in frames]
    assert max(sizes) <= 1024 * 1024 and sizes[0] == 1024 * 1024
    assert text_of(frames, "stdout") == "é" * 120_000
    assert text_of(frames, "stderr") == "ü" * 6_000_000


def text_of(frames, kind):
    return "".join(r["data"] for frame in frames for r in frame if r["kind"] == kind)


def test_the_agent_keeps_no_more_than_the_limit_of_a_run_and_says_so_once():
    run = Run("r1", limit=1000)
    for _ in range(40):
        run.add({"kind": "display", "data": "x" * 500, "mime": "text/plain"})
    kept = [record for record, _ in run.pending]
    assert sum(len(r["data"]) for r in kept if r["kind"] == "display") <= 1000 + NOTICE_ROOM
    assert [r["data"] for r in kept if r["kind"] == "notice"] == [AGENT_CUT]


def test_output_of_one_stream_is_joined_and_streams_stay_apart():
    run = Run("r1", limit=1000)
    for record in (_record("a"), _record("b"), _record("c", "stderr"), _record("d")):
        run.add(record)
    assert [r["data"] for r in run.take()] == ["ab", "c", "d"]


def test_a_line_from_the_runner_over_the_bound_is_dropped_and_the_next_one_kept():
    lines = Lines(limit=10)
    assert list(lines.feed(b"x" * 11)) == []
    assert list(lines.feed(b"yy\nok")) == []
    assert list(lines.feed(b"\n")) == [b"ok"]


def test_the_runner_python_is_the_agents_own_unless_a_kernel_uid_cannot_reach_it():
    shared = Path(tempfile.mkdtemp())
    try:
        shared.chmod(0o755)
        private = shared / "private"
        private.mkdir(mode=0o700)
        for folder in (shared, private):
            (folder / "python").write_text("")
            (folder / "python").chmod(0o755)
        assert runner_python(str(private / "python"), isolated=False) == str(private / "python")
        assert runner_python(str(private / "python"), isolated=True) == "python3"
        reachable = all(p.stat().st_mode & 0o001 for p in Path(sys.prefix).resolve().parents)
        expected = str(shared / "python") if reachable else "python3"
        assert runner_python(str(shared / "python"), isolated=True) == expected
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=True)


@pytest.mark.parametrize(
    ("size", "shown"),
    [(8 * 1024**2, "8 MiB"), (64 * 1024, "64 KiB"), (1536 * 1024, "1.5 MiB"), (50, "50 bytes")],
)
def test_the_cut_notice_names_the_limit_in_round_units(size, shown):
    assert size_text(size) == shown
