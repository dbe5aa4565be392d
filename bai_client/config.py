"""Where ``bai`` keeps the manager's URL and the API token: ``$BAI_CONFIG`` or
``~/.config/bai/config.json``, readable by its owner alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def config_path() -> Path:
    override = os.environ.get("BAI_CONFIG")
    if override:
        return Path(override)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "bai" / "config.json"


def load() -> dict[str, Any]:
    path = config_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def save(data: dict[str, Any]) -> Path:
    """Write ``data`` with mode 0600 from the start (the token is never world-readable)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
