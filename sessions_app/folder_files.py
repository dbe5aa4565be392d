"""Files inside a data folder, reached only through directory file descriptors.

A folder is written by kernels: a container may leave a symlink to ``/etc`` (or
to another user's folder) anywhere in it. So no path is ever handed to the
kernel as a whole: every operation opens the folder root, then each directory
below it with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent (``dir_fd``),
and the last component with ``O_NOFOLLOW`` too. A symlink on the way is an
error that says so; a symlink in a listing is shown as one and never entered;
a tree walk (sizes, the zip, deleting) never leaves the folder.

No Django models here: the callers (selectors, services, api) pass the
folder's root path and judge who may do what.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import protocol
from bai_common.names import name_problem, safe_member_name

from .errors import Conflict, InvalidInput, NotFound, field_error

MAX_PATH_BYTES = 4096
MAX_DEPTH = 64
MAX_NAME_BYTES = 255
# A listing answers at most this many entries (``truncated`` says when there were more).
MAX_LIST_ENTRIES = 50_000
# A zip holds at most this many entries; a tree walk counts at most this many.
MAX_ARCHIVE_ENTRIES = 200_000
MAX_WALK_ENTRIES = 1_000_000
CHUNK = 1024 * 1024
UPLOAD_PREFIX = ".bai-upload-"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO a container made must not hang the server.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# --- paths ------------------------------------------------------------------------


def clean_path(
    text: object, *, field: str = "path", allow_root: bool = False, new: bool = False
) -> tuple[str, ...]:
    """A path inside a folder as its parts, or InvalidInput naming what is wrong.

    Relative, ``/``-separated, no empty, ``.`` or ``..`` part, no NUL, at most
    ``MAX_PATH_BYTES`` bytes and ``MAX_DEPTH`` levels. With ``new`` (a path to be
    made: an upload, a directory, a rename's target), every part must be a name
    ``bai_common.names`` allows (no backslash, control character or drive); an
    existing file a kernel named otherwise can still be read, renamed and removed. ``""`` is the folder
    itself, allowed only with ``allow_root``.
    """
    if not isinstance(text, str):
        raise field_error(field, "must be a string")
    if "\x00" in text:
        raise field_error(field, "must not contain a NUL character")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise field_error(field, "must be valid UTF-8") from None
    if size > MAX_PATH_BYTES:
        raise field_error(field, f"is {size} bytes long; at most {MAX_PATH_BYTES}")
    if text == "":
        if allow_root:
            return ()
        raise field_error(field, "names the folder itself; give a path inside it")
    if text.startswith("/"):
        raise field_error(field, "must be relative to the folder (no leading '/')")
    parts = tuple(text.split("/"))
    if len(parts) > MAX_DEPTH:
        raise field_error(field, f"is {len(parts)} levels deep; at most {MAX_DEPTH}")
    for part in parts:
        if part in ("", ".", ".."):
            shown = "an empty part ('//' or a trailing '/')" if part == "" else f"{part!r}"
            raise field_error(field, f"must not contain {shown}: paths stay inside the folder")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise field_error(field, f"has a name longer than {MAX_NAME_BYTES} bytes")
        if new and (problem := name_problem(part)) is not None:
            raise field_error(field, f"{part!r}: {problem}")
    return parts


def _shown(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "the folder"


def _link_error(parts: tuple[str, ...]) -> NotFound:
    return NotFound(f"'{_shown(parts)}' is a symbolic link; links are not followed.")


# --- opening ----------------------------------------------------------------------


def open_root(root: Path) -> int:
    """The folder's own directory (made by the server, never a link)."""
    try:
        return os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise NotFound("The folder's storage is missing on the server.") from exc


def _open_child_dir(parent: int, name: str, parts: tuple[str, ...]) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise _link_error(parts) from None
            raise InvalidInput(
                f"path: '{_shown(parts)}' is not a directory",
                {"path": [f"'{_shown(parts)}' is not a directory"]},
            ) from None
        if exc.errno == errno.ENOENT:
            raise NotFound(f"No such directory: '{_shown(parts)}'.") from None
        raise


def open_dir(root_fd: int, parts: tuple[str, ...], *, create: bool = False) -> int:
    """The directory at ``parts`` below the root, each level opened without
    following a link; with ``create``, missing levels are made (0o2770, the
    kernel user's when the server runs as root). The caller closes the fd."""
    fd = os.dup(root_fd)
    try:
        for depth, name in enumerate(parts, 1):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o2770, dir_fd=fd)
                    child = _open_child_dir(fd, name, parts[:depth])
                    _own(child)
                    os.close(fd)
                    fd = child
                    continue
            child = _open_child_dir(fd, name, parts[:depth])
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _own(fd: int, mode: int = 0o2770) -> None:
    """What the server makes in a folder is the kernel user's (as the folder is)."""
    if os.geteuid() == 0:
        os.fchown(fd, protocol.KERNEL_UID, protocol.KERNEL_GID)
    os.fchmod(fd, mode)


@contextlib.contextmanager
def parent_of(root: Path, parts: tuple[str, ...], *, create: bool = False) -> Iterator[int]:
    """The fd of the directory holding ``parts[-1]``, closed after."""
    root_fd = open_root(root)
    try:
        fd = open_dir(root_fd, parts[:-1], create=create)
    finally:
        os.close(root_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


# --- reading ----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    name: str
    path: str
    type: str
    size: int
    modified: float


def check_dir(root: Path, parts: tuple[str, ...]) -> None:
    """Raise as ``open_dir`` would when ``parts`` is not a directory reached without links."""
    root_fd = open_root(root)
    try:
        os.close(open_dir(root_fd, parts))
    finally:
        os.close(root_fd)


def list_dir(root: Path, parts: tuple[str, ...]) -> tuple[list[Entry], bool]:
    """A directory's entries, directories first then by name, and whether the
    listing was cut at ``MAX_LIST_ENTRIES``. Links are listed, never followed
    (size 0)."""
    root_fd = open_root(root)
    try:
        fd = open_dir(root_fd, parts)
    finally:
        os.close(root_fd)
    entries: list[Entry] = []
    truncated = False
    prefix = "/".join(parts) + "/" if parts else ""
    try:
        with os.scandir(fd) as it:
            for item in it:
                if len(entries) >= MAX_LIST_ENTRIES:
                    truncated = True
                    break
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since the directory was read
                kind = _kind(st.st_mode)
                entries.append(
                    Entry(
                        name=item.name,
                        path=prefix + item.name,
                        type=kind,
                        size=st.st_size if kind == "file" else 0,
                        modified=st.st_mtime,
                    )
                )
    finally:
        os.close(fd)
    entries.sort(key=lambda e: (e.type != "dir", e.name))
    return entries, truncated


def open_file(root: Path, parts: tuple[str, ...]) -> tuple[int, int]:
    """A regular file opened for reading (fd, size); a link anywhere on the way
    is refused (404 saying so), and so is anything that is not a regular file."""
    with parent_of(root, parts) as parent:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(parts) from None
            if exc.errno == errno.ENOENT:
                raise NotFound(f"No such file: '{_shown(parts)}'.") from None
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotFound(f"'{_shown(parts)}' is not a regular file.")
    os.set_blocking(fd, True)
    return fd, st.st_size


def read_chunks(fd: int, size: int = CHUNK) -> Iterator[bytes]:
    """The file's bytes from its fd, in chunks; the fd is closed at the end."""
    try:
        while chunk := os.read(fd, size):
            yield chunk
    finally:
        os.close(fd)


@dataclass
class Usage:
    bytes: int = 0
    files: int = 0
    complete: bool = True


def usage(root: Path, *, deadline: float, limit: int = MAX_WALK_ENTRIES) -> Usage:
    """Bytes and file count below ``root``: regular files only, links never
    followed. Stops (``complete`` False, figures so far) at the monotonic
    ``deadline``, after ``limit`` entries, or past ``MAX_DEPTH`` levels."""
    found = Usage()
    try:
        root_fd = open_root(root)
    except NotFound:
        return found
    seen = 0

    def walk(fd: int, depth: int) -> None:
        nonlocal seen
        subdirs = []
        with os.scandir(fd) as it:
            for item in it:
                seen += 1
                if seen > limit or (seen % 256 == 0 and time.monotonic() > deadline):
                    found.complete = False
                    return
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.bytes += st.st_size
                    found.files += 1
                elif stat.S_ISDIR(st.st_mode):
                    subdirs.append(item.name)
        for name in subdirs:
            if depth >= MAX_DEPTH:
                found.complete = False
                return
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # replaced by a link or removed meanwhile: not followed
            try:
                walk(child, depth + 1)
            finally:
                os.close(child)
            if not found.complete:
                return

    try:
        walk(root_fd, 0)
    finally:
        os.close(root_fd)
    return found


def archive_members(root: Path, parts: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    """(parts relative to the folder, "dir"|"file") of the tree at ``parts``,
    links and special files skipped, at most ``MAX_ARCHIVE_ENTRIES``."""
    root_fd = open_root(root)
    try:
        top = open_dir(root_fd, parts)
    finally:
        os.close(root_fd)
    count = 0

    def walk(fd: int, at: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
        nonlocal count
        with os.scandir(fd) as it:
            items = sorted(
                ((i.name, i.stat(follow_symlinks=False).st_mode) for i in it),
                key=lambda x: x[0],
            )
        for name, mode in items:
            count += 1
            if count > MAX_ARCHIVE_ENTRIES:
                raise Conflict(
                    f"The archive would hold more than {MAX_ARCHIVE_ENTRIES} entries; "
                    "download a smaller directory."
                )
            if stat.S_ISREG(mode):
                yield at + (name,), "file"
            elif stat.S_ISDIR(mode) and len(at) < MAX_DEPTH:
                yield at + (name,), "dir"
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    yield from walk(child, at + (name,))
                finally:
                    os.close(child)

    try:
        yield from walk(top, parts)
    finally:
        os.close(top)


def zip_chunks(root: Path, parts: tuple[str, ...]) -> Iterator[bytes]:
    """A zip of the tree at ``parts`` (the whole folder for ``()``), made as it is
    read: stored, not compressed (data is often compressed already, and the
    point is throughput). Names in it are relative to ``parts``, each made safe to
    unpack anywhere (``bai_common.names.safe_member_name``)."""
    import zipstream

    zs = zipstream.ZipStream(sized=False)
    base = len(parts)
    for member, kind in archive_members(root, parts):
        # A kernel may have written any name Linux allows: only safe ones go in the zip.
        arcname = "/".join(safe_member_name(name) for name in member[base:])
        if kind == "dir":
            zs.add(None, arcname + "/")
        else:
            zs.add(_lazy_file(root, member), arcname)
    yield from zs


def _lazy_file(root: Path, parts: tuple[str, ...]) -> Iterator[bytes]:
    """The file's bytes, opened only when the zip gets to it (again without
    following links: it may have been swapped for one since the walk)."""
    try:
        fd, _ = open_file(root, parts)
    except (NotFound, InvalidInput):
        return  # gone or replaced by a link meanwhile: an empty member
    yield from read_chunks(fd)


# --- writing ----------------------------------------------------------------------


def existing_file_size(root: Path, parts: tuple[str, ...]) -> int:
    """The size of the regular file an upload would replace (0 if none)."""
    try:
        with parent_of(root, parts) as parent:
            st = _lstat(parent, parts[-1])
    except (NotFound, InvalidInput):
        return 0
    return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else 0


class TooLarge(Exception):
    """Raised by ``write_file``'s stream once more than ``limit`` bytes came."""


def write_file(
    root: Path, parts: tuple[str, ...], chunks: Iterable[bytes], *, limit: int | None = None
) -> int:
    """Write ``chunks`` to ``parts`` (parents made): into a temporary file in the
    same directory, renamed over the target once complete, so a failed upload
    leaves nothing. Replaces a regular file; refuses a directory or a link in
    the way. Raises TooLarge past ``limit`` bytes. Returns the size."""
    with parent_of(root, parts, create=True) as parent:
        name = parts[-1]
        st = _lstat(parent, name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise Conflict(f"'{_shown(parts)}' exists and is a {_kind(st.st_mode)}, not a file.")
        tmp = f"{UPLOAD_PREFIX}{secrets.token_hex(8)}"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o660,
            dir_fd=parent,
        )
        size = 0
        try:
            try:
                _own(fd, 0o660)
                for chunk in chunks:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise TooLarge(size)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
    return size


def make_dir(root: Path, parts: tuple[str, ...]) -> None:
    with parent_of(root, parts, create=True) as parent:
        try:
            os.mkdir(parts[-1], 0o2770, dir_fd=parent)
        except FileExistsError:
            raise Conflict(f"'{_shown(parts)}' exists already.") from None
        fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        try:
            _own(fd)
        finally:
            os.close(fd)


def rename(root: Path, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
    """Move ``src`` (a link moves as itself) to ``dst``, which must not exist."""
    if dst[: len(src)] == src:
        raise field_error("new_path", "is inside the path being moved")
    with parent_of(root, src) as src_parent, parent_of(root, dst, create=True) as dst_parent:
        if _lstat(src_parent, src[-1]) is None:
            raise NotFound(f"No such file or directory: '{_shown(src)}'.")
        if _lstat(dst_parent, dst[-1]) is not None:
            raise Conflict(f"'{_shown(dst)}' exists already.")
        os.rename(src[-1], dst[-1], src_dir_fd=src_parent, dst_dir_fd=dst_parent)


def remove(root: Path, parts: tuple[str, ...]) -> None:
    """Delete a file, a link (itself, never its target) or a directory tree."""
    with parent_of(root, parts) as parent:
        st = _lstat(parent, parts[-1])
        if st is None:
            raise NotFound(f"No such file or directory: '{_shown(parts)}'.")
        if stat.S_ISDIR(st.st_mode):
            # rmtree with a dir_fd works on descriptors and never follows a link.
            shutil.rmtree(parts[-1], dir_fd=parent)
        else:
            os.unlink(parts[-1], dir_fd=parent)


def entry_dict(entry: Entry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "path": entry.path,
        "type": entry.type,
        "size": entry.size,
        "modified": entry.modified,
    }
