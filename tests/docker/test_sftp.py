"""SFTP system sessions on a real engine, driven by OpenSSH's own ``sftp`` and ``scp``.

The whole path: the API starts a system session on alice's folders, the scheduler places it,
a real agent runs the SFTP kernel (bai-kernel/sftp:2: OpenSSH's sshd, our SFTP server behind
it) and publishes its port on 127.0.0.1, and the standard client talks to it there with the
session's key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from scheduler_app.sweeps import sweep_timeouts
from sessions_app.kernel_images import SFTP_IMAGE
from sessions_app.models import (
    DataFolder,
    FolderPermission,
    FolderShare,
    Image,
    Kernel,
    ResourcePolicy,
    Session,
    SessionType,
    Status,
)
from tests.conftest import skip_or_fail
from tests.docker.test_cluster_system import (  # noqa: F401 - engine is a fixture
    MINIMAL_IMAGE,
    _containers,
    _wait_status,
    engine,
)
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

SSH_OPTIONS = [
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=10",
]
# The same, logging what was negotiated (ssh keeps the first LogLevel it is given).
VERBOSE_SSH_OPTIONS = [o.replace("LogLevel=ERROR", "LogLevel=DEBUG1") for o in SSH_OPTIONS]
QUOTA = 4 * 2**20


@pytest.fixture
def sftp_ready(engine):  # noqa: F811 - the imported fixture
    """The engine (test_cluster_system's fixture, which cleans up after the sessions), the SFTP
    image and OpenSSH's client tools."""
    try:
        engine.images.get(SFTP_IMAGE)
    except Exception:  # noqa: BLE001
        skip_or_fail(f"kernel image {SFTP_IMAGE} is missing (manage.py build_kernel_images)")
    for tool in ("sftp", "scp", "ssh-keygen", "ssh-keyscan"):
        if shutil.which(tool) is None:
            skip_or_fail(f"OpenSSH's {tool} is missing (apt-get install openssh-client)")
    return engine


@pytest.fixture
def images(group):
    Image.objects.get_or_create(reference=SFTP_IMAGE)
    Image.objects.get_or_create(reference=MINIMAL_IMAGE)


def _keypair(path: Path) -> tuple[Path, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (path.with_suffix(".pub")).read_text().strip()


def _sftp(port: int, key: Path, commands: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    batch = cwd / "batch"
    batch.write_text(commands + "\n")
    return subprocess.run(
        ["sftp", *SSH_OPTIONS, "-P", str(port), "-i", str(key), "-b", str(batch), "work@127.0.0.1"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def _scp(
    port: int, key: Path, src: str, dst: str, cwd: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scp", *SSH_OPTIONS, *options, "-P", str(port), "-i", str(key), "-r", src, dst],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def _start_sftp(api, user, folder_ids) -> dict:
    response = api(user).post("/api/v1/folders/sftp/", {"folders": folder_ids}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_openssh_sftp_and_scp_reach_only_the_chosen_folders_with_the_right_keys(
    sftp_ready, images, live_system, agent, api, alice, bob, tmp_path
):
    docker_engine = sftp_ready
    ResourcePolicy.objects.filter(is_default=True).update(
        max_folder_bytes=QUOTA, idle_timeout=timedelta(minutes=10)
    )
    live_system.start_agent(agent)
    work = tmp_path / "client"
    work.mkdir()
    assert api(alice).post("/api/v1/folders/", {"name": "data"}, format="json").status_code == 201
    data = DataFolder.objects.get(owner=alice, name="data")
    bobs = DataFolder.objects.create(owner=bob, name="bobs")
    bobs.host_path.mkdir(parents=True, exist_ok=True)
    (bobs.host_path / "readme.txt").write_text("bob's\n")
    FolderShare.objects.create(folder=bobs, user=alice, permission=FolderPermission.READ_ONLY)
    # A link a container could have made, pointing outside every folder.
    data.host_path.mkdir(parents=True, exist_ok=True)
    os.symlink("/etc", data.host_path / "etclink")

    # Alice registers her own key; bob registers his.
    alice_key, alice_pub = _keypair(work / "alice")
    bob_key, bob_pub = _keypair(work / "bob")
    answer = api(alice).post(
        "/api/v1/ssh-keys/", {"name": "laptop", "public_key": alice_pub}, format="json"
    )
    assert answer.status_code == 201, answer.json()
    assert (
        api(bob)
        .post("/api/v1/ssh-keys/", {"name": "bobs", "public_key": bob_pub}, format="json")
        .status_code
        == 201
    )

    # A running session of alice's mounts the same folder (it sees what SFTP uploads).
    shell = api(alice).post(
        "/api/v1/sessions/",
        {"image": MINIMAL_IMAGE, "resources": {"cpu": "0.5", "mem": "64m"}, "mounts": ["data"]},
        format="json",
    )
    assert shell.status_code == 201, shell.json()

    created = _start_sftp(api, alice, [data.pk, bobs.pk])
    session_id = created["id"]
    assert created["type"] == SessionType.SYSTEM
    try:
        _wait_status(session_id, Status.RUNNING, timeout=90)
        _wait_status(shell.json()["id"], Status.RUNNING, timeout=60)
    except AssertionError:
        print(live_system.agent_log(agent.pk)[-4000:])
        raise
    info = wait_for(
        lambda: (r := api(alice).get(f"/api/v1/sessions/{session_id}/sftp/").json())["port"] and r,
        timeout=20,
        what="the published port",
    )
    assert info["host"] == "127.0.0.1" and info["user"] == "work"
    assert info["folders"] == ["bobs", "data"] and info["readonly_folders"] == ["bobs"]
    assert info["authorized_keys"] == ["session key", "laptop"]
    port = info["port"]
    assert info["command"] == f"sftp -P {port} -i KEYFILE work@127.0.0.1"
    scanned = subprocess.run(
        ["ssh-keyscan", "-p", str(port), "-t", "ed25519", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    keyfile = work / "hostkey.pub"
    keyfile.write_text(scanned.stdout)
    printed = subprocess.run(["ssh-keygen", "-lf", str(keyfile)], capture_output=True, text=True)
    assert info["host_key_fingerprint"] in printed.stdout, (printed.stdout, info)

    # The private key download; bob reaches neither it nor the connection info.
    download = api(alice).get(f"/api/v1/sessions/{session_id}/sftp/key/")
    assert download.status_code == 200
    assert "attachment" in download["Content-Disposition"]
    session_key = work / "session.key"
    session_key.write_bytes(download.content)
    session_key.chmod(0o600)
    assert api(bob).get(f"/api/v1/sessions/{session_id}/sftp/").status_code == 404
    assert api(bob).get(f"/api/v1/sessions/{session_id}/sftp/key/").status_code == 404

    # Upload a file and a tree with the session key.
    (work / "hello.txt").write_text("hello over sftp\n")
    tree = work / "tree" / "a" / "b"
    tree.mkdir(parents=True)
    (tree / "deep.txt").write_text("deep\n")
    (work / "tree" / "top.txt").write_text("top\n")
    before = Session.objects.get(pk=session_id).last_activity_at
    done = _sftp(port, session_key, "ls /\ncd data\nput hello.txt\nput -r tree\nls -l", work)
    assert done.returncode == 0, done.stdout + done.stderr
    listing_root = done.stdout.split("sftp> cd data")[0]
    assert "bobs" in listing_root and "data" in listing_root and ".ssh" not in listing_root
    assert (data.host_path / "hello.txt").read_text() == "hello over sftp\n"
    assert (data.host_path / "tree/a/b/deep.txt").read_text() == "deep\n"
    assert (data.host_path / "tree/top.txt").read_text() == "top\n"
    container = docker_engine.containers.get(
        _containers(docker_engine, shell.json()["id"])["main1"]
    )
    code, out = container.exec_run(["cat", "/home/work/data/tree/a/b/deep.txt"], user="1000:1000")
    assert (code, out) == (0, b"deep\n")
    # A connection is activity (the agent reports it; the manager moves the idle clock).
    wait_for(
        lambda: Session.objects.get(pk=session_id).last_activity_at > before,
        timeout=15,
        what="the SFTP connection to count as activity",
    )

    # scp both ways, with alice's registered key.
    up = _scp(port, alice_key, "hello.txt", "work@127.0.0.1:/data/scp.txt", work)
    assert up.returncode == 0, up.stderr
    down = _scp(port, alice_key, "work@127.0.0.1:/data/tree", str(work / "back"), work)
    assert down.returncode == 0, down.stderr
    assert (work / "back/a/b/deep.txt").read_text() == "deep\n"
    assert (data.host_path / "scp.txt").read_text() == "hello over sftp\n"
    # Legacy SCP (``scp -O`` runs ``scp -t``/``-f`` on the server) is served too, in the folders.
    legacy = _scp(port, alice_key, "hello.txt", "work@127.0.0.1:/data/legacy.txt", work, "-O")
    assert legacy.returncode == 0, legacy.stderr
    assert (data.host_path / "legacy.txt").read_text() == "hello over sftp\n"
    fetched = _scp(
        port, alice_key, "work@127.0.0.1:/data/legacy.txt", "legacy-back.txt", work, "-O"
    )
    assert fetched.returncode == 0 and (work / "legacy-back.txt").read_text() == "hello over sftp\n"
    outside = _scp(port, alice_key, "work@127.0.0.1:/etc/passwd", "passwd", work, "-O")
    assert outside.returncode != 0 and not (work / "passwd").exists()

    # Any other command, or a shell, is refused (sshd forces every session into our server).
    for command in (["cat", "/etc/passwd"], []):
        shell = subprocess.run(
            ["ssh", *SSH_OPTIONS, "-p", str(port), "-i", str(alice_key), "-T", "work@127.0.0.1"]
            + command,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )
        assert shell.returncode != 0 and "root:" not in shell.stdout, shell
        assert "SFTP and SCP only" in shell.stderr, shell.stderr
    # No forwarding: a remote forward is refused at once.
    forward = subprocess.run(
        ["ssh", *SSH_OPTIONS, "-p", str(port), "-i", str(alice_key), "-N", "-T"]
        + ["-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9", "work@127.0.0.1"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert forward.returncode == 255, forward
    # A plain OpenSSH client gets AES-GCM (the fast cipher here), not chacha20 or AES-CTR.
    verbose = subprocess.run(
        ["sftp", *VERBOSE_SSH_OPTIONS, "-P", str(port), "-i", str(alice_key)]
        + ["-b", "-", "work@127.0.0.1"],
        input="ls /\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "server->client cipher: aes128-gcm@openssh.com" in verbose.stderr, verbose.stderr

    # Nothing outside the folders: not /etc, not through a link, not the kernel's home.
    for escape in (
        "cd /etc",
        "get /data/etclink/passwd",
        "ls /data/etclink/",
        "get /.ssh/authorized_keys",
        "cd /data/../..",
    ):
        tried = _sftp(port, session_key, escape, work)
        assert "root:" not in tried.stdout and "ssh-ed25519" not in tried.stdout, escape
        if escape.startswith("get") or escape == "cd /etc":
            assert tried.returncode != 0, (escape, tried.stdout)
    assert not (work / "passwd").exists() and not (work / "authorized_keys").exists()
    gone = _sftp(port, session_key, "cd /data/../..\npwd", work)
    assert "Remote working directory: /\n" in gone.stdout

    # The read-only share refuses writes; its file reads fine.
    refused = _sftp(port, session_key, "put hello.txt /bobs/new.txt", work)
    assert refused.returncode != 0 and not (bobs.host_path / "new.txt").exists()
    assert "Permission denied" in refused.stdout + refused.stderr
    assert _sftp(port, session_key, "rm /bobs/readme.txt", work).returncode != 0
    assert (bobs.host_path / "readme.txt").exists()
    got = _sftp(port, session_key, "get /bobs/readme.txt", work)
    assert got.returncode == 0 and (work / "readme.txt").read_text() == "bob's\n"

    # Two uploads at once (two connections, two processes) share one count of the bytes: they
    # cannot both take the last free ones.
    for name in ("one.bin", "two.bin"):
        (work / name).write_bytes(os.urandom(3 * 2**20))
    racing = [
        subprocess.Popen(
            ["sftp", *SSH_OPTIONS, "-P", str(port), "-i", str(session_key), "-b", "-"]
            + ["work@127.0.0.1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
        )
        for _ in range(2)
    ]
    for proc, name in zip(racing, ("one.bin", "two.bin"), strict=True):
        proc.stdin.write(f"put {name} /data/{name}\n".encode())
        proc.stdin.close()
    codes = [proc.wait(timeout=60) for proc in racing]
    landed = [n for n in ("one.bin", "two.bin") if (data.host_path / n).exists()]
    assert len(landed) <= 1 and sorted(codes)[-1] != 0, (codes, landed)
    for name in landed:  # through SFTP, which counts the bytes freed
        assert _sftp(port, session_key, f"rm /data/{name}", work).returncode == 0
    # A file of many reads comes back whole (reads are answered from one reused buffer).
    whole = _sftp(
        port, session_key, "put one.bin /data/one.bin\nget /data/one.bin one-back.bin", work
    )
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert (work / "one-back.bin").read_bytes() == (work / "one.bin").read_bytes()
    assert _sftp(port, session_key, "rm /data/one.bin", work).returncode == 0

    # Past the byte quota: refused, with the figures in the server's answer; nothing left.
    (work / "big.bin").write_bytes(os.urandom(QUOTA + 2**20))
    over = _sftp(port, session_key, "put big.bin /data/big.bin", work)
    assert over.returncode != 0, over.stdout
    assert not (data.host_path / "big.bin").exists()
    logs = (
        docker_engine.containers.get(_containers(docker_engine, session_id)["main1"])
        .logs()
        .decode()
    )
    assert "Write refused: your folders hold" in logs and "of your 4.0 MiB quota" in logs

    # Bob's key does not open alice's session.
    denied = _sftp(port, bob_key, "ls /", work)
    assert denied.returncode == 255 and "Permission denied" in denied.stderr

    # A second SFTP session is over the limit (1): cancelled at once, with the reason.
    second = _start_sftp(api, alice, [data.pk])
    second_session = Session.objects.get(pk=second["id"])
    assert second_session.status == Status.CANCELLED, second_session.status
    assert "system sessions" in second_session.status_reason, second_session.status_reason

    # No connection for the idle timeout: the sweep ends it.
    later = timezone.now() + timedelta(minutes=11)
    ended = sweep_timeouts(now=later)
    assert session_id in ended.ended.get("idle", []), ended
    _wait_status(session_id, {Status.TERMINATED}, timeout=60)
    assert api(alice).get(f"/api/v1/sessions/{session_id}/sftp/").json()["port"] is None
    assert Kernel.objects.get(pk=session_id).published_port is not None  # kept: where it was
    wait_for(
        lambda: not _containers(docker_engine, session_id), timeout=30, what="container removed"
    )


def test_sftp_refuses_set_id_bits_and_names_with_path_tricks(
    sftp_ready, images, live_system, agent, api, alice, tmp_path
):
    ResourcePolicy.objects.filter(is_default=True).update(max_folder_bytes=2**20)
    live_system.start_agent(agent)
    work = tmp_path / "client"
    work.mkdir()
    assert api(alice).post("/api/v1/folders/", {"name": "data"}, format="json").status_code == 201
    data = DataFolder.objects.get(owner=alice, name="data")
    created = _start_sftp(api, alice, [data.pk])
    session_id = created["id"]
    try:
        _wait_status(session_id, Status.RUNNING, timeout=90)
    except AssertionError:
        print(live_system.agent_log(agent.pk)[-4000:])
        raise
    port = wait_for(
        lambda: api(alice).get(f"/api/v1/sessions/{session_id}/sftp/").json()["port"],
        timeout=20,
        what="the published port",
    )
    key = work / "session.key"
    key.write_bytes(api(alice).get(f"/api/v1/sessions/{session_id}/sftp/key/").content)
    key.chmod(0o600)
    (work / "tool").write_text("#!/bin/sh\nid\n")
    (work / "tool").chmod(0o755)
    assert _sftp(port, key, "put tool /data/tool\nmkdir /data/dir", work).returncode == 0

    # chmod with a set-user-ID or set-group-ID bit on a file: refused, the mode unchanged.
    for mode in ("4777", "2755", "6755", "4700"):
        refused = _sftp(port, key, f"chmod {mode} /data/tool", work)
        assert refused.returncode != 0, (mode, refused.stdout)
        assert "Permission denied" in refused.stdout + refused.stderr, refused
        assert (data.host_path / "tool").stat().st_mode & 0o7777 == 0o755, mode
    assert _sftp(port, key, "chmod 4777 /data/dir", work).returncode != 0
    # Plain modes, and set-group-ID on a directory (it only passes its group on), still work.
    assert _sftp(port, key, "chmod 700 /data/tool\nchmod 2770 /data/dir", work).returncode == 0
    assert (data.host_path / "tool").stat().st_mode & 0o7777 == 0o700
    assert (data.host_path / "dir").stat().st_mode & 0o7777 == 0o2770

    # A name with a path trick is refused however it would be made: upload, mkdir, rename.
    for command in (
        "put tool '/data/..\\\\..\\\\Windows\\\\evil.txt'",
        "put tool '/data/C:evil.txt'",
        "mkdir '/data/a\\\\b'",
        "rename /data/tool '/data/x\\\\y'",
    ):
        tried = _sftp(port, key, command, work)
        assert tried.returncode != 0, (command, tried.stdout, tried.stderr)
    assert sorted(os.listdir(data.host_path)) == ["dir", "tool"]
    # A colon inside a name is an ordinary Linux name.
    assert _sftp(port, key, "put tool /data/12:30.log", work).returncode == 0

    # A kernel writes past the quota while the SFTP session runs: every write is refused
    # until the folder is under it again.
    (data.host_path / "big.bin").write_bytes(b"k" * 5_000_003)
    over = _sftp(port, key, "put tool /data/after.txt", work)
    assert over.returncode != 0 and not (data.host_path / "after.txt").exists(), over.stdout
    logs = _sftp_logs(sftp_ready, session_id)
    assert "over your 1.0 MiB quota" in logs and "delete files first" in logs, logs[-2000:]
    assert _sftp(port, key, "rm /data/big.bin\nput tool /data/after.txt", work).returncode == 0


def _sftp_logs(docker_engine, session_id: str) -> str:
    container = docker_engine.containers.get(_containers(docker_engine, session_id)["main1"])
    return container.logs().decode()
