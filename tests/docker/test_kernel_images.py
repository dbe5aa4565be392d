"""The project's kernel images, built locally, against the real Docker engine.

Under ``CI=true`` a missing engine (or a missing debootstrap when the python image is neither in the
engine nor cached) fails the run; elsewhere those tests skip with the reason.

Everything the tests create (containers, networks) carries the label ``ai.backend.test`` with a
per-run value and is removed afterwards, even on failure. Networks are internal bridges: no traffic
leaves the machine.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sessions_app import kernel_images as images

IN_CI = os.environ.get("CI") == "true"
TEST_LABEL = "ai.backend.test"
SSH_PORT = 2200


def _present(client, reference: str) -> bool:
    """The engine holds an image by that name."""
    from docker.errors import ImageNotFound

    try:
        client.images.get(reference)
    except ImageNotFound:
        return False
    return True


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- no engine needed


def test_minimal_rootfs_tar_layout() -> None:
    if not os.path.exists(images.BUSYBOX_PATH):
        _unavailable("busybox-static is not installed (apt-get install busybox-static)")
    data = images.minimal_rootfs_tar()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        passwd = tar.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
        group = tar.extractfile("etc/group").read().decode()  # type: ignore[union-attr]
    home = members["home/work"]
    assert home.isdir() and (home.uid, home.gid) == (1000, 1000)
    assert members["tmp"].mode == 0o1777
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode == 0o755
    for applet in ("bin/sh", "bin/ls", "bin/cat", "bin/sleep", "bin/hostname", "bin/ping"):
        assert members[applet].issym() and members[applet].linkname == "/bin/busybox", applet
    assert any(n.endswith("/nc") for n in members) and any(n.endswith("/ip") for n in members)
    assert all(not m.pax_headers for m in members.values()), "no xattrs / pax headers"
    assert "work:x:1000:1000:work:/home/work:/bin/sh" in passwd.splitlines()
    assert "work:x:1000:" in group.splitlines()
    assert images.minimal_rootfs_tar() == data, "the tar is reproducible"


def test_apt_mirror_and_recipe_hash_are_stable() -> None:
    mirror = images.find_apt_mirror()
    assert mirror.startswith(("http://", "https://", "file:/")), mirror
    assert images.python_recipe_hash() == images.python_recipe_hash()
    assert len(images.python_recipe_hash()) == 16


def test_missing_debootstrap_is_a_clear_error(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(images.shutil, "which", lambda _name: None)
    with pytest.raises(images.ImageBuildError, match="apt-get install debootstrap"):
        images._build_python_tarball(lambda _m: None, tmp_path / "x.tar", "0" * 16)


# --------------------------------------------------------------------------- engine fixtures
# ``docker_client`` comes from tests/docker/conftest.py (skips, or fails under CI=true).


@pytest.fixture(scope="module")
def built(docker_client: Any) -> dict[str, images.BuiltImage]:
    """Both images, reusing the engine's copy or the cached root tarball (cold build ~40 s)."""
    lines: list[str] = []
    out = {images.MINIMAL_IMAGE: images.build_minimal(lines.append, client=docker_client)}
    have_python = _present(docker_client, images.PYTHON_IMAGE) or (
        images.python_tarball_path().is_file()
    )
    if not have_python and (shutil.which("debootstrap") is None or os.geteuid() != 0):
        _unavailable(
            "the python kernel image is not built or cached, and building it needs root and "
            "debootstrap (apt-get install debootstrap)"
        )
    out[images.PYTHON_IMAGE] = images.build_python(lines.append, client=docker_client)
    assert lines, "progress was reported"
    return out


@pytest.fixture
def scope(docker_client: Any) -> Iterator[dict[str, str]]:
    """Labels for everything one test creates; all of it is removed afterwards."""
    labels = {TEST_LABEL: f"kernel-images-{uuid.uuid4().hex[:10]}"}
    yield labels
    flt = {"label": f"{TEST_LABEL}={labels[TEST_LABEL]}"}
    for c in docker_client.containers.list(all=True, filters=flt):
        try:
            c.remove(force=True)
        except Exception:  # noqa: BLE001,S110 - best-effort cleanup
            pass
    for n in docker_client.networks.list(filters=flt):
        try:
            n.remove()
        except Exception:  # noqa: BLE001,S110
            pass


def _network(docker_client: Any, labels: dict[str, str]) -> Any:
    name = f"bai-test-{labels[TEST_LABEL]}"
    return docker_client.networks.create(name, driver="bridge", internal=True, labels=labels)


def _kernel_kwargs(net: Any, hostname: str, labels: dict[str, str]) -> dict[str, Any]:
    """How the agent runs kernels: non-root, no capabilities, never privileged, internal net."""
    return {
        "hostname": hostname,
        "user": "1000:1000",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "network": net.name,
        "labels": labels,
        "detach": True,
    }


def _wait(container: Any, timeout: float = 30) -> tuple[int, str]:
    status = container.wait(timeout=timeout)
    return status["StatusCode"], container.logs().decode(errors="replace")


# --------------------------------------------------------------------------- engine tests


@pytest.mark.docker
def test_images_are_labelled(docker_client: Any, built: dict[str, images.BuiltImage]) -> None:
    mini, py = built[images.MINIMAL_IMAGE], built[images.PYTHON_IMAGE]
    assert _present(docker_client, images.MINIMAL_IMAGE)
    assert _present(docker_client, images.PYTHON_IMAGE)
    assert not _present(docker_client, "bai-kernel/does-not-exist:1")
    assert not mini.supports_ssh and py.supports_ssh
    assert mini.size_bytes < 5_000_000
    assert 50_000_000 < py.size_bytes < 500_000_000  # with Jupyter (Debian packages): ~354 MB
    labels = docker_client.images.get(images.PYTHON_IMAGE).labels
    assert labels[images.RECIPE_LABEL] == py.recipe_hash
    assert images.python_recipe_hash() in images.python_tarball_path().name
    # A second call finds the image in the engine and does nothing.
    again = images.build_python(client=docker_client)
    assert again.source == "engine" and again.built_from_cache and again.seconds < 5


@pytest.mark.docker
def test_minimal_runs_as_work_on_internal_network(
    docker_client: Any, built: dict[str, images.BuiltImage], scope: dict[str, str]
) -> None:
    net = _network(docker_client, scope)
    c = docker_client.containers.run(
        images.MINIMAL_IMAGE, ["sh", "-c", "id; hostname"], **_kernel_kwargs(net, "main1", scope)
    )
    code, logs = _wait(c)
    assert code == 0, logs
    assert "uid=1000(work) gid=1000(work)" in logs
    assert logs.strip().splitlines()[-1] == "main1"


@pytest.mark.docker
def test_python_image_has_python_and_ssh(
    docker_client: Any, built: dict[str, images.BuiltImage], scope: dict[str, str]
) -> None:
    net = _network(docker_client, scope)
    script = (
        "set -e; python3 -c 'import sys; print(sys.version_info[0])'; "
        "test -x /usr/sbin/sshd; command -v ssh; command -v ssh-keygen; command -v ip; "
        "command -v ps; ! ls /etc/ssh/ssh_host_* 2>/dev/null; echo HOME=$HOME; id -un"
    )
    c = docker_client.containers.run(
        images.PYTHON_IMAGE, ["sh", "-c", script], **_kernel_kwargs(net, "main1", scope)
    )
    code, logs = _wait(c)
    assert code == 0, logs
    lines = logs.split()
    assert lines[0] == "3" and "/usr/bin/ssh" in lines
    assert "HOME=/home/work" in lines and lines[-1] == "work"


# --------------------------------------------------------------------------- ssh between kernels

# What the agent's entrypoint does in a kernel of an SSH-capable image, as the kernel user.
SSHD_START = (
    "set -e; umask 077; mkdir -p /tmp/sshd; "
    "ssh-keygen -q -t ed25519 -N '' -f /tmp/sshd/ssh_host_ed25519_key; "
    f"exec /usr/sbin/sshd -D -e -p {SSH_PORT} -h /tmp/sshd/ssh_host_ed25519_key "
    "-o UsePAM=no -o PidFile=/tmp/sshd/sshd.pid "
    "-o PasswordAuthentication=no -o KbdInteractiveAuthentication=no "
    "-o PubkeyAuthentication=yes -o AuthorizedKeysFile=.ssh/authorized_keys "
    "-o SetEnv=BACKENDAI_CLUSTER_HOST={host}"
)
SSH_CLIENT_CONFIG = (
    f"Host *\n  Port {SSH_PORT}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
    "  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 5\n"
)


def _session_keypair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public + b" bai-session\n"


def _ssh_tar(private: bytes, public: bytes) -> bytes:
    """~/.ssh for the kernel user, ownership in the headers (no bind mount of host files)."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        entries = [
            (".ssh", None, 0o700),
            (".ssh/id_ed25519", private, 0o600),
            (".ssh/id_ed25519.pub", public, 0o644),
            (".ssh/authorized_keys", public, 0o600),
            (".ssh/config", SSH_CLIENT_CONFIG.encode(), 0o600),
        ]
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = 1000
            info.uname = info.gname = "work"
            info.mode, info.mtime = mode, now
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.docker
def test_ssh_between_two_python_kernels(
    docker_client: Any, built: dict[str, images.BuiltImage], scope: dict[str, str]
) -> None:
    net = _network(docker_client, scope)
    private, public = _session_keypair()
    keys = _ssh_tar(private, public)

    sub1 = docker_client.containers.create(
        images.PYTHON_IMAGE,
        ["sh", "-c", SSHD_START.format(host="sub1")],
        **_kernel_kwargs(net, "sub1", scope),
    )
    main1 = docker_client.containers.create(
        images.PYTHON_IMAGE, ["sleep", "infinity"], **_kernel_kwargs(net, "main1", scope)
    )
    for c in (sub1, main1):
        assert c.put_archive("/home/work", keys)
        c.start()

    deadline = time.monotonic() + 20
    while b"Server listening" not in sub1.logs():
        sub1.reload()
        assert sub1.status == "running", sub1.logs().decode(errors="replace")
        assert time.monotonic() < deadline, sub1.logs().decode(errors="replace")
        time.sleep(0.05)

    perms = main1.exec_run(
        ["stat", "-c", "%a %u:%g %n", "/home/work/.ssh", "/home/work/.ssh/authorized_keys"]
    )
    assert perms.output.decode().split("\n")[:2] == [
        "700 1000:1000 /home/work/.ssh",
        "600 1000:1000 /home/work/.ssh/authorized_keys",
    ]

    # The exact command of the brief, then the plain `ssh sub1` the session offers its users.
    cmd = f"ssh -p {SSH_PORT} -o StrictHostKeyChecking=no sub1 hostname"
    res = main1.exec_run(["sh", "-c", cmd])
    out = res.output.decode(errors="replace")
    assert res.exit_code == 0, out + sub1.logs().decode(errors="replace")
    assert out.strip().splitlines()[-1] == "sub1"

    res = main1.exec_run(["ssh", "sub1", "echo $(hostname) $(id -un) $BACKENDAI_CLUSTER_HOST"])
    out = res.output.decode(errors="replace")
    assert res.exit_code == 0, out
    assert out.strip() == "sub1 work sub1"


# --------------------------------------------------------------------------- the model image


@pytest.fixture(scope="module")
def sklearn_serve(docker_client: Any) -> images.BuiltImage:
    """The model image, from the engine or the cached root (a cold build takes ~90 s)."""
    have = _present(docker_client, images.SKLEARN_SERVE_IMAGE) or (
        images.python_tarball_path(spec=images.SKLEARN_SERVE_ROOT).is_file()
    )
    if not have and (shutil.which("debootstrap") is None or os.geteuid() != 0):
        _unavailable("the model image is not built or cached, and building it needs root")
    return images.build_sklearn_serve(client=docker_client)


def _address(container: Any) -> str:
    container.reload()
    return next(n["IPAddress"] for n in container.attrs["NetworkSettings"]["Networks"].values())


def _http_json(url: str, body: Any = None) -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - a test container
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.docker
def test_the_model_image_serves_iris_predictions_offline_on_a_read_only_root(
    docker_client: Any, sklearn_serve: images.BuiltImage, scope: dict[str, str]
) -> None:
    assert not sklearn_serve.supports_ssh
    labels = docker_client.images.get(images.SKLEARN_SERVE_IMAGE).labels
    assert labels[images.RECIPE_LABEL] == sklearn_serve.recipe_hash
    net = _network(docker_client, scope)  # internal: nothing could be downloaded
    c = docker_client.containers.run(
        images.SKLEARN_SERVE_IMAGE,
        ["sh", "-c", images.SKLEARN_SERVE_COMMAND],
        read_only=True,
        tmpfs={"/tmp": "rw,size=16m"},
        environment={"BACKENDAI_SESSION_ID": "replica-a"},
        **_kernel_kwargs(net, "main1", scope),
    )
    base = f"http://{_address(c)}:{images.SKLEARN_SERVE_PORT}"
    deadline = time.monotonic() + 60
    while True:
        try:
            status, health = _http_json(f"{base}/health")
            break
        except OSError:
            c.reload()
            assert c.status == "running", c.logs().decode(errors="replace")
            assert time.monotonic() < deadline, c.logs().decode(errors="replace")
            time.sleep(0.2)
    assert status == 200 and health["status"] == "ok"
    instances = [[5.1, 3.5, 1.4, 0.2], [5.9, 3.0, 4.2, 1.5], [6.7, 3.0, 5.2, 2.3]]
    status, answer = _http_json(f"{base}/predict", {"instances": instances})
    assert status == 200, answer
    assert answer == {"predictions": ["setosa", "versicolor", "virginica"], "replica": "replica-a"}
    status, _ = _http_json(f"{base}/predict", {"instances": [[5.1, 3.5]]})
    assert status == 422
