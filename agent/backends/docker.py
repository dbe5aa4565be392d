"""Kernels as Docker containers.

One internal bridge network per session (per engine) joins the session's containers;
each container is named ``bai-<kernel_id>``, has the spec's hostname as hostname and
network alias, runs as ``1000:1000`` with every capability dropped and
``no-new-privileges``, always with a CPU, memory, pids and open-files limit, on a
read-only root. It writes only to its home (a per-kernel directory of the agent,
``<work-dir>/homes/<kernel_id>``, mounted at ``/home/work``), to ``/tmp`` (a tmpfs
capped at ``--kernel-tmp-size`` or half its memory) and to the session's data folders
mounted inside the home. The agent writes the env file and the session's SSH keys
into the home before the container exists, so no secret shows in ``docker inspect``;
a small POSIX-sh runner passed inline as the entrypoint starts sshd and the command.

Blocking SDK calls run in a thread pool; the engine's event stream runs in its own
thread; followed logs are read on the loop through aiodocker (the container's attach
stream: the engine's blocks as they come, not a frame per line); terminal sockets are
read with the loop's ``add_reader``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiodocker
import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount, Ulimit

from agent import protocol
from agent.backends.base import (
    PIDS_LIMIT,
    Backend,
    KernelError,
    KernelState,
    LiveOutput,
    SocketChannel,
    TermChannel,
    chunked_text,
    nofile_limit,
    nosuid_mount,
    prepare_host_folder,
    render_env_file,
    render_ssh_environment,
    runner_argv,
    trim_tail,
    unmount,
)
from agent.publish import PublishedPort
from bai_common import names
from bai_common.sshkeys import fingerprint

log = logging.getLogger(__name__)

L_SESSION = "ai.backend.session_id"
L_KERNEL = "ai.backend.kernel_id"
L_HOST = "ai.backend.hostname"
L_AGENT = "ai.backend.agent"
L_AGENT_KEY = "ai.backend.agent-key"  # fingerprint of the agent's token (see AgentConfig)
L_NETWORK = "ai.backend.network"
L_MANAGED = "ai.backend.managed"
L_SFTP = "ai.backend.sftp"  # "true" on an SFTP kernel: its port is published again on adoption

KERNEL_UID = 1000
KERNEL_GID = 1000
HOME = "/home/work"
SSH_PORT = 2200
SFTP_START_TIMEOUT = 30.0  # how long an SFTP kernel's server may take to listen
SFTP_HOST_KEY = ".backendai/sftp_host_key"
SFTP_SERVER_SOURCE = Path(__file__).resolve().parents[1] / "sftp_server.py"
NAMES_SOURCE = Path(names.__file__)
# The SFTP kernel's command, run by the RUNNER: it runs sshd with SFTP and SCP only (see
# agent/sftp_server.py; Debian's asyncssh warns of deprecated ciphers on import: -W ignore
# keeps the log for what matters).
SFTP_COMMAND = f"exec python3 -W ignore -u {HOME}/.backendai/sftp_server.py"
NETWORK_LOCK_PATH = os.path.join(tempfile.gettempdir(), "backendai-agent-networks.lock")

# The kernel runner, passed inline as ``sh -c RUNNER bai-runner [startup command]``.
# Everything it needs (the env file, the session's SSH keys and configs) is
# already in the kernel's home, written there by the agent before the container
# was created: no secret travels in the container's environment, command or
# labels, so ``docker inspect`` shows none.
RUNNER = f"""\
B="$HOME/.backendai"
if [ -d /etc/skel ]; then cp -Rn /etc/skel/. "$HOME/" 2>/dev/null; fi
if [ -f "$B/sshd_config" ] && [ -x /usr/sbin/sshd ]; then
  if [ ! -f "$B/ssh_host_ed25519_key" ]; then
    ssh-keygen -q -t ed25519 -N '' -f "$B/ssh_host_ed25519_key" >/dev/null 2>&1 \\
      || echo "backend.ai: ssh-keygen failed" >&2
  fi
  /usr/sbin/sshd -f "$B/sshd_config" -p {SSH_PORT} -E "$B/sshd.log" \\
    || echo "backend.ai: sshd did not start (see $B/sshd.log)" >&2
fi
if [ $# -gt 0 ]; then
  exec /bin/sh -c "$1"
fi
trap 'exit 0' TERM INT
while :; do sleep 2147483647 & wait $!; done
"""

SSHD_CONFIG = f"""\
# sshd for the kernel user, on a high port, key-only (written by the agent)
ListenAddress 0.0.0.0
HostKey {HOME}/.backendai/ssh_host_ed25519_key
PidFile {HOME}/.backendai/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AuthorizedKeysFile .ssh/authorized_keys
PermitUserEnvironment yes
PrintMotd no
X11Forwarding no
Subsystem sftp internal-sftp
"""

SSH_CLIENT_CONFIG = f"""\
Host main* sub*
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  Port {SSH_PORT}
  User work
  LogLevel ERROR
  IdentityFile ~/.ssh/id_session
"""

# $0 is where the shell writes its pid, so that closing the terminal can hang it up.
SHELL_SCRIPT = 'echo $$ > "$0"; if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l'


def write_kernel_home(
    home: Path,
    env: dict[str, str],
    ssh: dict[str, str] | None,
    uid: int = KERNEL_UID,
    gid: int = KERNEL_GID,
    *,
    authorized_keys: list[str] | tuple[str, ...] = (),
    extra_files: dict[str, str] | None = None,
    sshd: bool = True,
) -> None:
    """Lay out a kernel's home before its container exists: the env file and,
    with a session key pair, ``~/.ssh`` and the sshd config. Directories 0700,
    files 0600, all owned by the kernel user (when the agent may hand them over):
    ssh and sshd refuse keys that others can read or that the user does not own.
    ``authorized_keys`` may log in beside the session's own key; ``extra_files``
    (relative to the home, under ``.backendai/``) are written alike. ``sshd=False``: no
    sshd config, so the runner starts no sshd (an SFTP kernel runs its own).
    """
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = {".backendai_env": render_env_file(env), **(extra_files or {})}
    dirs = [home, home / ".backendai"]
    dirs += sorted({(home / name).parent for name in files} - {home, *dirs})
    if ssh:
        public = ssh["public_key"].rstrip("\n") + "\n"
        allowed = public + "".join(key.strip() + "\n" for key in authorized_keys)
        files.update(
            {
                ".ssh/id_session": ssh["private_key"].rstrip("\n") + "\n",
                ".ssh/id_session.pub": public,
                ".ssh/authorized_keys": allowed,
                ".ssh/config": SSH_CLIENT_CONFIG,
                ".ssh/environment": render_ssh_environment(env),
            }
        )
        if sshd:
            files[".backendai/sshd_config"] = SSHD_CONFIG
        dirs.append(home / ".ssh")
    for d in dirs:
        d.mkdir(mode=0o700, exist_ok=True)
    for name, text in files.items():
        path = home / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    if os.geteuid() == 0:
        for path in [*dirs, *(home / name for name in files)]:
            os.lchown(path, uid, gid)


def new_host_key() -> tuple[str, str, str]:
    """A fresh ed25519 key: (private key in OpenSSH format, public key line, fingerprint)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public.decode(), fingerprint(base64.b64decode(public.split()[1]))


def host_key_fingerprint(private_pem: bytes) -> str:
    """The fingerprint of an OpenSSH private key's public half."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_pem, password=None)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return fingerprint(base64.b64decode(public.split()[1]))


def sftp_files(kspec: dict[str, Any]) -> tuple[dict[str, str], str]:
    """An SFTP kernel's files for its home (its server, the server's configuration and a
    fresh host key), and the host key's fingerprint."""
    sftp = kspec["sftp"]
    private, _, fingerprint = new_host_key()
    config = {
        "port": protocol.SFTP_PORT,
        "host_key": f"{HOME}/{SFTP_HOST_KEY}",
        "authorized_keys": f"{HOME}/.ssh/authorized_keys",
        "folders": [
            {"name": m["name"], "readonly": bool(m.get("readonly"))}
            for m in kspec.get("mounts") or []
        ],
        "quotas": sftp.get("quotas") or [],
    }
    files = {
        SFTP_HOST_KEY: private,
        ".backendai/sftp.json": json.dumps(config, indent=1) + "\n",
        ".backendai/sftp_server.py": SFTP_SERVER_SOURCE.read_text(),
        # What the server imports of the project: the rule for names.
        ".backendai/bai_common/__init__.py": "",
        ".backendai/bai_common/names.py": NAMES_SOURCE.read_text(),
    }
    return files, fingerprint


class Demuxer:
    """Incremental decoder of Docker's multiplexed stdout/stderr stream (8-byte headers)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        buf = self.buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        unpack = _FRAME_LEN.unpack_from
        while end - pos >= 8:
            (length,) = unpack(buf, pos + 4)
            stop = pos + 8 + length
            if stop > end:
                break
            out.append(buf[pos + 8 : stop])
            pos = stop
        del buf[:pos]
        return b"".join(out)


_FRAME_LEN = struct.Struct(">I")


def network_driver(swarm: dict[str, Any], cluster_mode: str) -> str:
    """The network a session's kernels share on this engine.

    A multi-node session on an engine that is part of a swarm gets an attachable
    overlay, so kernels on the other hosts join the same network; otherwise all
    its kernels here share a local bridge (agents on one engine share it too).
    Both are internal: no route out.
    """
    in_swarm = swarm.get("LocalNodeState") == "active"
    return "overlay" if in_swarm and cluster_mode == "multi-node" else "bridge"


def swarm_manager(swarm: dict[str, Any]) -> bool:
    """Whether this engine may create and remove swarm (overlay) networks.

    A worker cannot: it only attaches containers to an overlay by name, and the
    engine fetches the network from the managers when the container starts.
    """
    return swarm.get("LocalNodeState") == "active" and bool(swarm.get("ControlAvailable"))


# Removing an overlay fails while a container on another engine is still on it
# (or while the swarm still holds the attachment of one just removed): the agents
# of the session's last kernels retry for this long, and the last one out wins.
OVERLAY_REMOVE_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# How long the other agents of a multi-node session wait for main1's agent to
# create its overlay (it may still be loading the image).
OVERLAY_WAIT = 120.0


def network_name(spec: dict[str, Any]) -> str:
    return spec.get("network") or f"bai-{spec['session_id']}"


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, config, emit=None, *, client: docker.DockerClient | None = None) -> None:
        super().__init__(config, emit)
        self.client = client or docker.from_env(timeout=60)
        self.api = self.client.api
        self.agent_key = config.agent_key
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="docker-call")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._events_thread: threading.Thread | None = None
        self._events_stream: Any = None
        self._events_ready = threading.Event()
        self._net_locks: dict[str, asyncio.Lock] = {}
        self._images_seen: set[str] = set()
        self._swarm_info: dict[str, Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._mounted_root = False
        self._aio: aiodocker.Docker | None = None

    def home_dir(self, kernel_id: str) -> Path:
        """The host directory mounted as a kernel's writable home."""
        if not kernel_id or "/" in kernel_id or kernel_id in (".", ".."):
            raise KernelError(f"bad kernel id {kernel_id!r}")
        return Path(self.config.work_dir) / "homes" / kernel_id

    async def _remove_home(self, kernel_id: str) -> None:
        with contextlib.suppress(KernelError):
            await self._call(shutil.rmtree, self.home_dir(kernel_id), ignore_errors=True)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- start-up: events first, then adopt what already runs --------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        homes = Path(self.config.work_dir) / "homes"
        homes.mkdir(parents=True, exist_ok=True)
        homes.chmod(0o700)  # kernel homes hold the sessions' private keys
        if os.geteuid() not in (0, KERNEL_UID):
            log.warning(
                "the agent runs as uid %s, neither root nor the kernel uid %s: it cannot hand"
                " kernels their home directories, and kernels will not be able to write there",
                os.geteuid(),
                KERNEL_UID,
            )
        await self._nosuid_data_root()
        self._events_thread = threading.Thread(
            target=self._events_main, name="docker-events", daemon=True
        )
        self._events_thread.start()
        # Subscribe before listing, so that no exit falls between the two.
        await self._call(self._events_ready.wait, 30)
        await self._adopt_all()

    async def _nosuid_data_root(self) -> None:
        """Data folders are bound from a ``nosuid,nodev`` mount (``nosuid_mount``): rw binds
        keep those flags in the kernel. (The engine's remount of a read-only bind drops
        them; nothing can be written there from the kernel, and no kernel gains privileges
        from a set-user-ID file anyway: no-new-privileges, every capability dropped.)"""
        root = self.config.data_root
        if root is None:
            log.warning("no --data-root: data folders are bound without nosuid,nodev")
            return
        try:
            self._mounted_root = await self._call(nosuid_mount, Path(root))
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            log.warning(
                "cannot make the data root %s nosuid,nodev (%s %s): run the agent as root",
                root,
                exc,
                detail.decode(errors="replace").strip(),
            )
            return
        if self._mounted_root:
            log.info("data root %s mounted nosuid,nodev", root)

    async def _adopt_all(self) -> None:
        containers = await self._call(
            self.api.containers, all=True, filters={"label": f"{L_AGENT_KEY}={self.agent_key}"}
        )
        for c in containers:
            labels = c.get("Labels") or {}
            kernel_id = labels.get(L_KERNEL)
            if not kernel_id or kernel_id in self.kernels:
                continue
            state = KernelState(
                kernel_id, labels.get(L_SESSION, ""), labels.get(L_HOST, ""), container_id=c["Id"]
            )
            state.extra["network"] = labels.get(L_NETWORK) or f"bai-{state.session_id}"
            self.kernels[kernel_id] = state
            if c["State"] == "running":
                state.status = protocol.KR_RUNNING
                log.info("adopted running kernel %s (container %s)", kernel_id, c["Id"][:12])
                if labels.get(L_SFTP) == "true":
                    self._spawn(self._republish(state))
            elif c["State"] in ("exited", "dead"):
                self._spawn(self._container_ended(state))
            else:
                state.status = protocol.KR_ERROR
                state.reason = f"container was left in state {c['State']!r} by an earlier agent"

    def _events_main(self) -> None:
        backoff = 0.5
        first = True
        while not self._closing:
            try:
                stream = self.client.events(
                    decode=True,
                    filters={
                        "type": "container",
                        "label": [f"{L_AGENT_KEY}={self.agent_key}"],
                        "event": ["die", "destroy"],
                    },
                )
                self._events_stream = stream
                self._events_ready.set()
                if not first:
                    self._threadsafe(self._resync)
                first = False
                backoff = 0.5
                for event in stream:
                    self._threadsafe(self._on_event, event)
            except Exception as exc:  # noqa: BLE001 - the engine went away; retry
                if self._closing:
                    return
                log.warning("docker event stream failed (%s); retrying in %.1f s", exc, backoff)
            if self._closing:
                return
            time.sleep(backoff)
            backoff = min(10.0, backoff * 2)

    def _threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn, *args)

    def _on_event(self, event: dict[str, Any]) -> None:
        attrs = (event.get("Actor") or {}).get("Attributes") or {}
        state = self.kernels.get(attrs.get(L_KERNEL, ""))
        if state is None:
            return
        action = event.get("Action") or event.get("status")
        if action == "die":
            self._spawn(self._container_ended(state))
        elif action == "destroy" and not state.destroying:
            self._spawn(self._container_vanished(state))

    def _resync(self) -> None:
        """After the event stream broke: re-read every known container's state."""
        for state in list(self.kernels.values()):
            if state.status == protocol.KR_RUNNING:
                self._spawn(self._check_running(state))

    async def _check_running(self, state: KernelState) -> None:
        try:
            info = await self._call(self.api.inspect_container, state.container_id)
        except NotFound:
            await self._container_vanished(state)
            return
        if not info["State"]["Running"]:
            await self._container_ended(state)

    async def _container_ended(self, state: KernelState) -> None:
        async with state.lock:  # after create has reported "running"; never during destroy
            if state.destroying or state.status in (protocol.KR_EXITED, protocol.KR_GONE):
                return
            try:
                info = await self._call(self.api.inspect_container, state.container_id)
            except NotFound:
                return
            st = info["State"]
            if st.get("Running"):
                return
            reason = "out of memory" if st.get("OOMKilled") else None
            await self._unpublish(state)
            tail = await self._read_tail(state.container_id)
            self.set_status(state, protocol.KR_EXITED, exit_code=st.get("ExitCode"), reason=reason)
            self.keep_tail(state, tail)

    async def _container_vanished(self, state: KernelState) -> None:
        async with state.lock:
            if state.destroying or state.status in (protocol.KR_GONE, protocol.KR_ERROR):
                return  # an error's container is removed by _fail; the error report stands
            await self._unpublish(state)
            self.set_status(state, protocol.KR_GONE, reason="container removed outside the agent")
            self.bury(state.kernel_id)
            await self._remove_home(state.kernel_id)

    async def _read_tail(self, container_id: str | None) -> str:
        if not container_id:
            return ""
        limit = self.config.log_tail_bytes
        try:
            # Docker's tail counts lines; ask for enough lines, then cut to bytes.
            data = await self._log_bytes(container_id, max(64, limit // 8))
        except KernelError as exc:
            log.warning("%s", exc)
            return ""
        return trim_tail(data, limit)

    async def close(self) -> None:
        self._closing = True
        await super().close()
        for state in list(self.kernels.values()):
            await self._unpublish(state)
        stream = self._events_stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        for task in list(self._tasks):
            task.cancel()
        if self._aio is not None:
            await self._aio.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._mounted_root and self.config.data_root is not None:
            unmount(Path(self.config.data_root))

    # --- create -------------------------------------------------------------------------

    async def _create_one(self, spec: dict[str, Any], kspec: dict[str, Any]) -> None:
        state = self.claim_kernel(spec, kspec)
        if state is None:
            return
        kernel_id = state.kernel_id
        state.extra["network"] = network_name(spec)
        state.extra["cluster_mode"] = spec.get("cluster_mode") or ""
        # main1's agent makes a multi-node session's overlay; the others attach to it.
        state.extra["network_owner"] = kspec.get("role") == "main"
        async with state.lock:
            self.report(state.report())
            started = time.monotonic()
            try:
                await self._create_container(state, spec, kspec)
            except KernelError as exc:
                await self._fail(state, str(exc))
            except (DockerException, OSError) as exc:
                if isinstance(exc, ImageNotFound):
                    self._images_seen.discard(kspec.get("image"))
                explanation = getattr(exc, "explanation", None) or str(exc)
                await self._fail(state, f"docker: {explanation}")
            else:
                log.info("kernel %s started in %.3f s", kernel_id, time.monotonic() - started)

    async def _fail(self, state: KernelState, reason: str) -> None:
        await self._unpublish(state)
        self.set_status(state, protocol.KR_ERROR, reason=reason)
        if state.container_id:
            with contextlib.suppress(DockerException):
                await self._call(self.api.remove_container, state.container_id, force=True)
            state.container_id = None
        await self._remove_home(state.kernel_id)
        await self._remove_network_if_unused(state)

    async def _ensure_image(self, state: KernelState, image: str) -> None:
        if image in self._images_seen:
            return  # seen here before; a create that finds it gone fails with the reason
        try:
            await self._call(self.api.inspect_image, image)
            self._images_seen.add(image)
            return
        except ImageNotFound:
            pass
        if not self.config.pull:
            raise KernelError(
                f"image {image} is not present on agent {self.agent_id or self.config.hostname}"
                " and pulling is disabled"
            )
        self.set_status(state, protocol.KR_PULLING)
        repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
        try:
            await self._call(self.client.images.pull, repo, tag=tag or "latest")
        except DockerException as exc:
            raise KernelError(f"cannot pull image {image}: {exc}") from exc
        self.set_status(state, protocol.KR_PREPARING)

    async def _create_container(
        self, state: KernelState, spec: dict[str, Any], kspec: dict[str, Any]
    ) -> None:
        mounts = await self._data_mounts(kspec)
        await self._ensure_image(state, kspec["image"])
        env = {str(k): str(v) for k, v in (kspec.get("env") or {}).items()}
        home = self.home_dir(state.kernel_id)
        sftp = kspec.get("sftp")
        files, fingerprint = await self._call(sftp_files, kspec) if sftp else ({}, "")
        if sftp and not spec.get("ssh"):
            raise KernelError("an SFTP session needs its session key pair")
        await self._call(
            write_kernel_home,
            home,
            env,
            spec.get("ssh"),
            authorized_keys=(sftp or {}).get("authorized_keys") or (),
            extra_files=files,
            sshd=not sftp,
        )
        # The home first: the engine mounts by depth, so the data folders land inside it.
        mounts.insert(0, Mount(target=HOME, source=str(home), type="bind"))
        # A kernel alone in its session talks to no peer: no network at all
        # (no route out either), and no network to create or remove.
        # A kernel with service ports gets its session network even alone: the host
        # reaches the container at its address on that internal bridge (the app proxy's path).
        # An SFTP kernel too: the agent publishes its server's port from there.
        alone = (
            len(kspec.get("cluster_hosts") or [state.hostname]) <= 1
            and not kspec.get("service_ports")
            and not sftp
        )
        network_id = "none" if alone else await self._ensure_network(state)
        try:
            kwargs = self._container_config(state, kspec, env, mounts, network_id)
            state.container_id = await self._call(self._create_or_replace, state, kwargs)
        except NotFound as exc:
            if "network" not in str(exc).lower():
                raise
            # Another agent removed the session's network between our lookup and create.
            network_id = await self._ensure_network(state)
            kwargs = self._container_config(state, kspec, env, mounts, network_id)
            state.container_id = await self._call(self._create_or_replace, state, kwargs)
        await self._call(self.api.start, state.container_id)
        if sftp:
            await self._publish(state, fingerprint, wait=SFTP_START_TIMEOUT)
        self.set_status(state, protocol.KR_RUNNING, container_id=state.container_id)

    # --- published ports (SFTP sessions) ------------------------------------------------

    async def _publish(self, state: KernelState, fingerprint: str, wait: float) -> None:
        """Publish the kernel's SFTP port on the agent's public address (agent/publish.py)
        once its server listens; KernelError with the kernel's log when it never does."""
        address = await self._container_address(state)
        published = PublishedPort(
            self.config.public_address,
            self.config.advertised_host,
            (address, protocol.SFTP_PORT),
            changed=lambda: self._published_changed(state),
        )
        published.host_key_fingerprint = fingerprint
        if not await published.wait_target(wait):
            tail = (await self._read_tail(state.container_id))[-300:]
            raise KernelError(f"the SFTP server did not start within {wait:.0f} s: {tail}")
        try:
            await published.start()
        except OSError as exc:
            raise KernelError(
                f"cannot publish the SFTP port on {self.config.public_address}: {exc}"
            ) from exc
        state.extra["published"] = published

    def _published_changed(self, state: KernelState) -> None:
        # A connection opened or ended: the manager counts it as the session's activity.
        if state.status == protocol.KR_RUNNING and not state.destroying:
            self.report(state.report())

    async def _unpublish(self, state: KernelState) -> None:
        published = state.extra.pop("published", None)
        if published is not None:
            await published.close()

    async def _republish(self, state: KernelState) -> None:
        """An adopted SFTP kernel: its port again (the old listener died with the old agent)."""
        async with state.lock:
            try:
                key = (self.home_dir(state.kernel_id) / SFTP_HOST_KEY).read_bytes()
                await self._publish(state, host_key_fingerprint(key), wait=5)
            except (KernelError, OSError, ValueError) as exc:
                log.warning("adopted SFTP kernel %s not published: %s", state.kernel_id, exc)
                return
            self.report(state.report())

    async def _data_mounts(self, kspec: dict[str, Any]) -> list[Mount]:
        """The session's data folders under the home, each checked against the data root;
        a read-only share is bound read-only, so a write inside the container fails (EROFS)."""
        mounts = []
        for mount in kspec.get("mounts") or []:
            name = mount["name"]
            if not name or "/" in name or name in (".", ".."):
                raise KernelError(f"bad data folder name {name!r}")
            path = self.check_mount(mount["host_path"])
            await self._call(prepare_host_folder, path, KERNEL_UID, KERNEL_GID)
            mounts.append(
                Mount(
                    target=f"{HOME}/{name}",
                    source=str(path),
                    type="bind",
                    read_only=mount.get("readonly") is True,
                )
            )
        return mounts

    def _container_config(
        self,
        state: KernelState,
        kspec: dict[str, Any],
        env: dict[str, str],
        mounts: list[Mount],
        network_id: str,
    ) -> dict[str, Any]:
        """The engine's create arguments: limits always set, a read-only root, no privileges."""
        limits = self.limits_for(state, kspec.get("slots") or {})
        tmp_size = min(self.config.kernel_tmp_size, limits.mem // 2)
        nofile = nofile_limit()
        alone = network_id == "none"
        host_config = self.api.create_host_config(
            network_mode=network_id,
            nano_cpus=int(limits.cpu * Decimal(10**9)),
            mem_limit=limits.mem,
            memswap_limit=limits.mem,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            privileged=False,
            pids_limit=PIDS_LIMIT,
            ulimits=[Ulimit(name="nofile", soft=nofile, hard=nofile)],
            read_only=True,
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={tmp_size},mode=1777"},
            mounts=mounts,
        )
        endpoint = {network_id: self.api.create_endpoint_config(aliases=[state.hostname])}
        labels = {
            L_SESSION: state.session_id,
            L_KERNEL: state.kernel_id,
            L_HOST: state.hostname,
            L_AGENT: self.agent_id or "",
            L_AGENT_KEY: self.agent_key,
            L_NETWORK: state.extra["network"],
            L_MANAGED: "true",
        }
        if kspec.get("sftp"):
            labels[L_SFTP] = "true"
        command = SFTP_COMMAND if kspec.get("sftp") else kspec.get("startup_command")
        return dict(
            image=kspec["image"],
            command=[command] if command else [],
            entrypoint=["/bin/sh", "-c", RUNNER, "bai-runner"],
            hostname=state.hostname,
            user=f"{KERNEL_UID}:{KERNEL_GID}",
            environment=env,
            labels=labels,
            name=f"bai-{state.kernel_id}",
            working_dir=HOME,
            host_config=host_config,
            networking_config=None if alone else self.api.create_networking_config(endpoint),
            detach=True,
        )

    def _create_or_replace(self, state: KernelState, kwargs: dict[str, Any]) -> str:
        try:
            return str(self.api.create_container(**kwargs)["Id"])
        except APIError as exc:
            if exc.status_code != 409:
                raise
        # A container of that name is left from an interrupted create: replace it.
        log.warning("replacing stale container bai-%s", state.kernel_id)
        self.api.remove_container(f"bai-{state.kernel_id}", force=True)
        return str(self.api.create_container(**kwargs)["Id"])

    # --- networks -----------------------------------------------------------------------

    async def _ensure_network(self, state: KernelState) -> str:
        name = state.extra["network"]
        lock = self._net_locks.setdefault(name, asyncio.Lock())
        deadline = time.monotonic() + OVERLAY_WAIT
        delay = 0.05
        while True:
            async with lock:  # kernels of one session on this agent: one lookup, one create
                network = await self._call(
                    self._ensure_network_sync,
                    name,
                    state.session_id,
                    state.extra.get("cluster_mode", ""),
                    bool(state.extra.get("network_owner")),
                )
            if network is not None:
                return network
            if time.monotonic() > deadline:
                raise KernelError(
                    f"overlay network {name} did not appear in {OVERLAY_WAIT:.0f} s"
                    " (main1's agent makes it)"
                )
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    def _networks_named(self, name: str) -> list[dict[str, Any]]:
        # The engine's name filter matches substrings; keep exact matches only.
        return [n for n in self.api.networks(names=[name]) if n["Name"] == name]

    def _ensure_network_sync(
        self, name: str, session_id: str, cluster_mode: str = "", owner: bool = True
    ) -> str | None:
        # Agents sharing one engine run on one host: a host-wide lock around
        # look-up-then-create keeps them from making twins (the engine's own
        # duplicate check is not atomic, and it resolves networks by name when
        # a container starts, so a twin makes starts fail).
        with open(NETWORK_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                swarm = self._swarm() if cluster_mode == "multi-node" else {}
                if network_driver(swarm, cluster_mode) == "overlay":
                    return self._ensure_overlay(name, session_id, swarm, owner)
                return self._ensure_bridge(name, session_id)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _swarm(self) -> dict[str, Any]:
        # Read again each time a network is made: an engine may join or leave a
        # swarm while the agent runs (info is a few milliseconds).
        try:
            self._swarm_info = self.api.info().get("Swarm") or {}
        except DockerException:
            self._swarm_info = self._swarm_info or {}
        return self._swarm_info

    def _ensure_overlay(
        self, name: str, session_id: str, swarm: dict[str, Any], owner: bool
    ) -> str | None:
        """A multi-node session's overlay: its id, its name, or None while it is not there yet.

        Only main1's agent creates it. Managers of one swarm do not refuse a second
        overlay of the same name (each checks only its own view), so agents that
        all looked up and then created would make twins, each kernel on another.
        The other agents wait until it shows, then attach by its id.
        """
        if not swarm_manager(swarm):
            if owner:
                raise KernelError(
                    "main1 of a multi-node session runs on a swarm worker, which cannot create"
                    " the session's overlay network: make this engine a swarm manager"
                )
            # A worker sees a swarm network only once a container of its own is
            # on it: attach by name, and the engine asks the managers for it.
            return name
        nets = self._networks_named(name)
        if not nets and owner:
            self.api.create_network(
                name,
                driver="overlay",
                internal=True,
                attachable=True,
                check_duplicate=True,
                labels={L_SESSION: session_id, L_MANAGED: "true"},
            )
            log.info("created internal overlay network %s for session %s", name, session_id)
            nets = self._networks_named(name)
        if not nets:
            return None
        nets.sort(key=lambda n: (n.get("Created", ""), n["Id"]))
        chosen = nets[0]
        if chosen.get("Internal") is False or chosen.get("Driver") not in (None, "", "overlay"):
            raise KernelError(f"network {name} exists and is not an internal overlay; refusing it")
        return str(chosen["Id"])

    def _ensure_bridge(self, name: str, session_id: str) -> str:
        nets = self._networks_named(name)
        if not nets:
            try:
                self.api.create_network(
                    name,
                    driver="bridge",
                    internal=True,
                    check_duplicate=True,
                    labels={L_SESSION: session_id, L_MANAGED: "true"},
                )
                log.info("created internal bridge network %s for session %s", name, session_id)
            except APIError as exc:
                if exc.status_code != 409:  # another agent on this engine created it first
                    raise
            nets = self._networks_named(name)
        if not nets:
            raise KernelError(f"network {name} vanished while being created")
        # Two agents on one engine may both create a bridge (the engine's duplicate
        # check is not atomic). All agree on the oldest, and whoever sees a
        # younger twin removes it before any container joins it: the engine
        # resolves a container's networks by name when it starts, so twins
        # must not survive.
        nets.sort(key=lambda n: (n.get("Created", ""), n["Id"]))
        chosen = nets[0]
        for twin in nets[1:]:
            try:
                self.api.remove_network(twin["Id"])
                log.info("removed a duplicate network %s (%s)", name, twin["Id"][:12])
            except (NotFound, APIError):
                pass  # the other agent removed it already
        if not chosen.get("Internal"):
            raise KernelError(f"network {name} exists and is not internal; refusing to use it")
        return chosen["Id"]

    async def _remove_network_if_unused(self, state: KernelState) -> None:
        name = state.extra.get("network")
        if not name:
            return
        lock = self._net_locks.setdefault(name, asyncio.Lock())
        async with lock:
            busy = await self._call(self._remove_network_sync, name, state.session_id)
        if busy:
            self._spawn(self._remove_overlay_later(name, state.session_id))

    async def _remove_overlay_later(self, name: str, session_id: str) -> None:
        """Retry removing a session's overlay that other hosts' kernels still used.

        Every agent whose kernels of the session are gone retries a while: the
        session's last kernel may end on any host, and its agent's first try
        may still see the others' attachments.
        """
        for delay in OVERLAY_REMOVE_DELAYS:
            await asyncio.sleep(delay)
            lock = self._net_locks.setdefault(name, asyncio.Lock())
            async with lock:
                if not await self._call(self._remove_network_sync, name, session_id):
                    return
        log.info("overlay %s stays: kernels on other hosts still use it", name)

    def _remove_network_sync(self, name: str, session_id: str) -> bool:
        """Remove the session's network unless a container here still uses it.

        True when an overlay stays because of containers on other engines: worth
        another try once they are gone.
        """
        users = self.api.containers(all=True, filters={"label": f"{L_SESSION}={session_id}"})
        if users:
            return False
        busy = False
        for net in self._networks_named(name):
            try:
                self.api.remove_network(net["Id"])
                log.info("removed network %s of session %s", name, session_id)
            except NotFound:
                pass
            except APIError as exc:  # still used by another agent's containers
                log.info("network %s stays: %s", name, exc.explanation or exc)
                busy = busy or net.get("Driver") == "overlay"
        return busy

    # --- destroy ------------------------------------------------------------------------

    async def destroy_kernels(self, kernel_ids: list[str], reason: str) -> None:
        await asyncio.gather(*(self._destroy_one(k, reason) for k in kernel_ids))

    async def _destroy_one(self, kernel_id: str, reason: str) -> None:
        state = self.kernels.get(kernel_id)
        if state is None:
            await self._destroy_stray(kernel_id, reason)
            return
        async with state.lock:
            if state.status == protocol.KR_GONE:
                self.report(state.report())
                return
            state.destroying = True
            await self._unpublish(state)
            await self.terminals.close_kernel(kernel_id, "kernel destroyed")
            await self.execution.close_kernel(kernel_id)
            if state.container_id:
                cid = state.container_id
                with contextlib.suppress(NotFound):
                    await self._call(self.api.stop, cid, timeout=self.config.stop_timeout)
                if not state.tail_sent:
                    self.keep_tail(state, await self._read_tail(cid))
                with contextlib.suppress(NotFound):
                    await self._call(self.api.remove_container, cid, force=True, v=True)
            await self._remove_home(kernel_id)
            self.set_status(state, protocol.KR_GONE, reason=reason)
            self.bury(kernel_id)
        await self._remove_network_if_unused(state)

    async def _destroy_stray(self, kernel_id: str, reason: str) -> None:
        """An id we do not track: remove a leftover container of ours, report gone."""
        session_id = ""
        try:
            info = await self._call(self.api.inspect_container, f"bai-{kernel_id}")
        except NotFound:
            info = None
        if info is not None:
            labels = info["Config"].get("Labels") or {}
            if labels.get(L_AGENT_KEY) == self.agent_key:
                session_id = labels.get(L_SESSION, "")
                with contextlib.suppress(NotFound):
                    await self._call(self.api.remove_container, info["Id"], force=True, v=True)
                await self._remove_home(kernel_id)
                stub = KernelState(kernel_id, session_id, labels.get(L_HOST, ""))
                stub.extra["network"] = labels.get(L_NETWORK)
                await self._remove_network_if_unused(stub)
        self.tombstones[kernel_id] = None
        self.report_gone(kernel_id, session_id, reason)

    # --- logs ---------------------------------------------------------------------------

    async def log_tail(self, kernel_id: str) -> str | None:
        state = self.kernels.get(kernel_id)
        if state is not None and state.container_id and kernel_id not in self.tails:
            return await self._read_tail(state.container_id)
        return self.tails.get(kernel_id)

    async def follow_logs(self, kernel_id: str, tail_bytes: int) -> AsyncIterator[str]:
        """The last ``tail_bytes`` of the kernel's log, then its output as it comes.

        Live output comes from the container's attach stream, which carries the
        engine's blocks as the kernel writes them; the engine's log endpoint, in follow
        mode, sends one HTTP chunk per line and costs the engine ~5 CPU-µs a line, which
        capped a followed log near 40-70k lines/s on a busy machine. The attach starts
        before the tail is read, and output found in both is given once.
        """
        state = self.kernels.get(kernel_id)
        if state is None or not state.container_id:
            kept = self.tails.get(kernel_id)
            if kept is None:
                raise KernelError(f"no kernel {kernel_id} on this agent")
            if tail_bytes > 0 and kept:
                yield kept[-tail_bytes:]
            return
        container_id = state.container_id
        attach = self._engine().containers.container(container_id).attach(stdout=True, stderr=True)
        async with contextlib.AsyncExitStack() as stack:
            try:
                stream = await stack.enter_async_context(attach)
            except aiodocker.DockerError as exc:
                raise KernelError(f"cannot follow the log of kernel {kernel_id}: {exc}") from exc

            async def read() -> bytes | None:
                message = await stream.read_out()
                return None if message is None else message.data

            live = LiveOutput(read)
            stack.push_async_callback(live.close)
            tail = b""
            if tail_bytes > 0:
                tail = await self._log_bytes(container_id, max(1, tail_bytes // 64))
                live.drop_head(tail)
                tail = tail[-tail_bytes:]
            async for text in chunked_text(live, tail):
                yield text

    def _engine(self) -> aiodocker.Docker:
        """The engine's asyncio client (for streams read on the loop), made on first use."""
        if self._aio is None:
            self._aio = aiodocker.Docker(url=self.config.docker_host)
        return self._aio

    async def _log_bytes(self, container_id: str, lines: int) -> bytes:
        """The last ``lines`` lines of a container's log (Docker's tail counts lines)."""
        try:
            return bytes(
                await self._call(self.api.logs, container_id, stdout=True, stderr=True, tail=lines)
            )
        except (NotFound, APIError) as exc:
            raise KernelError(
                f"cannot read the log of container {container_id[:12]}: {exc}"
            ) from exc

    # --- service ports ------------------------------------------------------------------

    def _running_container(self, kernel_id: str) -> tuple[KernelState, str]:
        state = self.running_kernel(kernel_id)
        if not state.container_id:
            raise KernelError(f"kernel {kernel_id} is not running on this agent")
        return state, state.container_id

    async def service_address(self, kernel_id: str, port: int) -> tuple[str, int]:
        state, _ = self._running_container(kernel_id)
        return await self._container_address(state), port

    async def _container_address(self, state: KernelState) -> str:
        """The container's address on its session network (the host reaches it there)."""
        kernel_id = state.kernel_id
        address = state.extra.get("address")
        if not address:
            info = await self._call(self.api.inspect_container, state.container_id)
            networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
            wanted = networks.get(state.extra.get("network") or "") or next(
                iter(networks.values()), {}
            )
            address = wanted.get("IPAddress") or ""
            if not address:
                raise KernelError(f"kernel {kernel_id} has no network address (no network)")
            state.extra["address"] = address
        return str(address)

    async def start_app(self, kernel_id: str, command: str, env: dict[str, str]) -> None:
        _, container_id = self._running_container(kernel_id)
        script = command  # an exec inherits the container's environment (the kernel's)

        def run() -> None:
            exec_id = self.api.exec_create(
                container_id,
                ["/bin/sh", "-c", script],
                user=f"{KERNEL_UID}:{KERNEL_GID}",
                environment={"HOME": HOME, **env},
                workdir=HOME,
            )["Id"]
            self.api.exec_start(exec_id, detach=True)

        await self._call(run)

    # --- terminals ----------------------------------------------------------------------

    async def spawn_terminal(
        self,
        kernel_id: str,
        cols: int,
        rows: int,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        _, container_id = self._running_container(kernel_id)
        pidfile = f"{HOME}/.backendai/term-{uuid.uuid4().hex}.pid"

        def open_exec() -> tuple[str, Any]:
            exec_id = self.api.exec_create(
                container_id,
                ["/bin/sh", "-c", SHELL_SCRIPT, pidfile],
                stdin=True,
                tty=True,
                user=f"{KERNEL_UID}:{KERNEL_GID}",
                environment={"TERM": "xterm-256color", "HOME": HOME},
                workdir=HOME,
            )["Id"]
            sock = self.api.exec_start(exec_id, tty=True, socket=True)
            return exec_id, sock

        exec_id, sock = await self._call(open_exec)
        channel = ExecChannel(self, container_id, exec_id, pidfile, sock, on_data, on_eof)
        await channel.resize(cols, rows)
        return channel

    async def spawn_runner(
        self,
        kernel_id: str,
        source: str,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        _, container_id = self._running_container(kernel_id)

        def open_exec() -> Any:
            exec_id = self.api.exec_create(
                container_id,
                runner_argv("python3", source),
                stdin=True,
                stdout=True,
                stderr=False,
                tty=False,
                user=f"{KERNEL_UID}:{KERNEL_GID}",
                environment={"HOME": HOME},
                workdir=HOME,
            )["Id"]
            return self.api.exec_start(exec_id, tty=False, socket=True)

        try:
            sock = await self._call(open_exec)
        except DockerException as exc:
            raise KernelError(f"cannot start the code runner: {exc}") from exc
        demux = Demuxer()  # without a TTY the engine frames the output (stdout only here)
        return SocketChannel(sock, lambda data: on_data(demux.feed(data)), on_eof)


class ExecChannel(SocketChannel):
    """A ``docker exec`` TTY: its hijacked socket is read with the loop's add_reader."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        exec_id: str,
        pidfile: str,
        sock: Any,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> None:
        self.backend = backend
        self.container_id = container_id
        self.exec_id = exec_id
        self.pidfile = pidfile
        super().__init__(sock, on_data, on_eof)

    async def resize(self, cols: int, rows: int) -> None:
        if self.closed:
            return
        with contextlib.suppress(DockerException):
            await self.backend._call(
                self.backend.api.exec_resize, self.exec_id, height=max(rows, 1), width=max(cols, 1)
            )

    async def ended(self) -> None:
        # Closing the exec's socket does not end its shell: hang up the shell's group.
        script = f"p=$(cat {self.pidfile}) && kill -HUP -- -$p $p 2>/dev/null; rm -f {self.pidfile}"
        api = self.backend.api

        def hangup() -> None:
            exec_id = api.exec_create(
                self.container_id, ["/bin/sh", "-c", script], user=f"{KERNEL_UID}:{KERNEL_GID}"
            )["Id"]
            api.exec_start(exec_id)

        with contextlib.suppress(Exception):
            await self.backend._call(hangup)
