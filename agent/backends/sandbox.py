"""The namespaces a process kernel runs in: Debian's bubblewrap (``bwrap``) and util-linux.

Each session gets one network namespace of its own, made by ``unshare --net=FILE`` and
kept by that bind-mounted file (``<work-dir>/.netns/<session_id>``), with only its own
loopback up: its kernels (``main1``, ``sub1``…) talk to each other on 127.0.0.1 and reach
nothing of the host's (not its Redis, PostgreSQL or daphne on loopback, not the
network). Each kernel then runs under ``nsenter --net=FILE`` (as its own uid) and
``bwrap``, with its own mount, PID, IPC and UTS namespaces: it sees ``/usr`` and ``/etc``
read-only, a fresh ``/proc``, ``/dev`` and ``/tmp``, its home, its data folders, and
nothing else of the host (no other session's files, no ``/run``, no other home).

What the agent starts later in a running kernel (code runner, shell, app) enters the
kernel's namespaces with ``nsenter --target`` (the sandbox's first process, as
``bwrap --info-fd`` names it). The agent reaches a kernel's service port with a
socket made inside the session's network namespace (:func:`socket_in_netns`), so a
port of a session is that session's port alone: no port of a kernel is ever on the
host's loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNET = 0x40000000
MNT_DETACH = 2
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
INFO_TIMEOUT = 10.0  # how long bwrap may take to set a sandbox up
TOOLS = {"bwrap": "bubblewrap", "nsenter": "util-linux", "unshare": "util-linux"}
# Top-level paths of the host a kernel sees read-only (a symlink stays a symlink).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# Runs first in every process the agent starts in a kernel: into its home, then the command.
ENTER_HOME = 'cd -- "$1" || exit 1; shift; exec "$@"'

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    """A sandbox could not be made; the message is shown to the user."""


def problem() -> str | None:
    """Why this agent cannot run isolated process kernels, or None when it can."""
    if os.geteuid() != 0:
        return (
            "process kernels run isolated in namespaces of their own (bubblewrap), which needs"
            " an agent running as root: run the agent as root, or use a Docker agent"
        )
    missing = [f"{tool} ({pkg})" for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        return (
            "process kernels run isolated with bubblewrap, and this node lacks "
            + ", ".join(missing)
            + ": install the Debian package (apt-get install bubblewrap), or use a Docker agent"
        )
    return None


# --- the session's network namespace ----------------------------------------------


def is_netns(path: Path) -> bool:
    """Whether ``path`` holds a namespace (a bind mount: another device than its folder)."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except OSError:
        return False


_netns_lock = threading.Lock()


def ensure_netns(path: Path) -> Path:
    """The network namespace kept at ``path``, made (loopback up) when there is none."""
    with _netns_lock:
        if is_netns(path):
            return path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        done = subprocess.run(
            ["unshare", f"--net={path}", "true"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SandboxError(errno.EPERM, f"cannot make a network namespace: {done.stderr}")
        with socket_in_netns(path, socket.AF_INET, socket.SOCK_DGRAM) as sock:
            name = struct.pack("16sh", b"lo", 0)
            flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, name))[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
        return path


def remove_netns(path: Path) -> None:
    """Let the namespace at ``path`` go (it ends once no process is in it)."""
    with _netns_lock:
        if is_netns(path):
            _libc.umount2(os.fsencode(path), MNT_DETACH)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def socket_in_netns(
    path: Path, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
) -> socket.socket:
    """A socket of the network namespace at ``path``: made on a thread of its own that
    enters the namespace and then ends, so no other thread of the agent ever leaves
    the host's. A socket keeps its namespace for life (its connects, its ioctls)."""
    result: dict[str, object] = {}

    def enter() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"cannot enter the session's network: {os.strerror(code)}")
            finally:
                os.close(fd)
            result["sock"] = socket.socket(family, kind)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=enter, name="netns-socket", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


# --- the kernel's own namespaces ------------------------------------------------------


def _as_user(uid: int | None, gid: int | None) -> list[str]:
    if uid is None or uid == os.geteuid():
        return []
    return ["--setuid", str(uid), "--setgid", str(gid if gid is not None else uid)]


def _system_binds() -> list[str]:
    args: list[str] = []
    for top in SYSTEM_PATHS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def open_binds(writable: Iterable[Path], readable: Iterable[Path]) -> list[tuple[int, Path, bool]]:
    """Each path opened by the agent (``O_PATH``), to be bound at its own path in a
    sandbox: bwrap, running as the kernel's uid, needs no right on the way to it."""
    binds: list[tuple[int, Path, bool]] = []
    try:
        for paths, rw in ((writable, True), (readable, False)):
            for path in paths:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                binds.append((fd, Path(path), rw))
    except OSError:
        close_binds(binds)
        raise
    return binds


def close_binds(binds: Iterable[tuple[int, Path, bool]]) -> None:
    for fd, _, _ in binds:
        os.close(fd)


def kernel_argv(
    *,
    netns: Path,
    uid: int | None,
    gid: int | None,
    hostname: str,
    home: Path,
    binds: Iterable[tuple[int, Path, bool]],
    info_fd: int,
    command: list[str],
) -> list[str]:
    """The command line of a kernel's first process: in the session's network, as the
    kernel's uid, in a bubblewrap sandbox that shows the system read-only and each of
    ``binds`` (from :func:`open_binds`: the home, the data folders…) at its own path."""
    argv = ["nsenter", f"--net={netns}", *_as_user(uid, gid), "--", "bwrap"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--hostname", hostname, *_system_binds()]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for fd, path, rw in binds:  # bwrap closes each fd once bound
        argv += ["--bind-fd" if rw else "--ro-bind-fd", str(fd), str(path)]
    argv += ["--chdir", str(home), "--info-fd", str(info_fd), "--", *command]
    return argv


def read_sandbox_pid(fd: int) -> int:
    """The pid (on the host) of a sandbox's first process, from bwrap's ``--info-fd``;
    closes ``fd``."""
    data = b""
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], INFO_TIMEOUT)
            if not ready:
                raise SandboxError(errno.ETIMEDOUT, "the kernel's sandbox did not start in time")
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(data)["child-pid"])
    finally:
        os.close(fd)
    raise SandboxError(errno.ESRCH, "the kernel's sandbox did not start (see its log)")


def enter_argv(
    sandbox_pid: int, uid: int | None, gid: int | None, home: str, command: list[str]
) -> list[str]:
    """A command line that runs ``command`` inside a running kernel (its mount, PID,
    network, IPC and UTS namespaces), as the kernel's uid, in its home."""
    return [
        "nsenter",
        f"--target={sandbox_pid}",
        "--mount",
        "--pid",
        "--net",
        "--ipc",
        "--uts",
        "--root",
        *_as_user(uid, gid),
        "--",
        "/bin/sh",
        "-c",
        ENTER_HOME,
        "backendai-enter",
        home,
        *command,
    ]
