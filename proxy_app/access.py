"""Who may reach which app: the launcher's one-time links, the apps origin's own
cookie, and the app a request's host name names. Synchronous (the ORM); the proxy
calls it through ``sync_to_async`` and keeps answers for a moment (``TARGET_TTL``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import cache

from sessions_app import selectors, services
from sessions_app.errors import NotFound
from sessions_app.models import Status
from sessions_app.service_ports import App

COOKIE = "bai_app"  # the start of every app's access cookie's name (``cookie_name``)
TARGET_TTL = 2.0  # seconds a resolved target is reused (an ended session shows within it)


@dataclass(frozen=True)
class Target:
    session_id: str
    kernel_id: str
    agent_id: str | None
    app: App
    running: bool
    status: str
    secret: str


def parse_host(host: str) -> tuple[str, str] | None:
    """(session id, app name) from ``<session hex>-<app>.<apps host>[:port]``."""
    label = host.split(".", 1)[0].lower()
    hexpart, _, app = label.partition("-")
    if len(hexpart) != 32 or not app:
        return None
    try:
        return str(uuid.UUID(hexpart)), app
    except ValueError:
        return None


def trade_link(token: str, session_id: str, app: str) -> int | None:
    """The user id of a valid, unused launcher link for this very app, else None."""
    try:
        data = signing.loads(token, salt=services.APP_LINK_SALT, max_age=settings.BAI_APP_LINK_TTL)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("s") != session_id or data.get("a") != app:
        return None
    # One use: a link seen in a log or a browser's history opens nothing.
    if not cache.add(f"bai:applink:{data.get('n')}", 1, settings.BAI_APP_LINK_TTL + 5):
        return None
    return int(data["u"])


def cookie_name(session_id: str, app: str, *, secure: bool) -> str:
    """The name of one app's access cookie: its own (``bai_app_<host label>``), so a cookie
    another app tossed onto a shared parent domain never shadows it, and ``__Host-``
    over HTTPS, where the browser then refuses it from any other host."""
    label = services.app_host_label(session_id=session_id, app=app)
    return f"{'__Host-' if secure else ''}{COOKIE}_{label}"


def is_access_cookie(name: str) -> bool:
    """Whether ``name`` is one of the proxy's own cookies (never an app's to read or set)."""
    return name.removeprefix("__Host-").startswith(COOKIE)


def make_cookie(user_id: int, session_id: str, app: str) -> str:
    return signing.dumps({"u": user_id, "s": session_id, "a": app}, salt=services.APP_COOKIE_SALT)


def read_cookie(values: list[str], session_id: str, app: str) -> int | None:
    """The user id of the first valid access cookie among ``values`` (all the values the
    browser sent under this app's cookie name), else None."""
    for value in values:
        user_id = _read_one(value, session_id, app)
        if user_id is not None:
            return user_id
    return None


def _read_one(value: str, session_id: str, app: str) -> int | None:
    try:
        data = signing.loads(
            value, salt=services.APP_COOKIE_SALT, max_age=settings.BAI_APP_COOKIE_TTL
        )
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("s") != session_id or data.get("a") != app:
        return None
    return int(data["u"])


def resolve(*, user_id: int, session_id: str, app: str) -> Target | None:
    """The app if this user may open it now (owner or admin), else None."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    try:
        session = selectors.get_session_for_user(user=user, session_id=session_id)
    except NotFound:
        return None
    found = selectors.session_app(session=session, name=app)
    if found is None:
        return None
    main = next((k for k in session.kernels.all() if k.cluster_role == "main"), None)
    return Target(
        session_id=session_id,
        kernel_id=str(main.pk) if main else session_id,
        agent_id=main.agent_id if main else None,
        app=found,
        running=session.status == Status.RUNNING and main is not None and main.agent_id is not None,
        status=session.status,
        secret=services.app_secret(session_id=session_id, app=app) if found.start_command else "",
    )


def resolve_token_user(header: str) -> Any:
    """The user of an ``Authorization: Token ...`` API token (the ``bai`` client), or None."""
    from rest_framework.exceptions import AuthenticationFailed

    from sessions_app.tokens import ExpiringTokenAuthentication

    kind, _, key = header.partition(" ")
    if kind.lower() != "token" or not key:
        return None
    try:
        user, _ = ExpiringTokenAuthentication().authenticate_credentials(key.strip().encode())
    except AuthenticationFailed:
        return None
    return user


def touch(session_id: str) -> None:
    services.session_touch(session_id=session_id)


_targets: dict[tuple[int, str, str], tuple[float, Target | None]] = {}


def cached_resolve(user_id: int, session_id: str, app: str) -> Target | None:
    key = (user_id, session_id, app)
    hit = _targets.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[0] < TARGET_TTL:
        return hit[1]
    target = resolve(user_id=user_id, session_id=session_id, app=app)
    if len(_targets) > 10_000:
        _targets.clear()
    _targets[key] = (now, target)
    return target
