"""The fingerprint of an OpenSSH key as ``ssh-keygen -l`` prints it (SHA256:...).

Shared by the manager (users' registered keys) and the agent (an SFTP kernel's host key);
the standard library only.
"""

from __future__ import annotations

import base64
import hashlib


def fingerprint(blob: bytes) -> str:
    """``SHA256:<base64 without padding>`` of a key's wire blob, as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"
