"""Kernels as native processes, each in a bubblewrap sandbox: the fallback when no Docker
engine answers.

Each kernel runs in namespaces of its own (``agent/backends/sandbox.py``): the session's
network namespace (loopback only, shared by the session's kernels), and its own mount, PID,
IPC and UTS namespaces, where it sees the system read-only, its home
``<work-dir>/<session_id>/<hostname>/`` (mode 0700), its data folders (linked into the home
by name) and nothing else of the node. Its environment is clean (the session's variables,
``PATH``, the locale, ``HOME``; nothing of the agent's, never its token). Output goes to a
log file beside the home, which only the agent can read. The agent reaches its ports from
inside the session's network, and starts runners, shells and apps inside its namespaces.

Who a kernel runs as: the agent must be root (and have ``bwrap``), else it refuses every
kernel and says why. Each kernel gets a uid of its own, ``--kernel-uid-base`` + n, in the
shared group ``--kernel-uid-base``: it cannot read the agent's files (its token, its state)
or signal other kernels' processes; destroying a kernel kills every process of its uid, even
those that left its process group, and its PID namespace.

Limits (``setrlimit``, per process, inherited by what it starts, and not raisable):
address space = the kernel's memory slot, open files, processes (per uid, so per
kernel), file size, no core dumps. A CPU slot is a rate, and no rlimit expresses one
(``RLIMIT_CPU`` is a lifetime budget), so the process backend does not enforce it.

A state file in the work dir lists the kernels (pid, sandbox pid, process start time,
paths), so a restarted agent adopts the processes that still live and reports the others
as ended; the session's network namespace outlives the agent in its bind-mounted file.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import json
import logging
import os
import pty
import pwd
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from agent import protocol
from agent.backends import sandbox
from agent.backends.base import (
    LOG_CHUNK_MAX,
    MIN_MEM,
    PIDS_LIMIT,
    Backend,
    FdChannel,
    KernelError,
    KernelLimits,
    KernelState,
    SocketChannel,
    TermChannel,
    nofile_limit,
    prepare_host_folder,
    render_env_file,
    runner_argv,
    trim_tail,
)

log = logging.getLogger(__name__)

STATE_FILE = "process-kernels.json"
KILL_GRACE = 2.0
UID_SLOTS = 65536  # kernel uids BASE+1 … BASE+65535, handed out in turn
FSIZE_LIMIT = 64 * 1024**3  # the largest file a process kernel may write
KERNEL_UMASK = 0o007  # group-writable for the data folders' shared group; others nothing
AGENT_ONLY_ENV = frozenset({"BACKENDAI_AGENT_TOKEN"})

# $1: the exit-code file, $2 (optional): the startup command. The exit code goes to a
# file so that an agent that restarted (and is no longer the parent) still learns it.
_RUNNER = """\
f="$1"; shift
if [ $# -gt 0 ]; then
  /bin/sh -c "$1"; rc=$?
  echo "$rc" > "$f"
  exit "$rc"
fi
exec sleep 2147483647
"""


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of a pid (field 22 of /proc/pid/stat): guards against reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _exit_code_from_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def kernel_rlimits(limits: KernelLimits) -> dict[int, int]:
    """The rlimits a process kernel runs under, by resource."""
    return {
        resource.RLIMIT_AS: limits.mem,
        resource.RLIMIT_NOFILE: nofile_limit(),
        resource.RLIMIT_NPROC: PIDS_LIMIT,
        resource.RLIMIT_FSIZE: FSIZE_LIMIT,
        resource.RLIMIT_CORE: 0,
    }


def _limit_self(rlimits: dict[int, int]) -> Callable[[], None]:
    """A preexec_fn: set soft and hard limits (never above the inherited hard one)."""

    def apply() -> None:
        for res, value in rlimits.items():
            hard = resource.getrlimit(res)[1]
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(res, (value, value))

    return apply


def _uid_taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (those that left the group too)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                real = next(line for line in f if line.startswith("Uid:")).split()[1]
        except (OSError, StopIteration, IndexError):
            continue
        if int(real) == uid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _write_private(path: Path, text: str, uid: int | None, gid: int | None) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        if uid is not None:
            os.fchown(f.fileno(), uid, gid if gid is not None else -1)
        f.write(text)


def make_non_dumpable() -> None:
    """Keep processes of the same uid (kernels, when the agent is not root) out of
    this process's /proc files (environ, mem) and from ptrace-ing it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_dumpable = 4
        if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("cannot make the agent non-dumpable: %s", exc)


class ProcessBackend(Backend):
    name = "process"

    def __init__(self, config, emit=None) -> None:
        super().__init__(config, emit)
        self.work_dir = Path(config.work_dir)
        self.state_path = self.work_dir / STATE_FILE
        self.isolated = os.geteuid() == 0  # only root can run kernels as other uids
        self.next_uid_slot = 1
        self.netns_dir = self.work_dir / ".netns"
        self.sandbox_problem: str | None = None  # why kernels cannot run here, if they cannot

    # --- persistence ---------------------------------------------------------------

    def _save(self) -> None:
        entries = []
        for state in self.kernels.values():
            info = state.extra.get("info")
            if info is None or state.status in (protocol.KR_GONE, protocol.KR_ERROR):
                continue
            entries.append(
                {
                    **info,
                    "kernel_id": state.kernel_id,
                    "session_id": state.session_id,
                    "hostname": state.hostname,
                }
            )
        tmp = self.state_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"kernels": entries, "next_uid_slot": self.next_uid_slot}, f)
        os.replace(tmp, self.state_path)

    async def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # Kernels reach their homes below it, and see nothing else in it.
        self.work_dir.chmod(0o711)
        make_non_dumpable()
        self.sandbox_problem = sandbox.problem() or (
            self._check_reachable() if self.isolated else None
        )
        if self.sandbox_problem:
            log.error("this agent runs no process kernel: %s", self.sandbox_problem)
        try:
            document = json.loads(self.state_path.read_text())
            saved = document["kernels"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ignoring unreadable state file %s: %s", self.state_path, exc)
            return
        self.next_uid_slot = int(document.get("next_uid_slot") or 1)
        for entry in saved:
            state = KernelState(entry["kernel_id"], entry["session_id"], entry["hostname"])
            state.extra["info"] = {
                k: entry.get(k)
                for k in (
                    "pid",
                    "sandbox_pid",
                    "start_time",
                    "dir",
                    "log",
                    "env",
                    "uid",
                    "gid",
                    "mem",
                )
            }
            state.extra["exited"] = asyncio.Event()
            self.kernels[state.kernel_id] = state
            pid = entry["pid"]
            if _proc_start_time(pid) == entry["start_time"]:
                state.status = protocol.KR_RUNNING
                state.container_id = str(pid)
                log.info("adopted kernel %s (pid %s)", state.kernel_id, pid)
                self._watch(state, pid, None)
            else:
                self._exited(state, self._read_exit_file(state))
        self._save()

    # --- kernels ---------------------------------------------------------------------

    async def _create_one(self, spec: dict[str, Any], kspec: dict[str, Any]) -> None:
        state = self.claim_kernel(spec, kspec)
        if state is None:
            return
        session_id = state.session_id
        state.extra["exited"] = asyncio.Event()
        async with state.lock:
            self.report(state.report())
            if kspec.get("sftp"):
                # Its server needs the SFTP image's asyncssh and a port of its own to publish.
                reason = "the process backend cannot run SFTP sessions; use a Docker agent"
                self.set_status(state, protocol.KR_ERROR, reason=reason)
                return
            if self.sandbox_problem:
                self.set_status(state, protocol.KR_ERROR, reason=self.sandbox_problem)
                return
            limits = self.limits_for(state, kspec.get("slots") or {})
            try:
                # Chosen here, on the loop, so that concurrent creates never share a uid.
                ident = self._allocate_uid() if self.isolated else None
                state.extra["uid"] = ident[0] if ident else None
                proc, info = await asyncio.to_thread(self._spawn, session_id, kspec, limits, ident)
            except (KernelError, OSError) as exc:
                self.set_status(state, protocol.KR_ERROR, reason=str(exc))
                return
            state.extra["info"] = info
            self._save()
            self.set_status(state, protocol.KR_RUNNING, container_id=str(proc.pid))
            self._watch(state, proc.pid, proc)

    def _kernel_env(self, kdir: Path, env: dict[str, str]) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        base.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        base.update({str(k): str(v) for k, v in env.items() if str(k) not in AGENT_ONLY_ENV})
        base.update({"HOME": str(kdir), "PWD": str(kdir), "TMPDIR": str(kdir / ".tmp")})
        return base

    def _check_reachable(self) -> str | None:
        """Why a kernel's uid cannot reach its home by path (bubblewrap, running as that
        uid, binds it from there), or None when it can."""
        for parent in self.work_dir.parents:
            with contextlib.suppress(OSError):
                if not parent.stat().st_mode & 0o001:
                    return (
                        f"{parent} is not searchable by other users: process kernels cannot"
                        f" reach their homes under {self.work_dir} (chmod o+x it)"
                    )
        return None

    def _allocate_uid(self) -> tuple[int, int]:
        """A uid no live kernel and no account has, and the kernels' shared group."""
        base = self.config.kernel_uid_base
        used = {k.extra.get("uid") for k in self.kernels.values()}
        used |= {k.extra["info"].get("uid") for k in self.kernels.values() if k.extra.get("info")}
        for _ in range(UID_SLOTS):
            slot = self.next_uid_slot
            self.next_uid_slot = slot % (UID_SLOTS - 1) + 1
            uid = base + slot
            if uid not in used and not _uid_taken(uid):
                return uid, base
        raise KernelError("no free kernel uid left on this agent")

    def _spawn(
        self,
        session_id: str,
        kspec: dict[str, Any],
        limits: KernelLimits,
        ident: tuple[int, int] | None,
    ) -> tuple[subprocess.Popen, dict]:
        """Start a kernel as ``ident`` (uid, gid), or as the agent itself when None."""
        hostname = kspec["hostname"]
        if "/" in session_id or "/" in hostname or hostname in ("", ".", ".."):
            raise KernelError(f"bad session id or hostname: {session_id!r} {hostname!r}")
        folders = self._checked_folders(kspec)  # all refused before anything is made
        if ident is not None:
            uid, gid = ident
            owner: tuple[int | None, int | None] = (uid, gid)
        else:
            uid, gid = os.geteuid(), os.getegid()
            owner = (None, None)
        sdir = self.work_dir / session_id
        kdir = sdir / hostname
        self._make_home(sdir, kdir, ident)
        for name, target in folders.items():
            prepare_host_folder(target, uid, gid)
            link = kdir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        env = self._kernel_env(kdir, kspec.get("env") or {})
        _write_private(kdir / ".backendai_env", render_env_file(kspec.get("env") or {}), *owner)
        log_path = sdir / f".{hostname}.log"
        exit_path = sdir / f".{hostname}.exit"
        # The runner writes its exit code here; the session dir stays the agent's.
        _write_private(exit_path, "", *owner)
        command = ["/bin/sh", "-c", _RUNNER, "backendai-kernel", str(exit_path)]
        if kspec.get("startup_command"):
            command.append(kspec["startup_command"])
        netns = sandbox.ensure_netns(self.netns_dir / session_id)
        binds = sandbox.open_binds([kdir, exit_path, *folders.values()], self._runner_paths())
        info_r, info_w = os.pipe()
        argv = sandbox.kernel_argv(
            netns=netns,
            uid=uid,
            gid=gid,
            hostname=hostname,
            home=kdir,
            binds=binds,
            info_fd=info_w,
            command=command,
        )
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "ab") as logf:
                # nsenter enters the session's network as root, then becomes the kernel.
                proc = subprocess.Popen(
                    argv,
                    cwd=kdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(info_w, *(fd for fd, _, _ in binds)),
                    umask=KERNEL_UMASK,
                    preexec_fn=_limit_self(kernel_rlimits(limits)),  # noqa: PLW1509 - no locks taken
                )
        finally:
            os.close(info_w)
            sandbox.close_binds(binds)
        try:
            sandbox_pid = sandbox.read_sandbox_pid(info_r)
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        info = {
            "pid": proc.pid,
            "sandbox_pid": sandbox_pid,
            "start_time": _proc_start_time(proc.pid),
            "dir": str(kdir),
            "log": str(log_path),
            "env": env,
            "uid": uid,
            "gid": gid,
            "mem": limits.mem,
        }
        return proc, info

    def _checked_folders(self, kspec: dict[str, Any]) -> dict[str, Path]:
        """The data folders by name, each inside the data root (else KernelError)."""
        folders = {}
        for mount in kspec.get("mounts") or []:
            name = mount["name"]
            if "/" in name or name in ("", ".", ".."):
                raise KernelError(f"bad data folder name {name!r}")
            if mount.get("readonly") is True:
                # A process sees the host's files with the kernel user's rights:
                # nothing here can make one folder read-only for it alone.
                raise KernelError(
                    f"the process backend cannot mount {name!r} read-only; use a Docker agent"
                )
            folders[name] = self.check_mount(mount["host_path"])
        return folders

    @staticmethod
    def _make_home(sdir: Path, kdir: Path, ident: tuple[int, int] | None) -> None:
        """The session dir (the agent's, searchable) and the kernel's private home."""
        sdir.mkdir(mode=0o711, parents=True, exist_ok=True)
        sdir.chmod(0o711)
        kdir.mkdir(mode=0o700, exist_ok=True)
        (kdir / ".tmp").mkdir(mode=0o700, exist_ok=True)
        if ident is not None:
            for path in (kdir, kdir / ".tmp"):
                os.chown(path, *ident)
                path.chmod(0o700)

    @staticmethod
    def _in_kernel(info: dict[str, Any], command: list[str]) -> list[str]:
        """The command line that runs ``command`` inside a running kernel's sandbox."""
        if not info.get("sandbox_pid"):
            raise KernelError("this kernel was started without a sandbox: restart the session")
        return sandbox.enter_argv(
            info["sandbox_pid"], info.get("uid"), info.get("gid"), info["dir"], command
        )

    def _runner_paths(self) -> list[Path]:
        """What a kernel sees read-only besides the system: the agent's python and venv
        when the code runner is the agent's own python."""
        python = runner_python(sys.executable, self.isolated)
        if self.config.runner_python or python != sys.executable:
            return []
        paths = {Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, sys.executable)}
        paths = {p if p.is_dir() else p.parent for p in paths}
        return sorted(p for p in paths if not p.is_relative_to("/usr"))

    def _watch(self, state: KernelState, pid: int, proc: subprocess.Popen | None) -> None:
        """Learn about the exit through a pidfd on the loop: no thread, no polling."""
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._exited(state, self._collect(state, proc))
            return
        state.extra["pidfd"] = fd

        def on_ready() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            state.extra.pop("pidfd", None)
            self._exited(state, self._collect(state, proc))

        loop.add_reader(fd, on_ready)

    def _collect(self, state: KernelState, proc: subprocess.Popen | None) -> int | None:
        if proc is not None:
            try:
                returncode = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return None
            return _exit_code_from_status(returncode)
        return self._read_exit_file(state)

    def _read_exit_file(self, state: KernelState) -> int | None:
        path = Path(state.extra["info"]["log"]).with_suffix(".exit")
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _exited(self, state: KernelState, exit_code: int | None) -> None:
        state.extra["exited"].set()
        if state.destroying:
            return
        reason = None if exit_code is not None else "exit status unknown (ended while agent away)"
        self.set_status(state, protocol.KR_EXITED, exit_code=exit_code, reason=reason)
        self.keep_tail(state, self._read_tail(state))
        self._save()

    def _read_tail(self, state: KernelState) -> str:
        info = state.extra.get("info")
        if info is None:
            return ""
        limit = self.config.log_tail_bytes
        try:
            with open(info["log"], "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return trim_tail(f.read(), limit)
        except OSError:
            return ""

    async def destroy_kernels(self, kernel_ids: list[str], reason: str) -> None:
        await asyncio.gather(*(self._destroy_one(k, reason) for k in kernel_ids))

    async def _destroy_one(self, kernel_id: str, reason: str) -> None:
        state = self.kernels.get(kernel_id)
        if state is None:
            self.report_gone(kernel_id, "", reason)
            return
        async with state.lock:
            if state.status == protocol.KR_GONE:
                self.report(state.report())
                return
            state.destroying = True
            await self.terminals.close_kernel(kernel_id, "kernel destroyed")
            await self.execution.close_kernel(kernel_id)
            info = state.extra.get("info")
            if info is not None:
                await self._kill_group(state, info["pid"])
                if not state.tail_sent:
                    self.keep_tail(state, self._read_tail(state))
                await asyncio.to_thread(self._remove_files, info)
            else:  # it never started: what its start left (home, log, the session's network)
                sdir = self.work_dir / state.session_id
                left = {
                    "dir": str(sdir / state.hostname),
                    "log": str(sdir / f".{state.hostname}.log"),
                }
                if "/" not in state.session_id + state.hostname:
                    await asyncio.to_thread(self._remove_files, left)
            self.set_status(state, protocol.KR_GONE, reason=reason)
            self.bury(kernel_id)
            self._save()

    async def _kill_group(self, state: KernelState, pgid: int) -> None:
        exited: asyncio.Event = state.extra["exited"]
        if not exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(exited.wait(), KILL_GRACE)
        # Children of the kernel may outlive the leader; the group id stays valid while any do.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for app in state.extra.pop("apps", []):  # apps started on demand, each its own group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(app.pid, signal.SIGKILL)
            await asyncio.to_thread(app.wait)
        uid = (state.extra.get("info") or {}).get("uid")
        if self.isolated and uid is not None and uid >= self.config.kernel_uid_base > 0:
            # A process that left the group (setsid) is still the kernel's uid.
            await asyncio.to_thread(_kill_uid, uid)

    def _remove_files(self, info: dict[str, Any]) -> None:
        kdir = Path(info["dir"])
        shutil.rmtree(kdir, ignore_errors=True)  # symlinked data folders are unlinked, not followed
        log_path = Path(info["log"])
        for path in (log_path, log_path.with_suffix(".exit")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        try:
            kdir.parent.rmdir()  # the session dir, once its last kernel is gone
        except OSError:
            return
        sandbox.remove_netns(self.netns_dir / kdir.parent.name)  # and the session's network

    # --- logs ------------------------------------------------------------------------

    async def log_tail(self, kernel_id: str) -> str | None:
        state = self.kernels.get(kernel_id)
        if state is not None and state.extra.get("info") is not None:
            return self._read_tail(state)
        return self.tails.get(kernel_id)

    async def follow_logs(self, kernel_id: str, tail_bytes: int) -> AsyncIterator[str]:
        state = self.kernels.get(kernel_id)
        info = state.extra.get("info") if state else None
        if state is None or info is None:
            kept = self.tails.get(kernel_id)
            if kept is None:
                raise KernelError(f"no kernel {kernel_id} on this agent")
            if tail_bytes > 0 and kept:
                yield kept[-tail_bytes:]
            return
        exited: asyncio.Event = state.extra["exited"]
        with open(info["log"], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max(0, tail_bytes)))
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while True:
                ended = exited.is_set()  # checked before reading, so nothing written is lost
                data = f.read(LOG_CHUNK_MAX)
                if data:
                    text = decoder.decode(data)
                    if text:
                        yield text
                    continue
                if ended:
                    return
                # A plain file has no readiness to wait on; a short sleep keeps this cheap.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exited.wait(), 0.05)

    # --- terminals --------------------------------------------------------------------

    async def service_address(self, kernel_id: str, port: int) -> tuple[str, int]:
        # The loopback of the session's own network namespace, never the host's.
        self.running_kernel(kernel_id)
        return "127.0.0.1", port

    async def open_service(
        self, kernel_id: str, port: int, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        state = self.running_kernel(kernel_id)
        netns = self.netns_dir / state.session_id
        if not sandbox.is_netns(netns):
            raise KernelError("the kernel's network is gone")
        sock = await asyncio.to_thread(sandbox.socket_in_netns, netns)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=limit)

    def _kernel_process(self, state: KernelState) -> tuple[dict[str, Any], dict[int, int]]:
        """A running kernel's saved facts (dir, env, uid, gid, pid) and its rlimits,
        for what the agent starts in it (apps, shells, the code runner)."""
        info = state.extra["info"]
        limits = KernelLimits(Decimal(0), int(info.get("mem") or MIN_MEM))
        return info, kernel_rlimits(limits)

    async def start_app(self, kernel_id: str, command: str, env: dict[str, str]) -> None:
        state = self.running_kernel(kernel_id)
        info, rlimits = self._kernel_process(state)
        argv = self._in_kernel(info, ["/bin/sh", "-c", command])
        try:
            app = subprocess.Popen(
                argv,
                cwd=info["dir"],
                env={**info["env"], **env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # A group of its own (the kernel's is in another session, which Linux
                # refuses to join); destroying the kernel ends it too (_kill_group).
                start_new_session=True,
                preexec_fn=_limit_self(rlimits),  # noqa: PLW1509 - no locks taken
                close_fds=True,
                umask=KERNEL_UMASK,
            )
        except OSError as exc:
            raise KernelError(f"cannot start the app: {exc}") from exc
        apps = [a for a in state.extra.get("apps", []) if a.poll() is None]  # ended ones go
        state.extra["apps"] = [*apps, app]

    async def spawn_runner(
        self,
        kernel_id: str,
        source: str,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        info, rlimits = self._kernel_process(self.running_kernel(kernel_id))
        python = self.config.runner_python or runner_python(sys.executable, self.isolated)
        argv = self._in_kernel(info, runner_argv(python, source))
        # glibc reserves 64 MiB of address space per thread arena: under the kernel's
        # RLIMIT_AS an ipykernel needs few arenas to start at all.
        env = {"MALLOC_ARENA_MAX": "2", **info["env"]}
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=info["dir"],
                env=env,
                stdin=theirs,
                stdout=theirs,
                stderr=subprocess.DEVNULL,
                # A group of its own (the kernel's is in another session, out of reach):
                # the agent ends it before it destroys the kernel.
                start_new_session=True,
                preexec_fn=_limit_self(rlimits),  # noqa: PLW1509 - no locks taken
                close_fds=True,
                umask=KERNEL_UMASK,
            )
        except OSError as exc:
            ours.close()
            raise KernelError(f"cannot start the code runner: {exc}") from exc
        finally:
            theirs.close()
        return RunnerChannel(ours, proc, on_data, on_eof)

    async def spawn_terminal(
        self,
        kernel_id: str,
        cols: int,
        rows: int,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        info, rlimits = self._kernel_process(self.running_kernel(kernel_id))
        env = dict(info["env"])
        env["TERM"] = "xterm-256color"
        shell = ["/bin/bash", "-i"] if os.path.exists("/bin/bash") else ["/bin/sh", "-i"]
        uid = info.get("uid")
        argv = self._in_kernel(info, shell)
        master, slave = pty.openpty()
        _set_winsize(master, cols, rows)
        if self.isolated and uid is not None:
            os.fchown(slave, uid, -1)
        try:
            proc = subprocess.Popen(
                argv,
                cwd=info["dir"],
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_shell_setup(rlimits),  # noqa: PLW1509 - no locks taken
                close_fds=True,
                umask=KERNEL_UMASK,
            )
        except OSError as exc:
            os.close(master)
            raise KernelError(f"cannot start a shell: {exc}") from exc
        finally:
            os.close(slave)
        return PtyChannel(asyncio.get_running_loop(), master, proc, on_data, on_eof)


def runner_python(executable: str, isolated: bool) -> str:
    """The python that runs the code runner: the agent's own (its venv has jupyter_client
    and ipykernel) when the kernel can run it, else ``python3`` from the kernel's PATH.
    A kernel with a uid of its own cannot run a python under a directory it may not
    enter (a venv built from a python in root's home, say)."""
    if not isolated or _usable_by_others(executable):
        return executable
    return "python3"


def _usable_by_others(executable: str) -> bool:
    """Whether every directory up to the real file is searchable by anyone, and the
    file executable by anyone; also the site-packages that holds jupyter_client."""
    import importlib.util

    spec = importlib.util.find_spec("jupyter_client")
    paths = [Path(os.path.realpath(executable))]
    if spec is not None and spec.origin:
        paths.append(Path(os.path.realpath(spec.origin)))
    for path in paths:
        try:
            if not path.stat().st_mode & stat.S_IROTH:
                return False
            if not all(p.stat().st_mode & stat.S_IXOTH for p in path.parents):
                return False
        except OSError:
            return False
    return bool(paths[0].stat().st_mode & stat.S_IXOTH)


def _shell_setup(rlimits: dict[int, int]) -> Callable[[], None]:
    """A preexec_fn for a terminal's shell: the kernel's limits and its controlling tty
    (setsid ran just before)."""
    limit = _limit_self(rlimits)

    def setup() -> None:
        limit()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return setup


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(rows, 1), max(cols, 1), 0, 0))


class RunnerChannel(SocketChannel):
    """The code runner on one end of a socketpair (its stdin and stdout)."""

    def __init__(self, sock, proc: subprocess.Popen, on_data, on_eof) -> None:
        self.proc = proc
        super().__init__(sock, on_data, on_eof)

    async def ended(self) -> None:
        # It shuts its kernel down when its input ends; past the grace it is killed.
        await asyncio.to_thread(_reap_group, self.proc)


class PtyChannel(FdChannel):
    """A shell on a pseudo-terminal."""

    def __init__(self, loop, master: int, proc: subprocess.Popen, on_data, on_eof) -> None:
        self.master = master
        self.proc = proc
        os.set_blocking(master, False)
        super().__init__(loop, master, on_data, on_eof)

    def _recv(self) -> bytes:
        return os.read(self.master, 65536)

    def _send(self, data: bytearray) -> int:
        return os.write(self.master, data)

    async def resize(self, cols: int, rows: int) -> None:
        if not self.closed:
            _set_winsize(self.master, cols, rows)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_io()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGHUP)
        os.close(self.master)
        await asyncio.to_thread(_reap_group, self.proc)


def _reap_group(proc: subprocess.Popen) -> None:
    """Wait for a process that leads its group; past the grace, kill the whole group."""
    try:
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
