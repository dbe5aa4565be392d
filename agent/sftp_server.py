"""The SFTP (and SCP) server of an SFTP system session, run inside its kernel.

The agent writes this file into the kernel's home (``~/.backendai/sftp_server.py``) with its
configuration beside it (``~/.backendai/sftp.json``), and the kernel runs it as the kernel user
with Debian's python3-asyncssh (2.10.1 in bookworm). Nothing else of the project is imported:
it must run on the kernel's python alone.

What a client sees:

- key-only login against ``~/.ssh/authorized_keys`` (the session's own key pair and the owner's
  registered keys); no password, no shell, no exec but ``scp``, no forwarding;
- ``/`` lists the mounted folders and nothing else; every path is one of them or inside one;
- the real path of everything opened, listed or changed must stay inside its folder, so a
  symlink pointing elsewhere (``ln -s /etc x`` in another session) is refused, never followed;
  a link's own entry is listed and may be removed;
- a read-only folder refuses every write;
- writes that would take the owner's folders past their byte quota are refused with the
  figures (the usage of the owner's other folders comes in the configuration).

Configuration (JSON)::

    {"port": 2200, "host_key": "<path>", "authorized_keys": "<path>",
     "folders": [{"name": "data", "readonly": false}],
     "quotas": [{"max_bytes": 1073741824 | null, "other_bytes": 0, "folders": ["data"]}]}
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import posixpath
import stat
import sys

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

HOME = os.environ.get("HOME") or "/home/work"
CONFIG = os.path.join(HOME, ".backendai", "sftp.json")

log = logging.getLogger("sftp")

FAST_CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr"]

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
    """One owner's byte quota over the mounted folders they own (and their other folders)."""

    def __init__(self, max_bytes: int | None, other_bytes: int, used: int) -> None:
        self.max_bytes = max_bytes
        self.other_bytes = other_bytes
        self.used = used

    def check(self, more: int) -> None:
        if self.max_bytes is None or more <= 0:
            return
        now = self.other_bytes + self.used
        if now + more > self.max_bytes:
            message = (
                f"Write refused: your folders hold {human(now)} of your {human(self.max_bytes)} "
                f"quota; this file growing by {human(more)} would take them to {human(now + more)}."
            )
            log.warning("%s", message)
            raise SFTPFailure(message)

    def add(self, delta: int) -> None:
        self.used = max(0, self.used + delta)


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
        grows = offset + len(data) - file_obj.size
        quota = file_obj.folder.quota
        if quota is not None and grows > 0:
            try:
                quota.check(grows)
            except SFTPFailure:
                file_obj.refused = True
                raise
        written = os.pwrite(file_obj.fd, data, offset)
        end = offset + written
        if end > file_obj.size:
            if quota is not None:
                quota.add(end - file_obj.size)
            file_obj.size = end
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
                folder.quota.check(grows)
            os.truncate(target, attrs.size)
            if folder.quota is not None:
                folder.quota.add(grows)
            size_now = attrs.size
        if attrs.permissions is not None:
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

    def exit(self) -> None:
        # asyncssh 2.10 ends the subsystem without an exit status; OpenSSH's scp (which speaks
        # SFTP since 9.0) then fails although the copy succeeded.
        try:
            self.channel.exit(0)
        except Exception:  # noqa: BLE001 - the channel is already closed: nothing to say
            pass


class Server(asyncssh.SSHServer):
    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        log.info("connection from %s", conn.get_extra_info("peername"))

    def connection_lost(self, exc: Exception | None) -> None:
        log.info("connection closed%s", f": {exc}" if exc else "")

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False


def load(config: dict) -> None:
    quotas: dict[str, Quota] = {}
    for entry in config.get("quotas") or []:
        names = [n for n in entry.get("folders") or [] if isinstance(n, str)]
        used = sum(tree_bytes(os.path.join(HOME, n)) for n in names)
        quota = Quota(entry.get("max_bytes"), int(entry.get("other_bytes") or 0), used)
        for name in names:
            quotas[name] = quota
    for entry in config.get("folders") or []:
        name = entry["name"]
        if not name or "/" in name or name in (".", ".."):
            raise SystemExit(f"bad folder name {name!r}")
        FOLDERS[name] = Folder(name, bool(entry.get("readonly")), quotas.get(name))


async def serve(config: dict) -> None:
    await asyncssh.create_server(
        Server,
        "",
        int(config.get("port") or 2200),
        server_host_keys=[config["host_key"]],
        authorized_client_keys=config["authorized_keys"],
        sftp_factory=FolderSFTPServer,
        allow_scp=True,
        # AES-GCM runs in cryptography's C (AES-NI); asyncssh's chacha20-poly1305, which OpenSSH
        # clients prefer, computes its MAC in Python and caps a transfer near 15 MB/s.
        encryption_algs=FAST_CIPHERS,
        agent_forwarding=False,
        x11_forwarding=False,
        reuse_address=True,
    )
    log.info(
        "SFTP server listening on port %s; folders: %s",
        config.get("port") or 2200,
        ", ".join(f"{f.name}{' (read-only)' if f.readonly else ''}" for f in FOLDERS.values()),
    )
    await asyncio.Event().wait()


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="sftp: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    with open(sys.argv[1] if len(sys.argv) > 1 else CONFIG) as f:
        config = json.load(f)
    load(config)
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SystemExit(f"port {config.get('port')} is in use") from exc
        raise


if __name__ == "__main__":
    main()
