"""Who may come in: the browser websockets' origin check, ``Authorization:
Token <token>`` on websockets, and the limits on failed logins (django-axes on
the login pages, a DRF throttle on the token endpoint)."""

from __future__ import annotations

import hashlib
import math
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port, validate_host
from django.shortcuts import render
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from .tokens import user_for_token

# --- websockets -------------------------------------------------------------

_DEFAULT_PORTS = {"http": "80", "https": "443"}
_LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]


def _without_default_port(netloc: str, scheme: str) -> str:
    host, _, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
    if host and port == _DEFAULT_PORTS.get(scheme):
        return host
    return netloc


def is_same_origin(origin: str, host: str | None) -> bool:
    """Whether a page at ``origin`` belongs to this site, reached as ``host``.

    The origin's host *and port* must be the Host the request came to, and
    that host an allowed one; or the origin is listed in CSRF_TRUSTED_ORIGINS
    (a proxy in front that rewrites Host).
    """
    origin = origin.strip().rstrip("/").lower()
    if origin in (o.rstrip("/").lower() for o in settings.CSRF_TRUSTED_ORIGINS):
        return True
    parts = urlsplit(origin)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc or host is None:
        return False
    host = host.strip().lower()
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS or (_LOOPBACK_HOSTS if settings.DEBUG else [])
    if not domain or not validate_host(domain, allowed):
        return False
    return _without_default_port(parts.netloc, parts.scheme) == _without_default_port(
        host, parts.scheme
    )


class SameOriginValidator:
    """Browser websockets only from pages of this site.

    channels' ``AllowedHostsOriginValidator`` compares the Origin's host name
    alone, so any other page served on the same machine (another port on
    localhost) could open a terminal with the user's cookie. Here the Origin
    must name the very host and port the socket was opened on.

    Browsers always send an Origin on a websocket handshake; a client without
    one is not a browser and is let through without its cookies: only a token
    (``Authorization: Token``) can log it in.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = [(bytes(k), bytes(v)) for k, v in scope.get("headers") or []]
        values = dict(headers)
        origin = values.get(b"origin")
        if origin is None:
            scope = dict(scope, headers=[(k, v) for k, v in headers if k != b"cookie"])
            return await self.application(scope, receive, send)
        host = values.get(b"host")
        if is_same_origin(origin.decode("latin-1"), host.decode("latin-1") if host else None):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    return user_for_token(key) or AnonymousUser()


class TokenAuthMiddleware(BaseMiddleware):
    """``Authorization: Token <token>`` for websocket API clients (the browser
    uses its login cookie through AuthMiddlewareStack)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("token "):
            scope = dict(scope, user=await _user_for_token(auth[6:].strip()))
        return await super().__call__(scope, receive, send)


# --- failed logins: the token endpoint ---------------------------------------


class LoginFailureThrottle(BaseThrottle):
    """Refuses token requests after too many failed ones.

    A client address that failed ``BAI_LOGIN_FAILURE_LIMIT`` times for one
    user name within ``BAI_LOGIN_COOLOFF`` seconds is refused for that name
    for the next ``BAI_LOGIN_COOLOFF`` seconds (any password, right or wrong);
    an address that failed ten times as often over any names is refused for
    all. Other addresses are not affected, so an attacker cannot lock a user
    out. Only failures count: the view calls ``record_failure``. Counters
    live in the shared cache, so every server process sees them.
    """

    def _keys(self, request: Request) -> list[tuple[str, int]]:
        address = self.get_ident(request)
        limit = settings.BAI_LOGIN_FAILURE_LIMIT
        keys = [(f"login-failures:ip:{address}", limit * 10)]
        username = request.data.get("username") if isinstance(request.data, dict) else None
        if isinstance(username, str) and username:
            digest = hashlib.sha256(username.encode()).hexdigest()[:32]
            keys.insert(0, (f"login-failures:user:{address}:{digest}", limit))
        return keys

    def allow_request(self, request: Request, view: Any) -> bool:
        now = time.time()
        self.retry_after = 0
        for key, _ in self._keys(request):
            until = cache.get(f"{key}:until")
            if until is not None and until > now:
                self.retry_after = max(self.retry_after, math.ceil(until - now))
        return self.retry_after == 0

    def wait(self) -> int:
        return self.retry_after

    @classmethod
    def record_failure(cls, request: Request) -> None:
        window = settings.BAI_LOGIN_COOLOFF
        for key, limit in cls()._keys(request):
            # The counter lives one window from the first failure; incr is atomic.
            cache.add(key, 0, timeout=window)
            try:
                failures = cache.incr(key)
            except ValueError:  # the window ended between add and incr
                cache.set(key, 1, timeout=window)
                failures = 1
            if failures >= limit:
                cache.set(f"{key}:until", time.time() + window, timeout=window)

    @classmethod
    def record_success(cls, request: Request) -> None:
        """A right password clears that name's count for this address (not the lock)."""
        cache.delete(cls()._keys(request)[0][0])


# --- failed logins: the login pages (django-axes) -----------------------------


def axes_leaves_to_api_throttle(request: HttpRequest, credentials: Any) -> bool:
    """axes ignores the API: the token endpoint has its own throttle, in the API's error format."""
    return request.path.startswith("/api/")


def login_lockout_response(
    request: HttpRequest, original_response: Any = None, credentials: Any = None
) -> HttpResponse:
    """The lockout page: 429, with when the lockout ends (and Retry-After)."""
    from axes.helpers import get_client_username
    from axes.models import AccessAttempt

    cooloff = timedelta(seconds=settings.BAI_LOGIN_COOLOFF)
    username = get_client_username(request, credentials) or ""
    last = AccessAttempt.objects.filter(
        username=username, ip_address=getattr(request, "axes_ip_address", None)
    ).aggregate(last=Max("attempt_time"))["last"]
    now = timezone.now()
    resets_at = (last or now) + cooloff
    seconds = max(1, math.ceil((resets_at - now).total_seconds()))
    response = render(
        request,
        "lockout.html",
        {"username": username, "resets_at": resets_at, "seconds": seconds},
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response
