"""What every kernel backend offers the daemon, and the parts they share.

A backend runs kernels (containers or processes) and tells the daemon about them
through one callback, ``emit(frame)``, with ready-made protocol frames:
``kernel_status`` the moment a kernel changes, ``log_tail`` once when a kernel ends,
``term_output`` / ``term_closed`` for terminals. The daemon forwards those frames to
the manager. Every command is idempotent and keyed by kernel id (or terminal id).
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import logging
import os
import resource
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from agent import metrics, protocol
from agent.config import AgentConfig

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]

TERM_REPLAY_BYTES = 16 * 1024  # recent terminal output replayed on re-attach
LOG_CHUNK_MAX = 256 * 1024  # upper bound of one log_chunk frame's data
TOMBSTONES = 4096  # destroyed kernel ids remembered to refuse late creates


class KernelError(Exception):
    """A kernel could not be created; the message is shown to the user."""


@dataclass
class KernelReport:
    kernel_id: str
    session_id: str
    status: str
    exit_code: int | None = None
    container_id: str | None = None
    reason: str | None = None
    sftp: dict[str, Any] | None = None  # an SFTP kernel's published port (protocol.SFTP_REPORT)

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "kernel_id": self.kernel_id,
            "session_id": self.session_id,
            "status": self.status,
            "exit_code": self.exit_code,
            "container_id": self.container_id,
            "reason": self.reason,
        }
        if self.sftp is not None:
            wire["sftp"] = self.sftp
        return wire


@dataclass
class KernelState:
    """What a backend knows about one kernel on this node."""

    kernel_id: str
    session_id: str
    hostname: str
    status: str = protocol.KR_PREPARING
    exit_code: int | None = None
    container_id: str | None = None
    reason: str | None = None
    destroying: bool = False
    tail_sent: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def report(self) -> KernelReport:
        published = self.extra.get("published")
        return KernelReport(
            self.kernel_id,
            self.session_id,
            self.status,
            self.exit_code,
            self.container_id,
            self.reason,
            published.wire()
            if published is not None and self.status == protocol.KR_RUNNING
            else None,
        )


class TermChannel(ABC):
    """One live shell, as a backend provides it to the :class:`TerminalHub`."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Queue input for the shell without blocking the loop."""

    @abstractmethod
    async def resize(self, cols: int, rows: int) -> None: ...

    @abstractmethod
    async def close(self) -> None:
        """End the shell; must be safe to call twice."""


class FdChannel(TermChannel):
    """A shell behind one non-blocking file descriptor, served by the loop's
    add_reader/add_writer (no threads, no polling). Subclasses say how to read
    and write it (a socket, a pty master) and how to end the shell."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.fd = fd
        self.on_data = on_data
        self.on_eof = on_eof
        self.out = bytearray()
        self.reading = True
        self.closed = False
        loop.add_reader(fd, self._readable)

    @abstractmethod
    def _recv(self) -> bytes:
        """Read what is there; raise BlockingIOError when nothing is."""

    @abstractmethod
    def _send(self, data: bytearray) -> int:
        """Write what fits; return how much."""

    def _readable(self) -> None:
        try:
            data = self._recv()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # e.g. EIO: the other side of the shell went away
            data = b""
        if not data:
            self._stop_io()
            self.on_eof()
            return
        self.on_data(data)

    def _stop_io(self) -> None:
        if self.reading:
            self.reading = False
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.fd)
        with contextlib.suppress(Exception):
            self.loop.remove_writer(self.fd)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.out += data
        self._flush()

    def _flush(self) -> None:
        try:
            sent = self._send(self.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.out.clear()
            return
        del self.out[:sent]
        if self.out:
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        self.loop.remove_writer(self.fd)
        self._flush()


class SocketChannel(FdChannel):
    """A process at the other end of a socket: a ``docker exec``'s hijacked socket, or
    one end of a socketpair that is a subprocess's stdin and stdout."""

    def __init__(
        self, sock: Any, on_data: Callable[[bytes], None], on_eof: Callable[[], None]
    ) -> None:
        self.sock = sock  # keeps an HTTP response (and so the connection) alive
        self.raw = getattr(sock, "_sock", sock)
        self.raw.setblocking(False)
        super().__init__(asyncio.get_running_loop(), self.raw.fileno(), on_data, on_eof)

    def _recv(self) -> bytes:
        return self.raw.recv(65536)

    def _send(self, data: bytearray) -> int:
        return self.raw.send(data)

    async def resize(self, cols: int, rows: int) -> None:
        """Only a TTY has a size."""

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_io()
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR)  # the process reads the end of its input
        with contextlib.suppress(Exception):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.raw.close()
        await self.ended()

    async def ended(self) -> None:  # noqa: B027 - an optional hook
        """After the socket is closed: end what is left of the process."""


# The code runner (agent/coderunner.py) is started as
# ``/bin/sh -c RUNNER_SHELL bai-coderunner <python> <source>``: an image without that
# python answers "unavailable" at once instead of failing somewhere in between.
RUNNER_SHELL = (
    'command -v "$1" >/dev/null 2>&1'
    ' || { echo \'{"type": "unavailable", "reason": "no python3"}\'; exit 127; }\n'
    'exec "$1" -u -c "$2"'
)


def runner_argv(python: str, source: str) -> list[str]:
    return ["/bin/sh", "-c", RUNNER_SHELL, "bai-coderunner", python, source]


class Backend(ABC):
    """The interface the daemon drives. Subclasses: docker, process."""

    name: str = "?"

    def __init__(self, config: AgentConfig, emit: Emit | None = None) -> None:
        self.config = config
        self.emit: Emit = emit or (lambda frame: None)
        self.agent_id: str | None = None
        self.kernels: dict[str, KernelState] = {}
        self.tails: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.terminals = TerminalHub(self)
        from agent.execution import Execution  # it drives backends: imported late

        self.execution = Execution(self)

    # --- lifecycle of the backend itself --------------------------------------

    async def start(self) -> None:  # noqa: B027 - an optional hook
        """Find the kernels that survived a restart of the agent and watch them."""

    async def close(self) -> None:
        """Stop watchers, terminals and code runners; kernels keep running."""
        await self.terminals.close_all()
        await self.execution.close_all()

    def set_agent_id(self, agent_id: str) -> None:
        self.agent_id = agent_id

    # --- kernels ----------------------------------------------------------------

    async def create_kernels(self, spec: dict[str, Any]) -> None:
        """Create the kernels of a ``create_kernels`` frame that are not there yet."""
        await asyncio.gather(*(self._create_timed(spec, k) for k in spec.get("kernels", [])))

    async def _create_timed(self, spec: dict[str, Any], kspec: dict[str, Any]) -> None:
        started = time.monotonic()
        known = kspec["kernel_id"] in self.kernels
        try:
            await self._create_one(spec, kspec)
        except Exception:
            metrics.ERRORS.labels("create").inc()
            raise
        state = self.kernels.get(kspec["kernel_id"])
        if known or state is None:
            return  # a repeated command, or one for a kernel destroyed before
        failed = state.status == protocol.KR_ERROR
        if failed:
            metrics.ERRORS.labels("create").inc()
        metrics.CREATE_SECONDS.labels("error" if failed else "ok").observe(
            time.monotonic() - started
        )

    def claim_kernel(self, spec: dict[str, Any], kspec: dict[str, Any]) -> KernelState | None:
        """The idempotent start of a create: None when the kernel was destroyed
        (reported gone) or exists already (re-reported); else its new state,
        registered and not yet reported."""
        kernel_id = kspec["kernel_id"]
        session_id = spec["session_id"]
        if kernel_id in self.tombstones:
            self.report_gone(kernel_id, session_id, "already destroyed")
            return None
        existing = self.kernels.get(kernel_id)
        if existing is not None:
            self.report(existing.report())
            return None
        state = KernelState(kernel_id, session_id, kspec["hostname"])
        self.kernels[kernel_id] = state
        return state

    @abstractmethod
    async def _create_one(self, spec: dict[str, Any], kspec: dict[str, Any]) -> None:
        """Create one kernel (start with ``claim_kernel``)."""

    @abstractmethod
    async def destroy_kernels(self, kernel_ids: list[str], reason: str) -> None:
        """Destroy kernels (unknown ones are reported gone)."""

    async def list_kernels(self) -> list[KernelReport]:
        return [k.report() for k in self.kernels.values() if k.status != protocol.KR_GONE]

    @abstractmethod
    def follow_logs(self, kernel_id: str, tail_bytes: int) -> AsyncIterator[str]:
        """The last ``tail_bytes`` of the log, then every new chunk until the kernel ends."""

    async def log_tail(self, kernel_id: str) -> str | None:
        """The kept tail of a kernel's log (live or ended), or None if unknown."""
        return self.tails.get(kernel_id)

    # --- terminals (the hub keeps ids, grace periods and replay) ------------------

    def term_open(self, term_id: str, kernel_id: str, cols: int, rows: int) -> Awaitable[None]:
        """Registers the terminal at once; await the result to start (or re-attach) it."""
        return self.terminals.open(term_id, kernel_id, cols, rows)

    def term_input(self, term_id: str, data: str) -> None:
        self.terminals.input(term_id, data)

    async def term_resize(self, term_id: str, cols: int, rows: int) -> None:
        await self.terminals.resize(term_id, cols, rows)

    def term_detach(self, term_id: str) -> None:
        self.terminals.detach(term_id)

    async def term_close(self, term_id: str) -> None:
        await self.terminals.close(term_id, "closed")

    @abstractmethod
    async def spawn_terminal(
        self,
        kernel_id: str,
        cols: int,
        rows: int,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        """Start a login shell in a running kernel. Raise KernelError if impossible."""

    def running_kernel(self, kernel_id: str) -> KernelState:
        """The state of a kernel that runs here, or KernelError saying it does not."""
        state = self.kernels.get(kernel_id)
        if state is None or state.status != protocol.KR_RUNNING:
            raise KernelError(f"kernel {kernel_id} is not running on this agent")
        return state

    # --- code execution (agent/execution.py drives it) ----------------------------------

    async def spawn_runner(
        self,
        kernel_id: str,
        source: str,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> TermChannel:
        """Start the code runner (``python3 -u -c source``, see :func:`runner_argv`) in a
        running kernel as the kernel user, its stdin and stdout a byte stream (no TTY) and
        its stderr dropped. Raise KernelError if the kernel does not run here."""
        raise KernelError("this backend cannot run code")

    # --- service ports (apps) ---------------------------------------------------------

    async def service_address(self, kernel_id: str, port: int) -> tuple[str, int]:
        """Where this host reaches ``port`` of a running kernel. Raise KernelError if
        the kernel is not running here."""
        raise KernelError("this backend has no service ports")

    async def open_service(
        self, kernel_id: str, port: int, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``port`` of a running kernel, streams buffering ``limit``."""
        host, port = await self.service_address(kernel_id, port)
        return await asyncio.open_connection(host, port, limit=limit)

    async def start_app(self, kernel_id: str, command: str, env: dict[str, str]) -> None:
        """Run an app's start command in a running kernel, detached, as the kernel user in
        its home, with ``env`` added to the kernel's environment."""
        raise KernelError("this backend cannot start apps")

    # --- helpers for subclasses ----------------------------------------------------

    def set_status(self, state: KernelState, status: str, **changes: Any) -> None:
        """Record a change and send ``kernel_status`` if anything changed."""
        before = (state.status, state.exit_code, state.container_id, state.reason)
        state.status = status
        for key, value in changes.items():
            setattr(state, key, value)
        after = (state.status, state.exit_code, state.container_id, state.reason)
        if before != after:
            log.info(
                "kernel %s (session %s, %s): %s exit_code=%s reason=%s",
                state.kernel_id,
                state.session_id,
                state.hostname,
                status,
                state.exit_code,
                state.reason,
            )
            self.report(state.report())

    def report(self, report: KernelReport) -> None:
        self.emit({"type": protocol.KERNEL_STATUS, **report.to_wire()})

    def keep_tail(self, state: KernelState, data: str, *, send: bool = True) -> None:
        """Keep a kernel's final log tail and send ``log_tail`` once per end."""
        self.tails[state.kernel_id] = data
        self.tails.move_to_end(state.kernel_id)
        while len(self.tails) > TOMBSTONES:
            self.tails.popitem(last=False)
        if send and not state.tail_sent:
            state.tail_sent = True
            self.emit({"type": protocol.LOG_TAIL, "kernel_id": state.kernel_id, "data": data})

    def bury(self, kernel_id: str) -> None:
        self.kernels.pop(kernel_id, None)
        self.tombstones[kernel_id] = None
        while len(self.tombstones) > TOMBSTONES:
            self.tombstones.popitem(last=False)

    def report_gone(self, kernel_id: str, session_id: str, reason: str | None) -> None:
        self.report(KernelReport(kernel_id, session_id, protocol.KR_GONE, reason=reason))

    def limits_for(self, state: KernelState, slots: dict[str, Any]) -> KernelLimits:
        """The kernel's limits; a request below the floor is raised to it, and logged."""
        limits = kernel_limits(slots)
        if limits.raised:
            log.warning(
                "kernel %s (session %s): %s missing or below the agent's floor, raised to"
                " cpu=%s mem=%s (asked: cpu=%s mem=%s)",
                state.kernel_id,
                state.session_id,
                " and ".join(limits.raised),
                limits.cpu,
                limits.mem,
                slots.get("cpu"),
                slots.get("mem"),
            )
        return limits

    def check_mount(self, host_path: str) -> Path:
        """Validate a data-folder path from the manager; raise KernelError if refused."""
        path = Path(host_path)
        if not path.is_absolute():
            raise KernelError(f"mount path {host_path!r} is not absolute")
        resolved = Path(os.path.normpath(path))
        root = self.config.data_root
        if root is not None:
            root = Path(os.path.realpath(root))
            real = Path(os.path.realpath(resolved))
            if real != root and root not in real.parents:
                raise KernelError(f"mount path {host_path!r} is outside the data root {root}")
            return real
        return resolved


def nosuid_mount(root: Path) -> bool:
    """Make ``root`` (the data root) a mount of its own with ``nosuid,nodev`` (a bind of
    itself), unless the mount it is on has both already; True if this call mounted it.

    The engine's bind mounts of the data folders below it copy these flags, so a kernel
    never runs a set-user-ID file or opens a device node from a folder (the engine's API
    has no ``nosuid`` for binds). Needs root; OSError or CalledProcessError if refused."""
    flags = os.statvfs(root).f_flag
    if flags & os.ST_NOSUID and flags & os.ST_NODEV:
        return False
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True, capture_output=True)
    try:
        subprocess.run(
            ["mount", "-o", "remount,bind,nosuid,nodev", str(root)],
            check=True,
            capture_output=True,
        )
    except subprocess.CalledProcessError:
        subprocess.run(["umount", str(root)], check=False, capture_output=True)
        raise
    return True


def unmount(root: Path) -> None:
    """Undo ``nosuid_mount`` (a mount still in use stays; a later agent reuses it)."""
    subprocess.run(["umount", str(root)], check=False, capture_output=True)


def prepare_host_folder(path: Path, uid: int = 1000, gid: int = 1000) -> None:
    """Create a data folder and make it writable by the kernel user, and by no one else.

    As root the folder is handed to ``uid:gid`` with mode 2770 (group-writable,
    new files keep the group), so a folder made world-writable by an older
    manager is closed again. Without root nothing can be handed over: it warns.
    """
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        st = path.stat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(path, uid, gid)
        if st.st_mode & 0o7777 != FOLDER_MODE:
            path.chmod(FOLDER_MODE)
    elif not os.access(path, os.W_OK):
        log.warning("data folder %s is not writable by the agent's user", path)


# The floor under every kernel's limits: a kernel never runs without a CPU and a
# memory limit, and a request below these (or none) is raised to them. Docker
# refuses less than 0.01 of a core and less than 6 MiB; a shell, the runner and
# a little work need about 16 MiB.
MIN_CPU = Decimal("0.01")
MIN_MEM = 16 * 1024**2
PIDS_LIMIT = 4096  # processes (threads) per kernel
NOFILE_LIMIT = 16384  # open files per process (capped by the agent's own hard limit)
FOLDER_MODE = 0o2770  # data folders: the kernel user and its group, nobody else


@dataclass(frozen=True)
class KernelLimits:
    """The CPU and memory limits a kernel runs with; ``raised`` names the
    slots that were missing or below the floor and were lifted to it."""

    cpu: Decimal
    mem: int
    raised: tuple[str, ...] = ()


def nofile_limit() -> int:
    """The open-files limit for kernels: NOFILE_LIMIT, or less where the agent's own
    hard limit is lower (an engine started under the same limits cannot raise it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return NOFILE_LIMIT if hard == resource.RLIM_INFINITY else min(NOFILE_LIMIT, hard)


def kernel_limits(slots: dict[str, Any]) -> KernelLimits:
    """The limits for a kernel's requested slots, never below the agent's floor."""
    cpu, mem = slot_cpu(slots), slot_mem(slots)
    raised = []
    if cpu is None or cpu < MIN_CPU:
        cpu = MIN_CPU
        raised.append("cpu")
    if mem is None or mem < MIN_MEM:
        mem = MIN_MEM
        raised.append("mem")
    return KernelLimits(cpu, mem, tuple(raised))


def slot_cpu(slots: dict[str, Any]) -> Decimal | None:
    try:
        value = Decimal(str(slots["cpu"]))
    except (KeyError, InvalidOperation):
        return None
    return value if value.is_finite() and value > 0 else None


def slot_mem(slots: dict[str, Any]) -> int | None:
    try:
        value = Decimal(str(slots["mem"]))
    except (KeyError, InvalidOperation):
        return None
    return int(value) if value.is_finite() and value > 0 else None


def valid_env_name(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and name.replace("_", "a").isalnum()


def render_env_file(env: dict[str, str]) -> str:
    """``export K='v'`` lines that any POSIX shell can source."""
    lines = []
    for key, value in sorted(env.items()):
        if valid_env_name(key):
            quoted = "'" + str(value).replace("'", "'\"'\"'") + "'"
            lines.append(f"export {key}={quoted}")
    return "\n".join(lines) + "\n"


def render_ssh_environment(env: dict[str, str]) -> str:
    """``~/.ssh/environment`` lines (``K=v``, unquoted; multi-line values cannot travel)."""
    lines = []
    for key, value in sorted(env.items()):
        value = str(value)
        if valid_env_name(key) and "\n" not in value:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def trim_tail(data: bytes, limit: int) -> str:
    if limit >= 0 and len(data) > limit:
        data = data[len(data) - limit :]
    return data.decode("utf-8", errors="replace")


LIVE_OUTPUT_LIMIT = 4 * 1024 * 1024  # output kept for a follower that lags behind


class LiveOutput:
    """Drains a live output source into a bounded buffer, at once, whatever the follower does.

    ``read`` returns the next block of output, or None at the end. The engine blocks a
    container's output while an attached reader does not read, so the source is read
    as fast as it comes and a follower that lags never slows the kernel: past
    ``limit`` bytes waiting, output is skipped until the follower has taken what
    waits, and the follower is told how much it missed, where it was missed.
    """

    def __init__(
        self, read: Callable[[], Awaitable[bytes | None]], limit: int = LIVE_OUTPUT_LIMIT
    ) -> None:
        self._read = read
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._skipped = 0
        self._eof = False
        self._event = asyncio.Event()
        self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while (data := await self._read()) is not None:
                if not data:
                    continue
                if self._skipped or self._size + len(data) > self._limit:
                    self._skipped += len(data)
                    continue
                self._chunks.append(data)
                self._size += len(data)
                self._event.set()
        finally:
            self._eof = True
            self._event.set()

    def drop_head(self, seen: bytes) -> None:
        """Drop the longest start of what waits that ends ``seen`` (output read twice:
        once in ``seen``, once live), so each byte reaches the follower once."""
        data = b"".join(self._chunks)
        cut = overlap(seen, data)
        if cut:
            self._chunks = [data[cut:]] if cut < len(data) else []
            self._size -= cut

    async def get(self) -> bytes | None:
        """Everything that arrived since the last call; None at the end."""
        while True:
            if self._chunks or self._skipped:
                data = b"".join(self._chunks)
                if self._skipped:
                    data += SKIPPED_NOTE.format(self._skipped).encode()
                self._chunks, self._size, self._skipped = [], 0, 0
                return data
            if self._eof:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task  # a failed read raises here
                return None
            self._event.clear()
            await self._event.wait()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


SKIPPED_NOTE = "\n[backend.ai: {} bytes of output skipped here: this view fell behind]\n"


def overlap(seen: bytes, data: bytes) -> int:
    """The length of the longest start of ``data`` that is an end of ``seen``."""
    most = min(len(seen), len(data))
    if not most:
        return 0
    probe = data[: min(most, 256)]
    pos = seen.find(probe, len(seen) - most)
    while pos >= 0:
        if data.startswith(seen[pos:]):
            return len(seen) - pos
        pos = seen.find(probe, pos + 1)
    for size in range(min(most, len(probe) - 1), 0, -1):  # ends shorter than the probe
        if seen.endswith(data[:size]):
            return size
    return 0


async def chunked_text(output: LiveOutput, first: bytes = b"") -> AsyncIterator[str]:
    """Decode ``first`` then the output's batches as UTF-8 text chunks of bounded size."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    data: bytes | None = first
    while True:
        if not data:
            data = await output.get()
        if data is None:
            rest = decoder.decode(b"", final=True)
            if rest:
                yield rest
            return
        for start in range(0, len(data), LOG_CHUNK_MAX):
            text = decoder.decode(data[start : start + LOG_CHUNK_MAX])
            if text:
                yield text
        data = b""


class _Terminal:
    def __init__(self, term_id: str, kernel_id: str) -> None:
        self.term_id = term_id
        self.kernel_id = kernel_id
        self.channel: TermChannel | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending: list[bytes] = []
        self.replay: collections.deque[bytes] = collections.deque()
        self.replay_size = 0
        self.attached = True
        self.detach_timer: asyncio.TimerHandle | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.closed = False


class TerminalHub:
    """Terminal ids → live shells, with detach grace periods and output replay."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.terms: dict[str, _Terminal] = {}

    def open(self, term_id: str, kernel_id: str, cols: int, rows: int) -> Awaitable[None]:
        """Register the terminal now (so input that follows is kept), start it in the awaitable."""
        term = self.terms.get(term_id)
        if term is not None:
            if term.detach_timer:
                term.detach_timer.cancel()
                term.detach_timer = None
            term.attached = True
            return self._reattach(term, cols, rows)
        term = _Terminal(term_id, kernel_id)
        self.terms[term_id] = term
        return self._start(term, cols, rows)

    async def _reattach(self, term: _Terminal, cols: int, rows: int) -> None:
        log.info("terminal %s re-attached (kernel %s)", term.term_id, term.kernel_id)
        await term.ready
        if term.channel is not None and not term.closed:
            await term.channel.resize(cols, rows)
            if term.replay:
                self._send(term, b"".join(term.replay), replay=True)

    async def _start(self, term: _Terminal, cols: int, rows: int) -> None:
        term_id, kernel_id = term.term_id, term.kernel_id
        try:
            channel = await self.backend.spawn_terminal(
                kernel_id,
                cols,
                rows,
                on_data=lambda data: self._on_data(term, data),
                on_eof=lambda: self._on_eof(term),
            )
        except Exception as exc:  # noqa: BLE001 - any failure ends this terminal only
            log.warning("terminal %s on kernel %s failed to open: %s", term_id, kernel_id, exc)
            term.ready.set_result(None)
            self._finish(term, f"cannot open a terminal: {exc}")
            return
        log.info("terminal %s opened on kernel %s", term_id, kernel_id)
        term.channel = channel
        term.ready.set_result(None)
        if term.closed:  # closed while it was being opened
            await channel.close()
            return
        for data in term.pending:
            channel.write(data)
        term.pending.clear()

    def input(self, term_id: str, data: str) -> None:
        term = self.terms.get(term_id)
        if term is None or term.closed:
            self.backend.emit(
                {"type": protocol.TERM_CLOSED, "term_id": term_id, "reason": "no such terminal"}
            )
            return
        raw = data.encode("utf-8", errors="replace")
        if term.channel is None:
            term.pending.append(raw)
        else:
            term.channel.write(raw)

    async def resize(self, term_id: str, cols: int, rows: int) -> None:
        term = self.terms.get(term_id)
        if term is None:
            return
        await term.ready
        if term.channel is not None and not term.closed:
            await term.channel.resize(cols, rows)

    def detach(self, term_id: str) -> None:
        term = self.terms.get(term_id)
        if term is None or term.closed:
            return
        term.attached = False
        if term.detach_timer:
            term.detach_timer.cancel()
        grace = self.backend.config.term_grace
        log.info("terminal %s detached; kept for %.0f s", term_id, grace)
        loop = asyncio.get_running_loop()
        term.detach_timer = loop.call_later(
            grace, lambda: loop.create_task(self.close(term_id, "detached too long"))
        )

    def detach_all(self) -> None:
        for term_id in list(self.terms):
            self.detach(term_id)

    async def close(self, term_id: str, reason: str) -> None:
        term = self.terms.get(term_id)
        if term is None:
            self.backend.emit({"type": protocol.TERM_CLOSED, "term_id": term_id, "reason": reason})
            return
        self._finish(term, reason)
        if term.channel is not None:
            await term.channel.close()

    async def close_kernel(self, kernel_id: str, reason: str) -> None:
        for term in list(self.terms.values()):
            if term.kernel_id == kernel_id:
                await self.close(term.term_id, reason)

    async def close_all(self) -> None:
        for term_id in list(self.terms):
            await self.close(term_id, "agent shutting down")

    def _on_data(self, term: _Terminal, data: bytes) -> None:
        term.replay.append(data)
        term.replay_size += len(data)
        while term.replay_size > TERM_REPLAY_BYTES and len(term.replay) > 1:
            term.replay_size -= len(term.replay.popleft())
        if term.attached:
            self._send(term, data)

    def _send(self, term: _Terminal, data: bytes, replay: bool = False) -> None:
        text = data.decode("utf-8", errors="replace") if replay else term.decoder.decode(data)
        if text:
            self.backend.emit({"type": protocol.TERM_OUTPUT, "term_id": term.term_id, "data": text})

    def _on_eof(self, term: _Terminal) -> None:
        if not term.closed:
            self._finish(term, "shell exited")
            if term.channel is not None:
                asyncio.get_running_loop().create_task(term.channel.close())

    def _finish(self, term: _Terminal, reason: str) -> None:
        if term.closed:
            return
        term.closed = True
        if term.detach_timer:
            term.detach_timer.cancel()
        self.terms.pop(term.term_id, None)
        log.info("terminal %s closed: %s", term.term_id, reason)
        self.backend.emit({"type": protocol.TERM_CLOSED, "term_id": term.term_id, "reason": reason})
