"""Strict readers of settings from the environment.

Each helper fails loudly (ImproperlyConfigured) on a value it cannot parse, so a
typo in production configuration stops the process at start instead of being
silently replaced by a default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

N = TypeVar("N", int, float)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    return _within(name, value, minimum, maximum)


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value:  # NaN passes every comparison below
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number")
    return _within(name, value, minimum, maximum)


def _within(name: str, value: N, minimum: N | None, maximum: N | None) -> N:
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} must be at most {maximum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def persistent_secret(path: Path) -> str:
    """The secret stored at ``path``, generated on first use.

    The file is written whole under a temporary name with mode 0600 and then
    hard-linked into place, so a process that starts at the same moment reads
    either nothing (and links its own, which fails) or the complete key: every
    process of one checkout ends up with the same key.
    """
    from django.core.management.utils import get_random_secret_key

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(get_random_secret_key() + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process won the race: use its key
        finally:
            tmp.unlink(missing_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    secret = path.read_text().strip()
    if len(secret) < 50:
        raise ImproperlyConfigured(
            f"{path} holds no usable secret key: delete it to make a new one"
        )
    return secret


def redis_password(url: str) -> str:
    """The password a Redis URL carries (``redis://:PASSWORD@host``, or ``?password=``)."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    return parts.password or (parse_qs(parts.query).get("password") or [""])[0]
