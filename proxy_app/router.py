"""The inference router: ``/serve/<endpoint>/<path>`` on the apps origin's bare host.

A request to an endpoint goes to one of its HEALTHY replicas (routes) over the same tunnels
and connection pool as the apps (``forward.exchange``):

- **Callers**: an endpoint not open to the public needs ``Authorization: Bearer <token>`` of
  that very endpoint: none → 401, a wrong one (another endpoint's among them) → 403. The
  header stops here; the replica never sees it.
- **Balancing**: the route with the fewest outstanding requests per unit of traffic ratio,
  ties broken by smooth weighted round robin. Equal ratios are "least outstanding, else the
  next in turn"; unequal ratios share sequential traffic in proportion, and concurrent traffic
  too (outstanding requests settle in proportion to the ratios).
- **Retries**: an idempotent request (GET, HEAD, OPTIONS, PUT, DELETE) whose whole body came in
  its first event, and whose replica could not be reached or answered 502/503, goes once to
  another replica (the first answer is dropped, never half-sent).
- **No healthy replica**: 503 ``{"message": "endpoint 'x' has no healthy replica: <why>"}``,
  except that an endpoint scaled to zero is woken (``serving_app.services.wake``) and the
  request is held up to ``BAI_SERVE_COLD_START_TIMEOUT`` until a route is HEALTHY (as is a
  request to an endpoint whose replicas are still provisioning).
- **Streaming**: responses go on a chunk at a time as the replica sends them (server-sent
  events pass unbuffered).
- **CORS**: the Serving page's "try it" box calls the router from the manager's origin with a
  bearer token and no credentials. A preflight (OPTIONS with ``Access-Control-Request-Method``)
  from an origin in ``BAI_MANAGER_ORIGIN`` is answered here (no token needed, nothing reaches a
  replica); every answer to such an origin carries ``Access-Control-Allow-Origin`` for it, and
  none ever allows credentials. The router owns these headers: a replica's own
  ``Access-Control-Allow-*`` headers are dropped, so no other origin is ever let in.
- **Metrics**: in-flight counts and each request's latency and outcome per route
  (``serving_app.metrics.Recorder``: counted in memory, written to Redis twice a second).

What the router knows of endpoints comes from three calls into ``serving_app`` (``_router_view``,
``_token_ok``, ``_wake`` below): the view is kept ``VIEW_TTL`` seconds per process and fetched
once however many requests wait for it; a token's verdict is kept as long.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from sessions_app.service_ports import App

from . import forward, tunnels
from .access import Target

logger = logging.getLogger(__name__)

PREFIX = "/serve/"
VIEW_TTL = 1.0  # seconds a RouterView is reused (the contract allows up to 1 s)
HOLD_POLL = 0.25  # seconds between looks at an endpoint that is waking up
TOKEN_TTL = 1.0  # seconds a token's verdict is reused (a revoked token stops within it)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
RETRY_STATUSES = frozenset({502, 503})
WAKING = frozenset({"SCALED_TO_ZERO", "PROVISIONING"})
MAX_CACHED = 10_000  # entries of each per-process cache before it is emptied


# --------------------------------------------------------------------------- serving_app
# The router's only ways into serving_app (sync; called through sync_to_async); imported late
# so that the proxy starts without the serving tables.


def _router_view(name: str) -> Any:
    from serving_app.selectors import router_view

    return router_view(name)


def _token_ok(endpoint_id: str, presented: str) -> bool:
    from serving_app.selectors import token_ok

    return token_ok(endpoint_id, presented)


def _wake(endpoint_id: str, reason: str) -> None:
    from serving_app.services import wake

    wake(endpoint_id, reason)


# --------------------------------------------------------------------------- replies


async def _json(
    send: Any, status: int, body: dict[str, Any], extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                (b"content-length", str(len(data)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


# --------------------------------------------------------------------------- CORS

CORS_METHODS = b"GET, POST, PUT, DELETE, HEAD, OPTIONS"
CORS_HEADERS = frozenset({"authorization", "content-type", "accept"})
CORS_MAX_AGE = b"600"
VARY_ORIGIN = (b"vary", b"Origin")


def _cors_origin(scope: dict[str, Any]) -> bytes | None:
    """The caller's Origin when it is the manager's own (the only one let in), else None."""
    for key, value in scope["headers"]:
        if key == b"origin":
            return value if value.decode("latin-1") in settings.BAI_MANAGER_ORIGIN else None
    return None


def _header_value(scope: dict[str, Any], name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


async def _preflight(scope: dict[str, Any], send: Any, origin: bytes | None) -> None:
    """Answer a CORS preflight: allowed for the manager's origin and the try-it box's headers."""
    asked = (_header_value(scope, b"access-control-request-headers") or b"").decode("latin-1")
    unknown = {h.strip().lower() for h in asked.split(",") if h.strip()} - CORS_HEADERS
    if origin is None or unknown:
        why = "this origin may not call endpoints" if origin is None else "headers not allowed"
        await _json(send, 403, {"message": f"CORS preflight refused: {why}"}, (VARY_ORIGIN,))
        return
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                (b"access-control-allow-origin", origin),
                (b"access-control-allow-methods", CORS_METHODS),
                (b"access-control-allow-headers", b"authorization, content-type, accept"),
                (b"access-control-max-age", CORS_MAX_AGE),
                VARY_ORIGIN,
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _with_cors(send: Any, origin: bytes | None) -> Any:
    """``send`` with the router's CORS headers on the response's start (and a replica's gone)."""

    async def cors_send(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.start":
            headers = [
                (k, v)
                for k, v in event.get("headers", ())
                if not k.lower().startswith(b"access-control-allow-")
            ]
            headers.append(VARY_ORIGIN)
            if origin is not None:
                headers.append((b"access-control-allow-origin", origin))
            event = {**event, "headers": headers}
        await send(event)

    return cors_send


# --------------------------------------------------------------------------- the view, cached


class _Views:
    """RouterViews per endpoint name, at most ``max_age`` old, one fetch at a time per name."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, Any]] = {}
        self._fetching: dict[str, asyncio.Future[Any]] = {}

    async def get(self, name: str, max_age: float = VIEW_TTL) -> Any:
        hit = self._cache.get(name)
        if hit is not None and time.monotonic() - hit[0] < max_age:
            return hit[1]
        running = self._fetching.get(name)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._fetching[name] = future
        try:
            started = time.monotonic()
            view = await sync_to_async(_router_view)(name)
            if len(self._cache) > MAX_CACHED:
                self._cache.clear()
            self._cache[name] = (started, view)
            future.set_result(view)
            return view
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            self._fetching.pop(name, None)

    def clear(self) -> None:
        self._cache.clear()


views = _Views()
_tokens: dict[tuple[str, str], tuple[float, bool]] = {}


async def _caller_may_call(view: Any, header: str) -> tuple[int, str] | None:
    """None when the caller may call the endpoint, else (status, message)."""
    if view.open_to_public:
        return None
    kind, _, presented = header.partition(" ")
    presented = presented.strip()
    if kind.lower() != "bearer" or not presented:
        return 401, "this endpoint needs Authorization: Bearer <token>"
    key = (str(view.endpoint_id), hashlib.sha256(presented.encode()).hexdigest())
    hit = _tokens.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[0] < TOKEN_TTL:
        ok = hit[1]
    else:
        ok = await sync_to_async(_token_ok)(str(view.endpoint_id), presented)
        if len(_tokens) > MAX_CACHED:
            _tokens.clear()
        _tokens[key] = (now, ok)
    return None if ok else (403, "this token does not open this endpoint")


# --------------------------------------------------------------------------- balancing


def _target(route: Any) -> Target:
    """The route's replica as a tunnel target (core gives a Target, or a dict of its ids)."""
    found = route.target
    if isinstance(found, Target):
        return found
    return Target(
        session_id=str(found.get("session_id") or route.session_id),
        kernel_id=str(found["kernel_id"]),
        agent_id=found.get("agent_id"),
        app=App(f"port-{found['port']}", "http", int(found["port"]), preopen=True),
        running=True,
        status="RUNNING",
        secret="",
    )


@dataclass
class _RouteState:
    outstanding: int = 0
    current: float = 0.0  # smooth weighted round robin's running weight


@dataclass
class _Balancer:
    """One endpoint's routes as this process sees them."""

    routes: dict[Any, _RouteState] = field(default_factory=dict)

    def pick(self, candidates: list[Any]) -> Any:
        """The route to use among ``candidates`` (RouteTargets with ratio > 0)."""
        total = sum(r.ratio for r in candidates)
        best, best_key = None, None
        for route in candidates:
            state = self.routes.setdefault(route.route_id, _RouteState())
            state.current += route.ratio
            key = (state.outstanding / route.ratio, -state.current)
            if best_key is None or key < best_key:
                best, best_key = route, key
        assert best is not None
        self.routes[best.route_id].current -= total
        return best

    def forget_all_but(self, route_ids: set[Any]) -> None:
        for gone in set(self.routes) - route_ids:
            if self.routes[gone].outstanding == 0:
                del self.routes[gone]


balancers: dict[str, _Balancer] = {}


# --------------------------------------------------------------------------- metrics, batched

_recorder: Any = None


def _metrics() -> Any:
    """This process's batched metrics writer (flushed to Redis twice a second)."""
    global _recorder
    if _recorder is None:
        from serving_app.metrics import Recorder

        _recorder = Recorder()
    return _recorder


# --------------------------------------------------------------------------- one request


class _Retry(Exception):
    """The replica failed before anything reached the caller: another one may take it."""


def _replica_scope(scope: dict[str, Any], name: str) -> dict[str, Any]:
    """The request as the replica sees it: the path below the endpoint, no bearer token."""
    prefix = f"{PREFIX}{name}".encode()
    raw = scope.get("raw_path") or scope["path"].encode()
    rest = raw[len(prefix) :] if raw.startswith(prefix) else b"/"
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
    headers.append((b"x-forwarded-prefix", prefix))
    path = scope["path"][len(PREFIX) + len(name) :] or "/"
    return {**scope, "path": path, "raw_path": rest or b"/", "headers": headers}


async def _attempt(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    first: dict[str, Any],
    view: Any,
    route: Any,
    balancer: _Balancer,
    may_retry: bool,
) -> None:
    """The request on one route; raises _Retry when it failed and nothing was sent yet."""
    state = balancer.routes.setdefault(route.route_id, _RouteState())
    endpoint_id = str(view.endpoint_id)
    sent = {"started": False, "status": 0, "dropped": False}

    async def to_caller(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.start":
            sent["status"] = event["status"]
            if may_retry and event["status"] in RETRY_STATUSES:
                sent["dropped"] = True
                return
            sent["started"] = True
        if not sent["dropped"]:
            await send(event)

    state.outstanding += 1
    _metrics().started(endpoint_id, route.route_id)
    t0 = time.perf_counter()
    ok = False
    try:
        try:
            await forward.exchange(scope, receive, to_caller, _target(route), first)
        except forward.CallerGone:
            return  # nobody to answer (and nothing to retry for)
        except (tunnels.TunnelFailed, forward.UpstreamError) as exc:
            if sent["started"]:
                raise  # the caller has part of an answer: nothing more can be done
            if may_retry:
                raise _Retry(str(exc)) from exc
            await _json(send, 502, {"message": f"the replica could not answer: {exc}"})
            return
        if sent["dropped"]:
            raise _Retry(f"the replica answered {sent['status']}")
        ok = sent["status"] < 500
    finally:
        state.outstanding -= 1
        _metrics().ended(endpoint_id, route.route_id, time.perf_counter() - t0, ok)


def _why_none(view: Any) -> str:
    if view.replicas == 0 or view.status == "SCALED_TO_ZERO":
        return "scaled to zero"
    if view.status == "PROVISIONING":
        return "its replicas are still starting (provisioning)"
    reason = (view.status_reason or "").strip()
    if view.status == "DEGRADED":
        return f"degraded: {reason}" if reason else "degraded"
    return reason or f"status {view.status.lower()}"


async def _healthy_view(name: str, view: Any) -> tuple[Any, str]:
    """The view once it has a HEALTHY route (``why`` empty), or why there is none.

    An endpoint scaled to zero is woken; a request to one that is waking (or provisioning)
    is held up to the cold-start timeout."""
    if view.routes:
        return view, ""
    if not (view.replicas == 0 or view.status in WAKING):
        return view, _why_none(view)
    if view.replicas == 0 or view.status == "SCALED_TO_ZERO":
        await sync_to_async(_wake)(str(view.endpoint_id), "a request arrived while scaled to zero")
    deadline = time.monotonic() + settings.BAI_SERVE_COLD_START_TIMEOUT
    while time.monotonic() < deadline:
        await asyncio.sleep(min(HOLD_POLL, max(0.0, deadline - time.monotonic())))
        view = await views.get(name, max_age=HOLD_POLL)
        if view is None:
            return None, "it was deleted"
        if view.routes:
            return view, ""
    timeout = settings.BAI_SERVE_COLD_START_TIMEOUT
    return view, f"{_why_none(view)}; none became healthy within {timeout:g} s"


async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/serve/<name>/<path>``: one caller's request to an endpoint (see the module's notes)."""
    rest = scope["path"][len(PREFIX) :]
    name, slash, _ = rest.partition("/")
    if scope["type"] != "http":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 4404})
        return
    origin = _cors_origin(scope)
    if scope["method"] == "OPTIONS" and _header_value(scope, b"access-control-request-method"):
        await _preflight(scope, send, origin)
        return
    send = _with_cors(send, origin)
    if not name or not slash:
        if name and not slash:  # /serve/<name>: the endpoint's root is /serve/<name>/
            location = f"{PREFIX}{name}/".encode()
            await _json(send, 308, {"message": "see /serve/<name>/"}, ((b"location", location),))
            return
        await _json(send, 404, {"message": "no endpoint is named here"})
        return
    view = await views.get(name)
    if view is None:
        await _json(send, 404, {"message": f"no endpoint '{name}'"})
        return
    auth = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
    refused = await _caller_may_call(view, auth)
    if refused is not None:
        status, message = refused
        challenge = ((b"www-authenticate", b'Bearer realm="serve"'),) if status == 401 else ()
        await _json(send, status, {"message": message}, challenge)
        return
    view, why = await _healthy_view(name, view)
    if why:
        await _json(send, 503, {"message": f"endpoint '{name}' has no healthy replica: {why}"})
        return
    first = await receive()
    if first["type"] == "http.disconnect":
        return
    upstream = _replica_scope(scope, name)
    balancer = balancers.setdefault(str(view.endpoint_id), _Balancer())
    if len(balancers) > MAX_CACHED:
        balancers.clear()
    routes = [r for r in view.routes if r.ratio > 0]
    balancer.forget_all_but({r.route_id for r in routes})
    if not routes:
        await _json(send, 503, {"message": f"endpoint '{name}' has no replica with traffic"})
        return
    retryable = scope["method"] in IDEMPOTENT and not first.get("more_body")
    route = balancer.pick(routes)
    others = [r for r in routes if r.route_id != route.route_id]
    try:
        await _attempt(
            upstream, receive, send, first, view, route, balancer, retryable and bool(others)
        )
        return
    except _Retry as exc:
        logger.info(
            "serve %s: route %s failed (%s); retrying on another", name, route.route_id, exc
        )
    second = balancer.pick(others)
    await _attempt(upstream, receive, send, first, view, second, balancer, False)
