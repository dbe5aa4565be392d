"""Fixtures for tests against a real Docker engine.

Outside CI a missing engine skips these tests (saying why); under ``CI=true`` it fails.
Nothing is pulled: the test image is built here from the host's busybox-static.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

IN_CI = os.environ.get("CI") == "true"
TEST_IMAGE = "bai-test/busybox:1"


def skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable engine
        skip_or_fail(f"no Docker engine answers ({exc})")
    return client


def busybox_rootfs_tar() -> bytes:
    """A tiny root: busybox with its applet links, a ``work`` user (1000:1000), /home/work.

    Built in Python so that no extended attributes (file capabilities) travel along.
    """
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        skip_or_fail("the host has no busybox-static to build the test image from")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name, mode, uid=0, data=None, link=None, kind=None):
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, now
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type = kind or tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        for d in ("bin", "etc", "home", "root", "usr", "usr/bin", "proc", "sys", "dev", "var"):
            add(d, 0o700 if d == "root" else 0o755)
        add("tmp", 0o1777)
        add("home/work", 0o755, uid=1000)
        add("bin/busybox", 0o755, data=Path(busybox).read_bytes())
        for applet in applets.stdout.split():
            if applet != "busybox":
                add(f"bin/{applet}", 0o777, link="busybox")
        add(
            "etc/passwd",
            0o644,
            data=b"root:x:0:0:root:/root:/bin/sh\nwork:x:1000:1000:work:/home/work:/bin/sh\n",
        )
        add("etc/group", 0o644, data=b"root:x:0:\nwork:x:1000:\n")
    return buf.getvalue()


@pytest.fixture(scope="session")
def test_image(docker_client) -> str:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(TEST_IMAGE)
    except ImageNotFound:
        repo, tag = TEST_IMAGE.split(":")
        docker_client.api.import_image_from_data(busybox_rootfs_tar(), repository=repo, tag=tag)
    return TEST_IMAGE


@pytest.fixture
def images(group):
    """The project's kernel images, registered (the Python one carries sshd)."""
    from sessions_app.models import Image

    Image.objects.get_or_create(reference="bai-kernel/python:2", defaults={"supports_ssh": True})
    Image.objects.get_or_create(reference="bai-kernel/minimal:1")


@pytest.fixture
def fast_heartbeats(settings):
    """Heartbeats every 0.5 s, LOST after 4 s: the live server takes them from settings."""
    settings.BAI_AGENT_HEARTBEAT_INTERVAL = 0.5
    settings.BAI_AGENT_LOST_TIMEOUT = 4.0
