"""SFTP throughput of a data folder against a local disk copy, in the same run.

    python bench/folders_sftp.py [--mb 1024]

``bench_sftp(...)`` is the SFTP section of ``bench/folders.py``: given a running SFTP session's
published port and key, it times OpenSSH ``sftp`` uploading a file of ``mb`` MiB into the folder
and downloading it back, and ``cp`` of the same file to and from the same disk, and checks that
every copy arrived whole. Run alone, this module stands up what it needs without the manager:
the agent's Docker backend creates an SFTP kernel (``SFTP_IMAGE``: OpenSSH's sshd with our SFTP
server behind it, with an SFTP session's resources, ``SFTP_RESOURCES``) on a folder under a
temporary directory and publishes its port on 127.0.0.1, exactly as an agent does for an SFTP
session; then it removes everything. ``--cpu`` overrides the kernel's CPU quota.

Targets (issue 14): at least 100 MB/s both ways on loopback. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SSH_OPTIONS = [
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "LogLevel=ERROR",
]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _sftp(host: str, port: int, key: Path, commands: str, cwd: Path) -> None:
    batch = cwd / "sftp-batch"
    batch.write_text(commands + "\n")
    subprocess.run(
        ["sftp", *SSH_OPTIONS, "-P", str(port), "-i", str(key), "-b", str(batch), f"work@{host}"],
        check=True,
        capture_output=True,
        cwd=cwd,
    )


def bench_sftp(
    *,
    host: str,
    port: int,
    key: Path,
    folder: str,
    folder_path: Path,
    scratch: Path,
    mb: int = 1024,
) -> dict[str, float]:
    """Upload and download ``mb`` MiB through SFTP (``folder`` is the folder's name in the
    session, ``folder_path`` where it lives on this host), and copy it on the local disk.

    Returns MB/s (10^6 bytes per second) per direction: ``sftp_upload``, ``sftp_download``,
    ``disk_copy_in``, ``disk_copy_out``; raises when any copy does not arrive whole."""
    scratch.mkdir(parents=True, exist_ok=True)
    source = scratch / "bench-source.bin"
    with open(source, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(mb):
            f.write(block)
    size = source.stat().st_size
    digest = _digest(source)
    name = f"bench-{uuid.uuid4().hex[:8]}.bin"
    figures: dict[str, float] = {}
    try:
        seconds = _timed(lambda: _sftp(host, port, key, f"put {source} /{folder}/{name}", scratch))
        figures["sftp_upload"] = size / seconds / 1e6
        back = scratch / "bench-back.bin"
        seconds = _timed(lambda: _sftp(host, port, key, f"get /{folder}/{name} {back}", scratch))
        figures["sftp_download"] = size / seconds / 1e6
        if _digest(folder_path / name) != digest or _digest(back) != digest:
            raise RuntimeError("an SFTP copy did not arrive whole")
        local = folder_path / f"local-{name}"
        seconds = _timed(lambda: shutil.copyfile(source, local))
        figures["disk_copy_in"] = size / seconds / 1e6
        seconds = _timed(lambda: shutil.copyfile(local, back))
        figures["disk_copy_out"] = size / seconds / 1e6
        local.unlink()
        back.unlink()
    finally:
        (folder_path / name).unlink(missing_ok=True)
        source.unlink(missing_ok=True)
    return figures


def report(figures: dict[str, float], mb: int) -> None:
    print(f"SFTP, {mb} MiB file, OpenSSH sftp through the agent's published port (loopback):")
    print(
        f"  upload    {figures['sftp_upload']:8.1f} MB/s   (local disk copy in  {figures['disk_copy_in']:8.1f} MB/s)"
    )
    print(
        f"  download  {figures['sftp_download']:8.1f} MB/s   (local disk copy out {figures['disk_copy_out']:8.1f} MB/s)"
    )
    print(
        f"  ratio     {figures['sftp_upload'] / figures['disk_copy_in']:.2f} up, "
        f"{figures['sftp_download'] / figures['disk_copy_out']:.2f} down (SFTP / disk)"
    )


async def _standalone(mb: int, cpu: str, mem: str) -> dict[str, float]:
    """An SFTP kernel made by the agent's Docker backend, without the manager."""
    import docker

    from agent.backends.docker import DockerBackend
    from agent.config import AgentConfig
    from bai_common.units import parse_size
    from sessions_app.kernel_images import SFTP_IMAGE

    root = Path(tempfile.mkdtemp(prefix="bai-bench-sftp-"))
    data_root = root / "data"
    folder_path = data_root / "bench"
    folder_path.mkdir(parents=True)
    config = AgentConfig(
        token=f"bench-{uuid.uuid4().hex}", work_dir=root / "work", data_root=data_root
    )
    client = docker.from_env(timeout=60)
    backend = DockerBackend(config, lambda frame: None, client=client)
    backend.set_agent_id("bench")
    await backend.start()
    key = root / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    session_id = f"bench{uuid.uuid4().hex[:20]}"
    spec = {
        "session_id": session_id,
        "network": f"bai-{session_id}",
        "cluster_mode": "single-node",
        "session_type": "system",
        "ssh": {"private_key": key.read_text(), "public_key": (root / "id.pub").read_text()},
        "kernels": [
            {
                "kernel_id": session_id,
                "hostname": "main1",
                "role": "main",
                "image": SFTP_IMAGE,
                "slots": {"cpu": cpu, "mem": str(parse_size(mem))},
                "env": {},
                "mounts": [{"name": "bench", "host_path": str(folder_path)}],
                "startup_command": None,
                "cluster_hosts": ["main1"],
                "service_ports": [],
                "sftp": {"authorized_keys": [], "quotas": []},
            }
        ],
    }
    try:
        await backend.create_kernels(spec)
        state = backend.kernels[session_id]
        if state.status != "running":
            raise RuntimeError(f"the SFTP kernel did not start: {state.reason}")
        port = state.extra["published"].port
        return await asyncio.to_thread(
            bench_sftp,
            host="127.0.0.1",
            port=port,
            key=key,
            folder="bench",
            folder_path=folder_path,
            scratch=root / "scratch",
            mb=mb,
        )
    finally:
        await backend.destroy_kernels([session_id], "bench done")
        await backend.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    import django

    django.setup()
    from sessions_app.sftp import SFTP_RESOURCES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="file size in MiB (default 1024)")
    parser.add_argument(
        "--cpu",
        default=SFTP_RESOURCES["cpu"],
        help=f"the SFTP kernel's CPU quota (default an SFTP session's, {SFTP_RESOURCES['cpu']})",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.mb = 4
    figures = asyncio.run(_standalone(args.mb, args.cpu, SFTP_RESOURCES["mem"]))
    report(figures, args.mb)
    print(
        f"conditions: the SFTP kernel at {args.cpu} CPU; "
        f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; the data folder and "
        f"the scratch file on {tempfile.gettempdir()}"
    )


if __name__ == "__main__":
    main()
