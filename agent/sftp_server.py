"""The SFTP (and SCP) server of an SFTP system session, run inside its kernel.

The agent writes this file into the kernel's home (``~/.backendai/sftp_server.py``) with its
configuration beside it (``~/.backendai/sftp.json``), and the kernel runs it as the kernel user
with Debian's python3-asyncssh (2.10.1 in bookworm) and OpenSSH's ``sshd`` (9.2 in bookworm).
Of the project it imports only ``bai_common/names.py`` (standard library only), which the agent
writes beside it: it must run on the kernel's python alone.

Two parts, one file:

- ``sftp_server.py`` (the kernel's command) measures the folders' usage for the quota into a
  small shared ledger, writes an ``sshd_config`` and runs Debian's ``sshd`` as the kernel user
  in the foreground (its log is the kernel's log, with the lines the sessions send it). sshd
  does the SSH side in C: key exchange, ciphers, windows, key-only login against
  ``~/.ssh/authorized_keys``, and refuses shells, terminals and forwarding. Its
  ``ForceCommand`` runs the second part for every session, whatever the client asked.
- ``sftp_server.py session`` speaks SFTP on its stdin/stdout (asyncssh's SFTP server with the
  policy below), or legacy SCP when the client ran ``scp -O``; anything else is refused.

asyncssh did all of it in one process until 2026-11-23, but its SSH packet handling in Python
capped a transfer near 50 MB/s on one core; sshd carries the bytes several times faster.

What a client sees:

- key-only login against ``~/.ssh/authorized_keys`` (the session's own key pair and the owner's
  registered keys); no password, no shell, no exec but ``scp``, no forwarding;
- ``/`` lists the mounted folders and nothing else; every path is one of them or inside one;
- the real path of everything opened, listed or changed must stay inside its folder, so a
  symlink pointing elsewhere (``ln -s /etc x`` in another session) is refused, never followed;
  a link's own entry is listed and may be removed;
- a read-only folder refuses every write;
- a new name (a file, a directory, a rename's target) follows the project's rule
  (``bai_common/names.py``: no backslash, control character or leading drive);
- no file gets a set-user-ID or set-group-ID bit (a directory may keep set-group-ID, which
  only passes its group on), by chmod nor by an open's or mkdir's attributes;
- writes that would take the owner's folders past their byte quota are refused with the
  figures (the usage of the owner's other folders comes in the configuration); the bytes in
  use are one ledger shared by all of the session's connections, under a lock, measured on
  disk again before a connection's writes (at most every ``REMEASURE_SECONDS``: kernels of
  other sessions write there too), and every write is refused while they are over.

Configuration (JSON)::

    {"port": 2200, "host_key": "<path>", "authorized_keys": "<path>",
     "folders": [{"name": "data", "readonly": false}],
     "quotas": [{"max_bytes": 1073741824 | null, "other_bytes": 0, "folders": ["data"]}]}
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import posixpath
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import asyncssh
from asyncssh.sftp import (
    FXF_APPEND,
    FXF_CREAT,
    FXF_EXCL,
    FXF_READ,
    FXF_TRUNC,
    FXF_WRITE,
    SFTPAttrs,
    SFTPFailure,
    SFTPNoSuchFile,
    SFTPOpUnsupported,
    SFTPPermissionDenied,
)

# The project's rule for names; in a kernel, the agent writes it beside this file.
from bai_common.names import name_problem

HOME = os.environ.get("HOME") or "/home/work"
STATE = os.path.join(HOME, ".backendai")
CONFIG = os.path.join(STATE, "sftp.json")
LEDGER = os.path.join(STATE, "sftp_quota")  # bytes in use per quota, 8 bytes each
LOG_SOCKET = os.path.join(STATE, "sftp_log.sock")  # sessions' log lines to the kernel's log
SSHD_CONFIG = os.path.join(STATE, "sftp_sshd_config")
SSHD = "/usr/sbin/sshd"
SUBSYSTEM = "bai-sftp"
PIPE_SIZE = 1 << 20
REMEASURE_SECONDS = 10.0  # how often a connection measures its folders again before a write
READ_BUFFER = 4 << 20  # the largest read answered at once, as asyncssh's own limit
MAX_MESSAGE_IN = 8 << 20  # a request's length, as read: asyncssh's own reads stop at 4 MiB
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
)  # what sshd hands the forced command for the "sftp" subsystem

log = logging.getLogger("sftp")

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human(size: int) -> str:
    """``943718400`` -> ``900.0 MiB``: one decimal, the largest binary unit below the size."""
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


def tree_bytes(path: str) -> int:
    """Bytes of the regular files under ``path``; links are never followed."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


class Quota:
    """One owner's byte quota over the mounted folders they own (and their other folders).

    The bytes in use live in the ledger at ``index`` (every connection is its own process):
    ``reserve`` checks and counts a growth in one step under the ledger's lock, so two
    uploads at once cannot both pass the last free bytes."""

    def __init__(self, max_bytes: int | None, other_bytes: int, index: int, ledger: int) -> None:
        self.max_bytes = max_bytes
        self.other_bytes = other_bytes
        self.offset = index * 8
        self.ledger = ledger
        self.folders: list[str] = []
        self.measured = float("-inf")

    def remeasure(self) -> None:
        """Kernels write to the folders too (no filesystem quota stops them): before a
        write, the ledger takes the bytes on disk again, at most every REMEASURE_SECONDS
        in a connection; then refuse any write while the folders are over the quota."""
        now = time.monotonic()
        if now - self.measured >= REMEASURE_SECONDS:
            self.measured = now
            used = sum(tree_bytes(os.path.join(HOME, name)) for name in self.folders)
            fcntl.flock(self.ledger, fcntl.LOCK_EX)
            try:
                os.pwrite(self.ledger, struct.pack("<q", used), self.offset)
            finally:
                fcntl.flock(self.ledger, fcntl.LOCK_UN)
        if self.max_bytes is None:
            return
        now_used = self.other_bytes + self._used()
        if now_used > self.max_bytes:
            message = (
                f"Write refused: your folders hold {human(now_used)}, over your "
                f"{human(self.max_bytes)} quota (sessions wrote past it); delete files first."
            )
            log.warning("%s", message)
            raise SFTPFailure(message)

    def _used(self) -> int:
        raw = os.pread(self.ledger, 8, self.offset)
        return struct.unpack("<q", raw)[0] if len(raw) == 8 else 0

    def _update(self, delta: int, check: bool) -> None:
        fcntl.flock(self.ledger, fcntl.LOCK_EX)
        try:
            raw = os.pread(self.ledger, 8, self.offset)
            used = struct.unpack("<q", raw)[0] if len(raw) == 8 else 0
            if check and self.max_bytes is not None:
                now = self.other_bytes + used
                if now + delta > self.max_bytes:
                    message = (
                        f"Write refused: your folders hold {human(now)} of your "
                        f"{human(self.max_bytes)} quota; this file growing by {human(delta)} "
                        f"would take them to {human(now + delta)}."
                    )
                    log.warning("%s", message)
                    raise SFTPFailure(message)
            os.pwrite(self.ledger, struct.pack("<q", max(0, used + delta)), self.offset)
        finally:
            fcntl.flock(self.ledger, fcntl.LOCK_UN)

    def reserve(self, more: int) -> None:
        """Count ``more`` bytes of growth, or refuse it with the figures (SFTPFailure)."""
        if more > 0:
            self._update(more, check=True)

    def add(self, delta: int) -> None:
        if delta:
            self._update(delta, check=False)


class Folder:
    def __init__(self, name: str, readonly: bool, quota: Quota | None) -> None:
        self.name = name
        self.readonly = readonly
        self.quota = quota
        self.real = os.path.realpath(os.path.join(HOME, name)).encode()

    def contains(self, real: bytes) -> bool:
        return real == self.real or real.startswith(self.real + b"/")


class Handle:
    """An open file: its descriptor, and what a write may add to its folder's quota."""

    def __init__(self, fd: int, folder: Folder, path: bytes, size: int, created: bool) -> None:
        self.fd = fd
        self.folder = folder
        self.path = path
        self.size = size
        self.created = created
        self.refused = False
        self.append = False


FOLDERS: dict[str, Folder] = {}


class FolderSFTPServer(asyncssh.SFTPServer):
    """An SFTP view of the mounted folders only (see the module's docstring)."""

    # --- paths ------------------------------------------------------------------------

    def _locate(self, path: bytes) -> tuple[Folder | None, bytes]:
        """The folder a client path is in (None: the root) and the path's local form."""
        vpath = posixpath.normpath(posixpath.join(b"/", path))
        parts = [p for p in vpath.split(b"/") if p]
        if not parts:
            return None, HOME.encode()
        name = parts[0].decode("utf-8", "surrogateescape")
        folder = FOLDERS.get(name)
        if folder is None:
            raise SFTPNoSuchFile(f"No such file: only your folders ({', '.join(FOLDERS)}) are here")
        return folder, posixpath.join(folder.real, *parts[1:]) if parts[1:] else folder.real

    def _resolve(
        self, path: bytes, *, follow: bool = True, write: bool = False
    ) -> tuple[Folder | None, bytes]:
        """A client path as a checked real local path: inside its folder, or refused.

        ``follow``: the last component is followed (a link must point inside the folder);
        else only its parent is resolved (the link itself is meant: lstat, remove, rename).
        """
        folder, local = self._locate(path)
        if folder is None:
            if write:
                raise SFTPPermissionDenied("Only the folders live here: write inside one of them")
            return None, local
        if follow:
            real = os.path.realpath(local)
        else:
            parent, base = posixpath.split(local)
            real = posixpath.join(os.path.realpath(parent), base) if base else local
        if not folder.contains(real):
            raise SFTPPermissionDenied(
                "Refused: that path leads outside the folder (symbolic links are not followed there)"
            )
        if write and folder.readonly:
            raise SFTPPermissionDenied(f"Folder '{folder.name}' is read-only")
        return folder, real

    @staticmethod
    def _check_name(real: bytes) -> None:
        """A name about to be made: refused unless the project's rule allows it."""
        name = posixpath.basename(real).decode("utf-8", "surrogateescape")
        problem = name_problem(name)
        if problem is not None:
            raise SFTPPermissionDenied(f"Refused: {name!r}: {problem}")

    @staticmethod
    def _check_mode(attrs: SFTPAttrs, is_dir: bool) -> None:
        """Refuse a set-user-ID bit, and a set-group-ID bit on anything but a directory:
        a kernel that runs such a file would run it as its owner or group."""
        mode = attrs.permissions
        if mode is None:
            return
        if mode & stat.S_ISUID or (mode & stat.S_ISGID and not is_dir):
            raise SFTPPermissionDenied(
                f"Refused: mode {mode & 0o7777:04o} sets the set-user-ID or set-group-ID bit,"
                " which files in folders may not have"
            )

    def map_path(self, path: bytes) -> bytes:
        # Whatever asyncssh does by itself with a path (statvfs, scp's helpers) stays confined.
        return self._resolve(path)[1]

    def reverse_map_path(self, path: bytes) -> bytes:
        for folder in FOLDERS.values():
            if folder.contains(path):
                return b"/" + folder.name.encode() + path[len(folder.real) :]
        if path == HOME.encode():
            return b"/"
        raise SFTPNoSuchFile("No such file")

    # --- reads --------------------------------------------------------------------------

    def realpath(self, path: bytes) -> bytes:
        folder, real = self._resolve(path)
        return b"/" if folder is None else self.reverse_map_path(real)

    def listdir(self, path: bytes) -> list[bytes]:
        folder, real = self._resolve(path)
        if folder is None:
            return [b".", b".."] + [name.encode() for name in FOLDERS]
        return [b".", b".."] + os.listdir(real)

    def lstat(self, path: bytes) -> os.stat_result:
        return os.lstat(self._resolve(path, follow=False)[1])

    def stat(self, path: bytes) -> os.stat_result:
        return os.stat(self._resolve(path)[1])

    def readlink(self, path: bytes) -> bytes:
        _, link = self._resolve(path, follow=False)
        if not os.path.islink(link):
            raise SFTPFailure("Not a symbolic link")
        return self.reverse_map_path(self._resolve(path)[1])

    # --- files --------------------------------------------------------------------------

    def open(self, path: bytes, pflags: int, attrs: SFTPAttrs) -> Handle:
        writes = bool(pflags & (FXF_WRITE | FXF_APPEND | FXF_CREAT | FXF_TRUNC))
        folder, real = self._resolve(path, write=writes)
        if folder is None:
            raise SFTPFailure("The root is not a file")
        flags = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        if pflags & FXF_WRITE and pflags & FXF_READ:
            flags |= os.O_RDWR
        elif writes:
            flags |= os.O_WRONLY
        else:
            flags |= os.O_RDONLY
        for bit, flag in ((FXF_APPEND, os.O_APPEND), (FXF_CREAT, os.O_CREAT)):
            if pflags & bit:
                flags |= flag
        if pflags & FXF_EXCL:
            flags |= os.O_EXCL
        before = None
        try:
            before = os.lstat(real)
        except FileNotFoundError:
            pass
        if before is None and pflags & FXF_CREAT:
            self._check_name(real)
        if writes:
            self._check_mode(attrs, is_dir=False)
            if folder.quota is not None:
                folder.quota.remeasure()
        perms = 0o666 if attrs.permissions is None else attrs.permissions & 0o777
        fd = os.open(real, flags, perms)
        if pflags & FXF_TRUNC:
            if folder.quota is not None and before is not None and stat.S_ISREG(before.st_mode):
                folder.quota.add(-before.st_size)
            os.ftruncate(fd, 0)
        handle = Handle(fd, folder, real, os.fstat(fd).st_size, before is None)
        handle.append = bool(pflags & FXF_APPEND)
        return handle

    def read(self, file_obj: Handle, offset: int, size: int) -> bytes:
        return os.pread(file_obj.fd, size, offset)

    def write(self, file_obj: Handle, offset: int, data: bytes) -> int:
        if file_obj.folder.readonly:
            raise SFTPPermissionDenied(f"Folder '{file_obj.folder.name}' is read-only")
        if file_obj.append:
            offset = file_obj.size
        grows = max(0, offset + len(data) - file_obj.size)
        quota = file_obj.folder.quota
        if quota is not None and grows:
            try:
                quota.reserve(grows)
            except SFTPFailure:
                file_obj.refused = True
                raise
        written = 0
        try:
            written = os.pwrite(file_obj.fd, data, offset)
        finally:
            end = offset + written
            grew = max(0, end - file_obj.size)
            if quota is not None and grew != grows:
                quota.add(grew - grows)
            file_obj.size = max(file_obj.size, end)
        return written

    def close(self, file_obj: Handle) -> None:
        os.close(file_obj.fd)
        if file_obj.refused and file_obj.created:
            # A refused upload of a new file leaves nothing behind.
            try:
                os.unlink(file_obj.path)
                if file_obj.folder.quota is not None:
                    file_obj.folder.quota.add(-file_obj.size)
            except OSError:
                pass

    def fstat(self, file_obj: Handle) -> os.stat_result:
        return os.fstat(file_obj.fd)

    def fsync(self, file_obj: Handle) -> None:
        os.fsync(file_obj.fd)

    def _set(self, target: int | bytes, folder: Folder, attrs: SFTPAttrs, size_now: int) -> int:
        """setstat/fsetstat: size (a truncate, counted), permissions and times; never owners."""
        if attrs.size is not None:
            grows = attrs.size - size_now
            if folder.quota is not None:
                folder.quota.reserve(grows)
            try:
                os.truncate(target, attrs.size)
            except OSError:
                if folder.quota is not None:
                    folder.quota.add(-max(0, grows))
                raise
            if folder.quota is not None and grows < 0:
                folder.quota.add(grows)
            size_now = attrs.size
        if attrs.permissions is not None:
            self._check_mode(attrs, is_dir=stat.S_ISDIR(os.stat(target).st_mode))
            os.chmod(target, attrs.permissions & 0o7777)
        if attrs.atime is not None and attrs.mtime is not None:
            os.utime(target, (attrs.atime, attrs.mtime))
        return size_now

    def setstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        folder, real = self._resolve(path, write=True)
        assert folder is not None
        current = os.stat(real)
        self._set(real, folder, attrs, current.st_size if stat.S_ISREG(current.st_mode) else 0)

    def fsetstat(self, file_obj: Handle, attrs: SFTPAttrs) -> None:
        if file_obj.folder.readonly:
            raise SFTPPermissionDenied(f"Folder '{file_obj.folder.name}' is read-only")
        file_obj.size = self._set(file_obj.fd, file_obj.folder, attrs, file_obj.size)

    # --- names --------------------------------------------------------------------------

    def _changeable(self, path: bytes) -> tuple[Folder, bytes]:
        folder, real = self._resolve(path, follow=False, write=True)
        if folder is None or real == folder.real:
            raise SFTPPermissionDenied("A folder itself cannot be removed or renamed over SFTP")
        return folder, real

    def mkdir(self, path: bytes, attrs: SFTPAttrs) -> None:
        _, real = self._changeable(path)
        self._check_name(real)
        self._check_mode(attrs, is_dir=True)
        os.mkdir(real, 0o777 if attrs.permissions is None else attrs.permissions & 0o777)

    def rmdir(self, path: bytes) -> None:
        os.rmdir(self._changeable(path)[1])

    def remove(self, path: bytes) -> None:
        folder, real = self._changeable(path)
        st = os.lstat(real)
        os.unlink(real)  # a link is removed itself; its target is never touched
        if folder.quota is not None and stat.S_ISREG(st.st_mode):
            folder.quota.add(-st.st_size)

    def _rename(self, oldpath: bytes, newpath: bytes, replace: bool) -> None:
        old_folder, old = self._changeable(oldpath)
        new_folder, new = self._changeable(newpath)
        if old_folder is not new_folder:
            raise SFTPOpUnsupported("Move between folders: copy, then remove the original")
        self._check_name(new)
        replaced = None
        try:
            replaced = os.lstat(new)
        except FileNotFoundError:
            pass
        if replaced is not None and not replace:
            raise SFTPFailure("File already exists")
        os.replace(old, new)
        if new_folder.quota is not None and replaced is not None:
            if stat.S_ISREG(replaced.st_mode):
                new_folder.quota.add(-replaced.st_size)

    def rename(self, oldpath: bytes, newpath: bytes) -> None:
        self._rename(oldpath, newpath, replace=False)

    def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        self._rename(oldpath, newpath, replace=True)

    def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        raise SFTPOpUnsupported("Links cannot be made over SFTP here")

    def link(self, oldpath: bytes, newpath: bytes) -> None:
        raise SFTPOpUnsupported("Links cannot be made over SFTP here")


# --- the kernel's command: the ledger, sshd, and the sessions' log ---------------------------


def sshd_config(config: dict) -> str:
    """sshd for the kernel user: key-only, every session forced into this file's session mode."""
    here = os.path.abspath(__file__)
    return f"""\
# sshd of an SFTP system session (written by {here}): key-only, SFTP and SCP only
ListenAddress 0.0.0.0
Port {int(config.get("port") or 2200)}
HostKey {config["host_key"]}
PidFile {os.path.join(STATE, "sftp_sshd.pid")}
AuthorizedKeysFile {config["authorized_keys"]}
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
PermitRootLogin no
PermitUserEnvironment no
PermitUserRC no
DisableForwarding yes
PermitTTY no
PermitTunnel no
PrintMotd no
PrintLastLog no
UseDNS no
LogLevel INFO
# AES-GCM runs on the CPU's AES instructions: OpenSSH's client would pick chacha20-poly1305 or
# AES-CTR first if offered, at half the speed on the 2-CPU VM (bench/README.md, SFTP throughput).
Ciphers {",".join(CIPHERS)}
Subsystem sftp {SUBSYSTEM}
ForceCommand exec python3 -W ignore {shlex.quote(here)} session
"""


def write_ledger(config: dict) -> None:
    """The bytes each quota's folders hold now, as the sessions' shared starting point."""
    usage = [
        sum(tree_bytes(os.path.join(HOME, n)) for n in entry.get("folders") or [])
        for entry in config.get("quotas") or []
    ]
    tmp = f"{LEDGER}.tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(struct.pack("<q", used) for used in usage))
    os.replace(tmp, LEDGER)


def _relay_logs(sock: socket.socket) -> None:
    while True:
        try:
            line = sock.recv(4096)
        except OSError:
            return
        sys.stderr.write(f"sftp: {line.decode('utf-8', 'replace').rstrip()}\n")


def serve(config: dict) -> int:
    """The kernel's command: the ledger, then sshd in the foreground until it ends (or the
    kernel is stopped); the sessions' log lines are written to the kernel's log meanwhile."""
    write_ledger(config)
    with open(SSHD_CONFIG, "w") as f:
        f.write(sshd_config(config))
    if os.path.exists(LOG_SOCKET):
        os.unlink(LOG_SOCKET)
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(LOG_SOCKET)
    threading.Thread(target=_relay_logs, args=(sink,), daemon=True).start()
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", SSHD_CONFIG])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sshd.terminate())
    log.info(
        "SFTP server (OpenSSH sshd) on port %s; folders: %s",
        config.get("port") or 2200,
        ", ".join(f"{f.name}{' (read-only)' if f.readonly else ''}" for f in FOLDERS.values()),
    )
    return sshd.wait()


# --- one SSH session: SFTP or SCP on stdin/stdout --------------------------------------------


class _Channel:
    """What asyncssh's SFTP and SCP servers ask of their SSH channel, for a process whose
    stdin/stdout are the channel (sshd holds the real one)."""

    def __init__(self) -> None:
        self.status = 0

    def exit(self, status: int) -> None:
        self.status = status

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    async def wait_closed(self) -> None:
        return None


class _Reader:
    def __init__(self, reader: asyncio.StreamReader, logger: object) -> None:
        self._reader = reader
        self.logger = logger

    async def read(self, n: int = -1) -> bytes:
        return await self._reader.read(n)

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        if n > MAX_MESSAGE_IN:  # a length no client sends: end the session, hold nothing
            raise EOFError(f"an SFTP message of {n} bytes")
        return await self._reader.readexactly(n)  # IncompleteReadError is an EOFError

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class _Writer:
    """stdout, written straight through: a blocking ``os.write`` per SFTP reply. One session
    is one process serving its requests in turn, so waiting here is the flow control (sshd
    reads the pipe as its channel window opens) and nothing is queued or copied again."""

    def __init__(self, fd: int, channel: _Channel, logger: object) -> None:
        self.fd = fd
        self.channel = channel
        self.logger = logger

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]  # BrokenPipeError: the client is gone

    def write_parts(self, head: bytes, body: memoryview) -> None:
        sent = os.writev(self.fd, [head, body])
        if sent < len(head):
            self.write(head[sent:])
            sent = len(head)
        self.write(body[sent - len(head) :])  # type: ignore[arg-type]

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


async def _stdin() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=PIPE_SIZE, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    return reader


# OpenSSH's limits@openssh.com, as its own sftp-server answers it: with it OpenSSH's sftp and
# scp (8.6+) move 255 KiB per request instead of 32 KiB, so the Python side of every request
# is paid 8 times less often. Its largest message is 256 KiB.
SFTP_MAX_MESSAGE = 256 * 1024
SFTP_MAX_IO = SFTP_MAX_MESSAGE - 1024


class _Limits:
    def encode(self, version: int) -> bytes:
        return struct.pack(">QQQQ", SFTP_MAX_MESSAGE, SFTP_MAX_IO, SFTP_MAX_IO, 0)


def _handler_class() -> type:
    """asyncssh's SFTP server session with limits@openssh.com (asyncssh 2.10 lacks it), and
    file reads answered from one reused buffer: ``preadv`` into it, ``writev`` of the reply's
    header and the bytes, where asyncssh would copy each reply three times in Python."""
    from asyncssh.packet import SSHPacket
    from asyncssh.sftp import FXP_DATA, FXP_EXTENDED_REPLY, FXP_READ, SFTPServerHandler

    async def process_limits(self: object, packet: object) -> _Limits:
        packet.check_end()  # type: ignore[attr-defined]
        return _Limits()

    class Handler(SFTPServerHandler):
        _extensions = [*SFTPServerHandler._extensions, (b"limits@openssh.com", b"1")]
        _return_types = {
            **SFTPServerHandler._return_types,
            b"limits@openssh.com": FXP_EXTENDED_REPLY,
        }
        _packet_handlers = {
            **SFTPServerHandler._packet_handlers,
            b"limits@openssh.com": process_limits,
        }
        _buffer = memoryview(bytearray(READ_BUFFER))

        async def _process_packet(self, pkttype: int, pktid: int, packet: SSHPacket) -> None:
            if pkttype == FXP_READ and self._version == 3 and self._read(pktid, packet):
                return
            await super()._process_packet(pkttype, pktid, packet)

        def _read(self, pktid: int, packet: SSHPacket) -> bool:
            """Answer a read of an open file with data; False: asyncssh answers instead (a
            malformed request, an unknown handle, the end of the file, an error)."""
            try:
                request = SSHPacket(packet.get_remaining_payload())
                handle, offset = request.get_string(), request.get_uint64()
                length = request.get_uint32()
                request.check_end()
            except Exception:  # noqa: BLE001 - asyncssh reports it with its own words
                return False
            file_obj = self._file_handles.get(handle)
            if not isinstance(file_obj, Handle) or not length:
                return False
            try:
                n = os.preadv(file_obj.fd, [self._buffer[: min(length, READ_BUFFER)]], offset)
            except OSError:
                return False
            if not n:
                return False
            header = struct.pack(">IBII", 9 + n, FXP_DATA, pktid, n)
            self._writer.write_parts(header, self._buffer[:n])
            return True

    return Handler


async def session(command: str) -> int:
    """Serve one SSH session's request (``command``: what the client asked sshd to run)."""
    from asyncssh.logging import logger as ssh_logger
    from asyncssh.scp import run_scp_server
    from asyncssh.sftp import MAX_SFTP_VERSION

    for fd in (0, 1):  # bigger pipes to and from sshd: fewer, larger reads and writes
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    channel = _Channel()
    reader = _Reader(await _stdin(), ssh_logger)
    writer = _Writer(sys.stdout.fileno(), channel, ssh_logger)
    server = FolderSFTPServer(channel)  # type: ignore[arg-type]
    if command == SUBSYSTEM:
        handler = _handler_class()(server, reader, writer, MAX_SFTP_VERSION)
        await handler.run()
    elif command.split(" ", 1)[0] == "scp":
        await run_scp_server(server, command, reader, writer, writer)  # type: ignore[arg-type]
    else:
        sys.stderr.write("This server offers SFTP and SCP only: no shell, no commands.\n")
        return 1
    writer.close()
    return channel.status


class _LogToKernel(logging.Handler):
    """A session's log lines, sent to the kernel's command (which writes the kernel's log)."""

    def __init__(self) -> None:
        super().__init__()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sock.sendto(self.format(record).encode()[:4000], LOG_SOCKET)
        except OSError:
            pass


def load(config: dict, ledger: int | None = None) -> None:
    quotas: dict[str, Quota] = {}
    for index, entry in enumerate(config.get("quotas") or []):
        if ledger is None or entry.get("max_bytes") is None:
            continue  # no limit: nothing to count
        quota = Quota(int(entry["max_bytes"]), int(entry.get("other_bytes") or 0), index, ledger)
        for name in entry.get("folders") or []:
            if isinstance(name, str):
                quotas[name] = quota
                quota.folders.append(name)
    for entry in config.get("folders") or []:
        name = entry["name"]
        if not name or "/" in name or name in (".", ".."):
            raise SystemExit(f"bad folder name {name!r}")
        FOLDERS[name] = Folder(name, bool(entry.get("readonly")), quotas.get(name))


def main() -> None:
    args = sys.argv[1:]
    mode = args.pop(0) if args and args[0] in ("serve", "session") else "serve"
    with open(args[0] if args else CONFIG) as f:
        config = json.load(f)
    if mode == "serve":
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="sftp: %(message)s")
        load(config)
        sys.exit(serve(config))
    logging.getLogger().addHandler(_LogToKernel())
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    ledger = os.open(LEDGER, os.O_RDWR | os.O_CLOEXEC)
    load(config, ledger)
    sys.exit(asyncio.run(session(os.environ.get("SSH_ORIGINAL_COMMAND", ""))))


if __name__ == "__main__":
    main()
