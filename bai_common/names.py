"""What a file or directory name in a data folder may be: one rule for every way a name
enters (the REST API's upload, rename and mkdir in ``sessions_app.folder_files``, and the
SFTP server in ``agent/sftp_server.py``), and the safe form of a name a kernel wrote anyway,
for the members of a folder's zip.

A name is one path component. It may not be empty, ``.`` or ``..``, and it may not hold a
``/``, a backslash (a separator on Windows: ``..\\..\\evil.txt`` unpacks outside the target
there), a NUL or another control character, nor start with a drive (``C:``). Everything else
Linux allows is allowed (a ``:`` inside a name, as in ``12:30.log``, is kept).

Standard library only: the SFTP server runs on the kernel's python with this file beside it.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a file or directory in a folder, or None when it can."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a name"
    if "/" in name:
        return "a name must not contain '/'"
    if "\\" in name:
        return "a name must not contain a backslash ('\\'): it is a path separator on Windows"
    if "\x00" in name:
        return "a name must not contain a NUL character"
    if _CONTROL.search(name):
        return "a name must not contain control characters (line breaks, tabs, escapes)"
    if _DRIVE.match(name):
        return f"a name must not start with a drive ({name[:2]!r})"
    return None


def safe_member_name(name: str) -> str:
    """``name`` as a zip member's path component that unpacks inside its target on every
    system: what ``name_problem`` refuses becomes ``_`` (a name a kernel wrote is kept
    readable, never dropped), and text that is not valid UTF-8 is replaced."""
    text = name.encode("utf-8", "replace").decode("utf-8")
    text = _CONTROL.sub("_", text.replace("\\", "_").replace("/", "_"))
    if _DRIVE.match(text):
        text = f"{text[0]}_{text[2:]}"
    return "_" if text in ("", ".", "..") else text
