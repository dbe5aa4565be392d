"""The Docker backend against a real engine (no pulls: images are built locally)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from agent import protocol
from agent.backends.base import nofile_limit
from agent.backends.docker import L_AGENT_KEY, DockerBackend
from agent.config import AgentConfig

pytestmark = [pytest.mark.docker, pytest.mark.asyncio]

HOSTS = ("main1", "sub1", "sub2")
IN_CI = os.environ.get("CI") == "true"
PYTHON_IMAGE = "bai-kernel/python:2"  # manage.py build_kernel_images: python3, sshd, ssh


class Frames:
    def __init__(self) -> None:
        self.seen: list[dict] = []
        self._changed = asyncio.Event()

    def __call__(self, frame: dict) -> None:
        self.seen.append(frame)
        self._changed.set()

    async def wait_for(self, timeout: float = 30.0, **match) -> dict:
        async with asyncio.timeout(timeout):
            start = 0
            while True:
                for frame in self.seen[start:]:
                    if all(frame.get(k) == v for k, v in match.items()):
                        return frame
                start = len(self.seen)
                self._changed.clear()
                await self._changed.wait()

    def text(self, term_id: str) -> str:
        return "".join(f["data"] for f in self.seen if f.get("term_id") == term_id and "data" in f)

    async def wait_text(self, term_id: str, needle: str, timeout: float = 15.0) -> str:
        async with asyncio.timeout(timeout):
            while needle not in self.text(term_id):
                self._changed.clear()
                await self._changed.wait()
        return self.text(term_id)


def cluster_spec(image: str, hosts=HOSTS, command=None, mounts=None, ssh=None) -> dict:
    session_id = f"bait{uuid.uuid4().hex[:20]}"
    kernels = []
    subs = 0
    for host in hosts:
        role = "main" if host.startswith("main") else "sub"
        subs += role == "sub"
        kernel_id = session_id if host == "main1" else f"bait{uuid.uuid4().hex[:20]}"
        env = {
            "BACKENDAI_CLUSTER_HOST": host,
            "BACKENDAI_CLUSTER_HOSTS": ",".join(hosts),
            "BACKENDAI_CLUSTER_IDX": "1" if role == "main" else str(subs),
            "BACKENDAI_CLUSTER_LOCAL_RANK": "0" if role == "main" else str(subs),
            "BACKENDAI_CLUSTER_MODE": "single-node",
            "BACKENDAI_CLUSTER_ROLE": role,
            "BACKENDAI_CLUSTER_SIZE": str(len(hosts)),
            "BACKENDAI_KERNEL_ID": kernel_id,
            "BACKENDAI_SESSION_ID": session_id,
            "BACKENDAI_SESSION_NAME": 'it\'s a "test"',
        }
        kernels.append(
            {
                "kernel_id": kernel_id,
                "hostname": host,
                "role": role,
                "image": image,
                "slots": {"cpu": "0.5", "mem": str(128 * 1024**2)},
                "env": env,
                "mounts": mounts or [],
                "startup_command": command if role == "main" else None,
                "cluster_hosts": list(hosts),
            }
        )
    return {
        "type": protocol.CREATE_KERNELS,
        "session_id": session_id,
        "network": f"bai-{session_id}",
        "cluster_mode": "single-node",
        "session_type": "batch" if command else "interactive",
        "ssh": ssh,
        "kernels": kernels,
    }


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    data_root = tmp_path / "data"
    data_root.mkdir()
    return AgentConfig(
        token=f"docker-test-{uuid.uuid4().hex}",
        work_dir=tmp_path / "work",
        data_root=data_root,
        term_grace=2.0,
        log_tail_bytes=4096,
    )


def _cleanup(client, agent_key: str) -> None:
    """Remove everything these tests made, found by label, even after a failure."""
    sessions = set()
    for c in client.api.containers(all=True, filters={"label": f"{L_AGENT_KEY}={agent_key}"}):
        sessions.add((c.get("Labels") or {}).get("ai.backend.network"))
        client.api.remove_container(c["Id"], force=True, v=True)
    for net in client.api.networks(filters={"label": "ai.backend.managed=true"}):
        if net["Name"] in sessions or net["Name"].startswith("bai-bait"):
            try:
                client.api.remove_network(net["Id"])
            except Exception:  # noqa: BLE001 - best effort
                pass


@contextlib.asynccontextmanager
async def running_backend(docker_client, config: AgentConfig):
    """A started backend whose frames are collected in ``.frames``; closed at the end."""
    frames = Frames()
    b = DockerBackend(config, frames, client=docker_client)
    b.set_agent_id("agent-docker-test")
    b.frames = frames
    await b.start()
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture
async def backend(docker_client, config):
    async with running_backend(docker_client, config) as b:
        yield b
        _cleanup(docker_client, config.agent_key)


def exec_out(client, container_id: str, cmd: str, user: str = "1000:1000") -> tuple[int, str]:
    res = client.api.exec_create(container_id, ["/bin/sh", "-c", cmd], user=user)
    out = client.api.exec_start(res["Id"]).decode()
    return client.api.exec_inspect(res["Id"])["ExitCode"], out


async def run_cluster(backend, spec) -> dict[str, str]:
    """Create the kernels and wait until all run; returns hostname -> container id."""
    await backend.create_kernels(spec)
    ids = {}
    for k in spec["kernels"]:
        running = await backend.frames.wait_for(kernel_id=k["kernel_id"], status="running")
        ids[k["hostname"]] = running["container_id"]
    return ids


async def test_a_cluster_shares_one_internal_network_env_and_data_folder(
    backend, docker_client, test_image, config
):
    folder = config.data_root / "alice" / "shared"
    spec = cluster_spec(test_image, mounts=[{"name": "shared", "host_path": str(folder)}])
    ids = await run_cluster(backend, spec)
    net = docker_client.api.inspect_network(spec["network"])
    assert net["Internal"] is True
    assert set(net["Containers"]) == set(ids.values())
    for k in spec["kernels"]:
        info = docker_client.api.inspect_container(ids[k["hostname"]])
        cfg, host = info["Config"], info["HostConfig"]
        assert cfg["Hostname"] == k["hostname"]
        assert k["hostname"] in info["NetworkSettings"]["Networks"][spec["network"]]["Aliases"]
        env = dict(e.split("=", 1) for e in cfg["Env"])
        for key, value in k["env"].items():
            assert env[key] == value, key
        assert cfg["User"] == "1000:1000"
        assert cfg["Labels"]["ai.backend.kernel_id"] == k["kernel_id"]
        assert cfg["Labels"]["ai.backend.session_id"] == spec["session_id"]
        assert cfg["Labels"]["ai.backend.hostname"] == k["hostname"]
        assert cfg["Labels"]["ai.backend.agent"] == "agent-docker-test"
        assert host["Privileged"] is False
        assert host["CapDrop"] == ["ALL"]
        assert not host.get("CapAdd")
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["NanoCpus"] == 500_000_000
        assert host["Memory"] == 128 * 1024**2
        assert {m["Destination"]: m["Source"] for m in info["Mounts"]} == {
            "/home/work": str(backend.home_dir(k["kernel_id"])),
            "/home/work/shared": str(folder),
        }
        code, out = exec_out(
            docker_client, ids[k["hostname"]], "id -u; echo $BACKENDAI_CLUSTER_HOST"
        )
        assert out.split() == ["1000", k["hostname"]]
        code, out = exec_out(
            docker_client, ids[k["hostname"]], '. ~/.backendai_env; echo "$BACKENDAI_SESSION_NAME"'
        )
        assert out == 'it\'s a "test"\n'

    # main1 reaches sub2 by its hostname over TCP.
    docker_client.api.exec_start(
        docker_client.api.exec_create(
            ids["sub2"], ["/bin/sh", "-c", "echo pong-from-$(hostname) | nc -l -p 9000"]
        )["Id"],
        detach=True,
    )
    for _ in range(50):
        code, out = exec_out(docker_client, ids["main1"], "nc -w 2 sub2 9000")
        if out:
            break
        await asyncio.sleep(0.1)
    assert out == "pong-from-sub2\n"
    # The network is internal: no route out.
    code, _ = exec_out(docker_client, ids["main1"], "nc -w 1 192.0.2.1 80 </dev/null")
    assert code != 0

    # A file written in sub2's data folder is read in main1.
    code, _ = exec_out(docker_client, ids["sub2"], "echo shared-data > ~/shared/from-sub2")
    assert code == 0
    code, out = exec_out(docker_client, ids["main1"], "cat ~/shared/from-sub2")
    assert out == "shared-data\n"
    assert (folder / "from-sub2").stat().st_uid == 1000
    if os.geteuid() == 0:  # the folder is the kernel user's, and nobody else's
        st = folder.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o2770)


async def test_a_read_only_share_refuses_a_write_in_the_container(
    backend, docker_client, test_image, config
):
    ro = config.data_root / "u1" / "shared-ro"
    rw = config.data_root / "u1" / "own"
    ro.mkdir(parents=True)
    (ro / "readme").write_text("read me\n")
    mounts = [
        {"name": "shared-ro", "host_path": str(ro), "readonly": True},
        {"name": "own", "host_path": str(rw)},
    ]
    spec = cluster_spec(test_image, hosts=("main1",), mounts=mounts)
    ids = await run_cluster(backend, spec)
    info = docker_client.api.inspect_container(ids["main1"])
    modes = {m["Destination"]: m["RW"] for m in info["Mounts"]}
    assert modes["/home/work/shared-ro"] is False and modes["/home/work/own"] is True

    code, out = exec_out(docker_client, ids["main1"], "cat ~/shared-ro/readme")
    assert (code, out) == (0, "read me\n")
    code, out = exec_out(docker_client, ids["main1"], "echo x > ~/shared-ro/new 2>&1; echo rc=$?")
    assert "Read-only file system" in out and "rc=1" in out
    code, _ = exec_out(docker_client, ids["main1"], "rm ~/shared-ro/readme")
    assert code != 0
    assert sorted(os.listdir(ro)) == ["readme"]
    code, _ = exec_out(docker_client, ids["main1"], "echo x > ~/own/new")
    assert code == 0 and (rw / "new").read_text() == "x\n"


async def test_a_link_to_etc_made_in_a_container_is_not_followed_by_download_or_zip(
    backend, docker_client, test_image, config
):
    import io
    import zipfile

    from sessions_app import folder_files
    from sessions_app.errors import NotFound

    folder = config.data_root / "u1" / "data"
    spec = cluster_spec(
        test_image, hosts=("main1",), mounts=[{"name": "data", "host_path": str(folder)}]
    )
    ids = await run_cluster(backend, spec)
    code, _ = exec_out(
        docker_client,
        ids["main1"],
        "cd ~/data && ln -s /etc etc && ln -s /etc/passwd passwd && echo mine > mine.txt",
    )
    assert code == 0 and os.path.islink(folder / "etc")

    for path in (("passwd",), ("etc", "passwd")):
        with pytest.raises(NotFound, match="is a symbolic link; links are not followed"):
            folder_files.open_file(folder, path)
    with pytest.raises(NotFound, match="symbolic link"):
        folder_files.check_dir(folder, ("etc",))
    archive = b"".join(folder_files.zip_chunks(folder, ()))
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        assert z.namelist() == ["mine.txt"]
    entries, _ = folder_files.list_dir(folder, ())
    assert {e.name: e.type for e in entries} == {
        "etc": "symlink",
        "passwd": "symlink",
        "mine.txt": "file",
    }
    folder_files.remove(folder, ("etc",))
    assert not os.path.lexists(folder / "etc") and os.path.isdir("/etc/")


async def test_batch_kernels_report_exit_codes_and_keep_their_log_tail(backend, test_image):
    ok = cluster_spec(
        test_image, hosts=("main1",), command="echo all good; sleep 0.2; echo to-stderr >&2; exit 0"
    )
    bad = cluster_spec(test_image, hosts=("main1",), command="seq 1 2000; echo failing; exit 3")
    await backend.create_kernels(ok)
    await backend.create_kernels(bad)
    f = backend.frames
    done_ok = await f.wait_for(kernel_id=ok["session_id"], status="exited")
    done_bad = await f.wait_for(kernel_id=bad["session_id"], status="exited")
    assert done_ok["exit_code"] == 0
    assert done_bad["exit_code"] == 3
    tail_ok = await f.wait_for(type=protocol.LOG_TAIL, kernel_id=ok["session_id"])
    tail_bad = await f.wait_for(type=protocol.LOG_TAIL, kernel_id=bad["session_id"])
    assert tail_ok["data"] == "all good\nto-stderr\n"  # stdout and stderr
    assert tail_bad["data"].endswith("1999\n2000\nfailing\n")
    assert not tail_bad["data"].startswith("1\n")  # cut: only the last 4096 bytes are kept
    assert len(tail_bad["data"].encode()) <= 4096  # --log-tail-bytes
    await backend.destroy_kernels([ok["session_id"], bad["session_id"]], "done")
    await f.wait_for(kernel_id=bad["session_id"], status="gone")
    assert await backend.log_tail(bad["session_id"]) == tail_bad["data"]
    tails = [x for x in f.seen if x["type"] == protocol.LOG_TAIL]
    assert len(tails) == 2  # once per end, not again at destroy


async def test_destroy_removes_containers_and_the_network(backend, docker_client, test_image):
    spec = cluster_spec(test_image, hosts=("main1", "sub1"))
    ids = await run_cluster(backend, spec)
    await backend.create_kernels(spec)  # a repeated create changes nothing
    assert len(await backend.list_kernels()) == 2
    started = time.monotonic()
    await backend.destroy_kernels([k["kernel_id"] for k in spec["kernels"]], "user request")
    assert time.monotonic() - started < 5
    for k in spec["kernels"]:
        gone = await backend.frames.wait_for(kernel_id=k["kernel_id"], status="gone")
        assert gone["reason"] == "user request"
    assert not docker_client.api.containers(all=True, filters={"id": list(ids.values())})
    assert not [n for n in docker_client.api.networks() if n["Name"] == spec["network"]]
    assert await backend.list_kernels() == []
    await backend.destroy_kernels(["never-existed"], "cleanup")
    await backend.frames.wait_for(kernel_id="never-existed", status="gone")


async def test_a_restarted_agent_finds_and_watches_the_surviving_containers(
    backend, docker_client, test_image, config
):
    spec = cluster_spec(test_image, hosts=("main1", "sub1"))
    ids = await run_cluster(backend, spec)
    await backend.close()  # the agent stops; its containers keep running

    frames = Frames()
    again = DockerBackend(config, frames, client=docker_client)
    await again.start()
    try:
        reports = {r.kernel_id: r for r in await again.list_kernels()}
        assert set(reports) == {k["kernel_id"] for k in spec["kernels"]}
        assert {r.status for r in reports.values()} == {"running"}
        assert {r.container_id for r in reports.values()} == set(ids.values())
        # Its exit watcher works for adopted containers too.
        docker_client.api.kill(ids["sub1"], signal="SIGKILL")
        sub1 = spec["kernels"][1]["kernel_id"]
        ended = await frames.wait_for(kernel_id=sub1, status="exited")
        assert ended["exit_code"] == 137
        await again.destroy_kernels(list(reports), "cleanup")
        await frames.wait_for(kernel_id=spec["session_id"], status="gone")
    finally:
        await again.close()


async def test_a_missing_image_is_an_error_that_names_it(backend):
    spec = cluster_spec("bai-kernel/does-not-exist:1", hosts=("main1",))
    await backend.create_kernels(spec)
    err = await backend.frames.wait_for(kernel_id=spec["session_id"], status="error")
    assert err["reason"] == (
        "image bai-kernel/does-not-exist:1 is not present on agent agent-docker-test"
        " and pulling is disabled"
    )


async def test_a_mount_outside_the_data_root_is_refused_and_never_mounted(
    backend, docker_client, test_image
):
    spec = cluster_spec(test_image, hosts=("main1",), mounts=[{"name": "x", "host_path": "/etc"}])
    await backend.create_kernels(spec)
    err = await backend.frames.wait_for(kernel_id=spec["session_id"], status="error")
    assert "outside the data root" in err["reason"]
    assert not docker_client.api.containers(all=True, filters={"name": spec["session_id"]})
    assert not backend.home_dir(spec["session_id"]).exists()


async def test_the_terminal_echoes_resizes_and_reattaches(backend, test_image):
    spec = cluster_spec(test_image, hosts=("main1",))
    container_id = (await run_cluster(backend, spec))["main1"]
    kid = spec["session_id"]
    await backend.term_open("dt", kid, 80, 24)
    backend.term_input("dt", "echo $BACKENDAI_CLUSTER_HOST-$((40+2)) $(id -u)\n")
    await backend.frames.wait_text("dt", "main1-42 1000")
    await backend.term_resize("dt", 120, 33)
    backend.term_input("dt", "stty size\n")
    await backend.frames.wait_text("dt", "33 120")
    backend.term_detach("dt")
    backend.term_input("dt", "echo after-detach\n")
    await backend.term_open("dt", kid, 120, 33)
    backend.term_input("dt", "echo reattached\n")
    await backend.frames.wait_text("dt", "reattached\r\n")
    backend.term_input("dt", "sleep 1000\n")  # a busy shell must end too
    await asyncio.sleep(0.2)
    await backend.term_close("dt")
    await backend.frames.wait_for(type=protocol.TERM_CLOSED, term_id="dt")
    # The shell ends with the terminal.
    for _ in range(50):
        _, out = exec_out(backend.client, container_id, 'ps -o args | grep -c "^/bin/[s]h -l"')
        if out.strip() == "0":
            break
        await asyncio.sleep(0.1)
    assert out.strip() == "0"


async def test_follow_logs_streams_many_lines_in_order(backend, test_image):
    spec = cluster_spec(test_image, hosts=("main1",), command="sleep 0.5; seq 1 100000")
    await run_cluster(backend, spec)
    text = "".join([c async for c in backend.follow_logs(spec["session_id"], 0)])
    assert text == "".join(f"{i}\n" for i in range(1, 100001))


async def test_a_followed_log_carries_every_line_in_order_in_blocks_not_lines(backend, test_image):
    # The engine's log endpoint sends a line per HTTP chunk, which capped a followed log
    # near 40-70k lines/s; the attach stream carries the engine's blocks. The speed is
    # measured by bench/streams.py (never in a timed test); here: every line, in order,
    # arriving in blocks rather than a line at a time.
    lines = 300_000
    spec = cluster_spec(test_image, hosts=("main1",), command=f"sleep 1; seq 1 {lines}")
    await run_cluster(backend, spec)
    chunks = [chunk async for chunk in backend.follow_logs(spec["session_id"], 0)]
    assert "".join(chunks) == "".join(f"{i}\n" for i in range(1, lines + 1))
    assert len(chunks) <= lines // 100, f"{len(chunks)} pieces for {lines} lines"


async def test_a_followed_log_gives_the_tail_then_live_output_each_line_once(backend, test_image):
    command = "seq 1 500; sleep 2; seq 501 1000; sleep 1"
    spec = cluster_spec(test_image, hosts=("main1",), command=command)
    await run_cluster(backend, spec)
    await asyncio.sleep(1)  # the first 500 lines are in the log before the follow starts
    text = "".join([c async for c in backend.follow_logs(spec["session_id"], 64 * 1024)])
    assert text == "".join(f"{i}\n" for i in range(1, 1001))


async def test_ssh_to_a_sub_kernel_works_from_main1(backend, docker_client):
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(PYTHON_IMAGE)
    except ImageNotFound:
        if IN_CI:
            pytest.fail(f"CI=true and image {PYTHON_IMAGE} is not built (build_kernel_images)")
        pytest.skip(f"image {PYTHON_IMAGE} is not built here (build_kernel_images builds it)")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    ssh = {
        "private_key": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode(),
        "public_key": key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode(),
    }
    spec = cluster_spec(PYTHON_IMAGE, hosts=("main1", "sub1"), ssh=ssh)
    ids = await run_cluster(backend, spec)
    cmd = "ssh sub1 'echo $BACKENDAI_CLUSTER_HOST $BACKENDAI_CLUSTER_ROLE $(hostname) $(id -un)'"
    for _ in range(50):
        code, out = exec_out(docker_client, ids["main1"], cmd)
        if code == 0:
            break
        await asyncio.sleep(0.2)
    assert (code, out) == (0, "sub1 sub sub1 work\n")
    code, out = exec_out(docker_client, ids["main1"], "stat -c %a ~/.ssh ~/.ssh/id_session")
    assert out.split() == ["700", "600"]


def _session_keys() -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    return {
        "private_key": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode(),
        "public_key": key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode(),
    }


async def test_a_kernel_asking_for_almost_nothing_still_runs_under_real_limits(
    backend, docker_client, test_image
):
    spec = cluster_spec(test_image, hosts=("main1",))
    spec["kernels"][0]["slots"] = {"cpu": "0.0000000001", "mem": 0.5}
    ids = await run_cluster(backend, spec)
    host = docker_client.api.inspect_container(ids["main1"])["HostConfig"]
    assert host["NanoCpus"] == 10_000_000  # 0.01 core, the agent's floor
    assert host["Memory"] == 16 * 1024**2  # 16 MiB, the agent's floor
    assert host["MemorySwap"] == 16 * 1024**2  # and no swap on top
    assert host["PidsLimit"] == 4096


async def test_a_container_writes_only_to_its_home_its_small_tmp_and_its_folders(
    backend, docker_client, test_image, config
):
    folder = config.data_root / "alice" / "data"
    spec = cluster_spec(
        test_image, hosts=("main1",), mounts=[{"name": "data", "host_path": str(folder)}]
    )
    ids = await run_cluster(backend, spec)
    cid = ids["main1"]
    host = docker_client.api.inspect_container(cid)["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert "size=67108864" in host["Tmpfs"]["/tmp"]  # half of its 128 MiB: under --kernel-tmp-size
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]} == {"nofile": nofile_limit()}
    code, out = exec_out(docker_client, cid, "touch /etc/x /usr/x /x 2>&1; echo rc=$?")
    assert "Read-only file system" in out and out.strip().endswith("rc=1")
    for path in ("~/note", "/tmp/note", "~/data/note"):
        code, out = exec_out(docker_client, cid, f"echo hi > {path} && cat {path}")
        assert (code, out) == (0, "hi\n"), path
    code, out = exec_out(docker_client, cid, "df -k /tmp | tail -1")
    assert out.split()[1] == str(64 * 1024)  # KiB
    code, out = exec_out(docker_client, cid, "ulimit -n")
    assert out.strip() == str(nofile_limit())
    home = backend.home_dir(spec["session_id"])
    assert (home / "note").read_text() == "hi\n"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    if os.geteuid() == 0:
        assert (home.stat().st_uid, home.stat().st_gid) == (1000, 1000)
    await backend.destroy_kernels([spec["session_id"]], "done")
    await backend.frames.wait_for(kernel_id=spec["session_id"], status="gone")
    assert not home.exists()  # the home goes with the kernel


async def test_docker_inspect_shows_no_part_of_the_sessions_private_key(
    backend, docker_client, test_image
):
    ssh = _session_keys()
    spec = cluster_spec(test_image, hosts=("main1", "sub1"), ssh=ssh)
    ids = await run_cluster(backend, spec)
    secret_lines = [
        line for line in ssh["private_key"].splitlines() if line and not line.startswith("-----")
    ]
    assert secret_lines
    for cid in ids.values():
        inspected = json.dumps(docker_client.api.inspect_container(cid))
        for line in secret_lines:
            assert line not in inspected
            assert line.replace("/", "\\/") not in inspected
        # The kernel still has its key, where ssh looks for it.
        code, out = exec_out(
            docker_client, cid, "cat ~/.ssh/id_session; stat -c %a ~/.ssh/id_session"
        )
        assert out == ssh["private_key"].rstrip("\n") + "\n600\n"


async def test_a_data_folder_is_mounted_nosuid_and_nodev_and_a_setuid_file_does_not_elevate(
    docker_client, test_image, config
):
    if os.geteuid() != 0:
        pytest.skip("making the data root nosuid needs root (as the agent runs on a node)")
    folder = config.data_root / "u1" / "data"
    folder.mkdir(parents=True)
    # A set-user-ID root program in the folder, as a kernel of another user cannot make it.
    shutil.copy("/bin/busybox", folder / "busybox")
    os.chown(folder / "busybox", 0, 0)
    os.chmod(folder / "busybox", 0o4755)
    async with running_backend(docker_client, config) as backend:
        try:
            spec = cluster_spec(
                test_image, hosts=("main1",), mounts=[{"name": "data", "host_path": str(folder)}]
            )
            ids = await run_cluster(backend, spec)
            code, out = exec_out(
                docker_client, ids["main1"], "grep ' /home/work/data ' /proc/mounts"
            )
            assert code == 0, out
            options = out.split()[3].split(",")
            assert "nosuid" in options and "nodev" in options, out
            code, out = exec_out(docker_client, ids["main1"], "~/data/busybox id -u")
            assert (code, out.strip()) == (0, "1000"), out
        finally:
            _cleanup(docker_client, config.agent_key)
    # The agent's own mount of the data root ends with it.
    assert not os.statvfs(config.data_root).f_flag & os.ST_NOSUID
