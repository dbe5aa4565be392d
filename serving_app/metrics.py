"""Request metrics of inference endpoints, per route, in Redis (``settings.REDIS_URL``).

The router writes them (``arecord``, ``ainflight``; ``record`` and ``inflight`` are the same for
synchronous callers; ``Recorder`` batches the same writes for the router's hot path); the
reconciler, the API and the charts read them (``snapshot``, ``series``).

Layout, all under ``bai:serve:`` and bounded whatever the traffic:

- ``m:<endpoint>:<epoch second>``: one hash per endpoint and second. Per route ``<route>:n``
  (requests that ended in that second), ``<route>:e`` (of which failed) and ``<route>:<bucket>``
  (how many took a latency in that bucket: ``BUCKET_GROWTH``-spaced from 0.1 ms to ``2 min``, so
  a route has at most ``len(BOUNDS) + 2`` fields a second). Each hash expires ``KEEP_S`` after its
  second: the snapshots' window (up to ``WINDOW_MAX_S``) and the charts' ``SERIES_MAX_S`` both fit.
- ``in:<endpoint>``: one hash of in-flight requests, ``<route>|<router process>`` → count. A router
  process that dies with requests in flight would leave its counts behind, so each process keeps
  ``proc:<id>`` alive (``PROC_TTL_S``, refreshed as it counts) and readers count only live
  processes' fields.

Percentiles come from the buckets (the bucket's upper bound: at most ``BUCKET_GROWTH`` - 1 = 20 %
high), which is what keeps memory bounded: no list of raw latencies is ever kept.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import os
import time
import uuid
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from backendai_web import redis as shared_redis

logger = logging.getLogger(__name__)

PREFIX = "bai:serve:"
WINDOW_MAX_S = 60
SERIES_MAX_S = 300
KEEP_S = SERIES_MAX_S + 5
PROC_TTL_S = 60
PROC_REFRESH_S = 10.0
BUCKET_GROWTH = 1.2
# Upper bounds (seconds) of the latency buckets; a latency above the last lands in the last.
BOUNDS: tuple[float, ...] = tuple(
    0.0001 * BUCKET_GROWTH**i for i in range(int(math.log(1200 / 0.0001, BUCKET_GROWTH)) + 2)
)

# One id per router process (a fork gets its own: see _process_id).
_proc: tuple[int, str] | None = None
_proc_refreshed = 0.0


def _process_id() -> str:
    global _proc
    if _proc is None or _proc[0] != os.getpid():
        _proc = (os.getpid(), uuid.uuid4().hex[:12])
    return _proc[1]


def _bucket(latency_s: float) -> int:
    return min(bisect.bisect_left(BOUNDS, max(latency_s, 0.0)), len(BOUNDS) - 1)


def _second_key(endpoint_id: str, second: int) -> str:
    return f"{PREFIX}m:{endpoint_id}:{second}"


def _inflight_key(endpoint_id: str) -> str:
    return f"{PREFIX}in:{endpoint_id}"


def _proc_key(proc: str) -> str:
    return f"{PREFIX}proc:{proc}"


# --------------------------------------------------------------------------- clients

_async_clients: dict[int, tuple[asyncio.AbstractEventLoop, aioredis.Redis]] = {}


def _redis() -> redis.Redis:
    return shared_redis.client(timeout=5)


def _aredis() -> aioredis.Redis:
    """A client of the running loop (an asyncio connection belongs to the loop that opened it)."""
    loop = asyncio.get_running_loop()
    held = _async_clients.get(id(loop))
    if held is None or held[0] is not loop:
        for key, (other, _) in list(_async_clients.items()):
            if other.is_closed():
                del _async_clients[key]
        held = (loop, aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=5))
        _async_clients[id(loop)] = held
    return held[1]


# --------------------------------------------------------------------------- writes


def _record_commands(
    pipe: Any, endpoint_id: str, route_id: Any, latency_s: float, ok: bool, now: float | None
) -> None:
    second = int(time.time() if now is None else now)
    key = _second_key(endpoint_id, second)
    pipe.hincrby(key, f"{route_id}:n", 1)
    if not ok:
        pipe.hincrby(key, f"{route_id}:e", 1)
    pipe.hincrby(key, f"{route_id}:{_bucket(latency_s)}", 1)
    pipe.expireat(key, second + KEEP_S)


def _inflight_commands(pipe: Any, endpoint_id: str, route_id: Any, delta: int) -> bool:
    """Queue the change; True when the process's liveness key was refreshed with it."""
    global _proc_refreshed
    proc = _process_id()
    key = _inflight_key(endpoint_id)
    pipe.hincrby(key, f"{route_id}|{proc}", int(delta))
    pipe.expire(key, KEEP_S)
    now = time.monotonic()
    if now - _proc_refreshed >= PROC_REFRESH_S:
        _proc_refreshed = now
        pipe.set(_proc_key(proc), 1, ex=PROC_TTL_S)
        return True
    return False


def record(
    endpoint_id: str, route_id: Any, latency_s: float, ok: bool, *, now: float | None = None
) -> None:
    """One request to a route ended after ``latency_s`` seconds, answered (``ok``) or failed."""
    pipe = _redis().pipeline(transaction=False)
    _record_commands(pipe, str(endpoint_id), route_id, latency_s, ok, now)
    pipe.execute()


async def arecord(
    endpoint_id: str, route_id: Any, latency_s: float, ok: bool, *, now: float | None = None
) -> None:
    """``record`` for the router's event loop."""
    pipe = _aredis().pipeline(transaction=False)
    _record_commands(pipe, str(endpoint_id), route_id, latency_s, ok, now)
    await pipe.execute()


def inflight(endpoint_id: str, route_id: Any, delta: int) -> None:
    """A request to a route started (+1) or ended (-1)."""
    pipe = _redis().pipeline(transaction=False)
    _inflight_commands(pipe, str(endpoint_id), route_id, delta)
    pipe.execute()


async def ainflight(endpoint_id: str, route_id: Any, delta: int) -> None:
    """``inflight`` for the router's event loop."""
    pipe = _aredis().pipeline(transaction=False)
    _inflight_commands(pipe, str(endpoint_id), route_id, delta)
    await pipe.execute()


class Recorder:
    """The router's batched writer: counts in memory, one Redis pipeline every ``FLUSH_S``.

    ``arecord`` and ``ainflight`` cost a round trip (and ~0.25 ms of CPU) each; a router calling
    them per request spends more on its metrics than on the request. This keeps the same layout:
    each flush adds the seconds' counts (HINCRBY) and sets this process's in-flight fields to
    their current values (HSET; absolute, so nothing drifts), and refreshes the process's
    liveness, so that long streams keep counting. Made and flushed on one event loop.
    """

    FLUSH_S = 0.5

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], dict[str, int]] = {}  # (endpoint, second) -> fields
        self._inflight: dict[str, dict[str, int]] = {}  # endpoint -> route -> outstanding
        self._task: asyncio.Task[None] | None = None

    def started(self, endpoint_id: str, route_id: Any) -> None:
        routes = self._inflight.setdefault(str(endpoint_id), {})
        routes[str(route_id)] = routes.get(str(route_id), 0) + 1
        self._ensure_flushing()

    def ended(self, endpoint_id: str, route_id: Any, latency_s: float, ok: bool) -> None:
        endpoint_id, route = str(endpoint_id), str(route_id)
        routes = self._inflight.setdefault(endpoint_id, {})
        routes[route] = max(routes.get(route, 0) - 1, 0)
        fields = self._counts.setdefault((endpoint_id, int(time.time())), {})
        names = [f"{route}:n", f"{route}:{_bucket(latency_s)}"] + ([] if ok else [f"{route}:e"])
        for name in names:
            fields[name] = fields.get(name, 0) + 1
        self._ensure_flushing()

    def _ensure_flushing(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        while self._counts or self._inflight:
            await asyncio.sleep(self.FLUSH_S)
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - metrics never stop the router
                logger.warning("serve metrics not written: %s", exc)

    async def flush(self) -> None:
        counts, self._counts = self._counts, {}
        inflight = self._inflight
        # Routes with nothing in flight are written once more as 0, then forgotten.
        self._inflight = {
            e: {r: n for r, n in routes.items() if n} for e, routes in inflight.items()
        }
        self._inflight = {e: routes for e, routes in self._inflight.items() if routes}
        if not counts and not inflight:
            return
        proc = _process_id()
        pipe = _aredis().pipeline(transaction=False)
        for (endpoint_id, second), fields in counts.items():
            key = _second_key(endpoint_id, second)
            for name, value in fields.items():
                pipe.hincrby(key, name, value)
            pipe.expireat(key, second + KEEP_S)
        for endpoint_id, routes in inflight.items():
            key = _inflight_key(endpoint_id)
            pipe.hset(key, mapping={f"{route}|{proc}": n for route, n in routes.items()})
            pipe.expire(key, KEEP_S)
        pipe.set(_proc_key(proc), 1, ex=PROC_TTL_S)
        await pipe.execute()


# --------------------------------------------------------------------------- reads


def _percentile_ms(buckets: dict[int, int], p: float) -> float | None:
    total = sum(buckets.values())
    if not total:
        return None
    rank = math.ceil(p / 100 * total)
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= rank:
            return round(BOUNDS[index] * 1000, 3)
    return round(BOUNDS[max(buckets)] * 1000, 3)  # pragma: no cover - rank <= total


def _seconds(
    client: redis.Redis, endpoint_id: str, first: int, last: int
) -> list[dict[bytes, bytes]]:
    pipe = client.pipeline(transaction=False)
    for second in range(first, last + 1):
        pipe.hgetall(_second_key(endpoint_id, second))
    return pipe.execute()


def _parse(fields: dict[bytes, bytes]) -> dict[str, dict[str, Any]]:
    """One second's hash as ``{route: {"n", "e", "buckets": {index: count}}}``."""
    routes: dict[str, dict[str, Any]] = {}
    for raw_name, raw_value in fields.items():
        route, _, what = raw_name.decode().rpartition(":")
        entry = routes.setdefault(route, {"n": 0, "e": 0, "buckets": {}})
        value = int(raw_value)
        if what == "n":
            entry["n"] += value
        elif what == "e":
            entry["e"] += value
        elif what.isdigit():
            entry["buckets"][int(what)] = entry["buckets"].get(int(what), 0) + value
    return routes


def _inflight_now(client: redis.Redis, endpoint_id: str) -> dict[str, int]:
    """In-flight requests per route, counting live router processes only.

    A dead process's fields stay (they vanish with the hash, ``KEEP_S`` after its last change):
    deleting them here would race with a live process whose liveness key merely lapsed (only
    long streams open, no request started for ``PROC_TTL_S``), whose ends would then go negative.
    """
    key = _inflight_key(endpoint_id)
    fields = {k.decode(): int(v) for k, v in client.hgetall(key).items()}
    procs = sorted({name.rpartition("|")[2] for name in fields})
    alive = (
        dict(zip(procs, client.mget([_proc_key(p) for p in procs]), strict=True)) if procs else {}
    )
    out: dict[str, int] = {}
    for name, count in fields.items():
        route, _, proc = name.rpartition("|")
        if alive.get(proc) is not None:
            out[route] = out.get(route, 0) + max(count, 0)
    return out


def _key(route: str) -> Any:
    """Route ids are integers (Route.id); keep them so, as the reconciler compares them."""
    return int(route) if route.lstrip("-").isdigit() else route


def snapshot(endpoint_id: str, window_s: int = 30, *, now: float | None = None) -> dict[str, Any]:
    """The last ``window_s`` whole seconds (at most ``WINDOW_MAX_S``) of an endpoint.

    ``{"routes": {route_id: {"rps", "p50_ms", "p95_ms", "inflight", "errors"}}, "rps",
    "p95_ms", "inflight"}``; a percentile is None when no request ended in the window.
    """
    endpoint_id = str(endpoint_id)
    window_s = max(1, min(int(window_s), WINDOW_MAX_S))
    last = int(time.time() if now is None else now) - 1  # the current second is still filling
    client = _redis()
    per_route: dict[str, dict[str, Any]] = {}
    for second in _seconds(client, endpoint_id, last - window_s + 1, last):
        for route, entry in _parse(second).items():
            total = per_route.setdefault(route, {"n": 0, "e": 0, "buckets": {}})
            total["n"] += entry["n"]
            total["e"] += entry["e"]
            for index, count in entry["buckets"].items():
                total["buckets"][index] = total["buckets"].get(index, 0) + count
    flying = _inflight_now(client, endpoint_id)
    routes: dict[Any, dict[str, Any]] = {}
    everything: dict[int, int] = {}
    for route in sorted(set(per_route) | set(flying)):
        entry = per_route.get(route, {"n": 0, "e": 0, "buckets": {}})
        for index, count in entry["buckets"].items():
            everything[index] = everything.get(index, 0) + count
        routes[_key(route)] = {
            "rps": round(entry["n"] / window_s, 3),
            "p50_ms": _percentile_ms(entry["buckets"], 50),
            "p95_ms": _percentile_ms(entry["buckets"], 95),
            "inflight": flying.get(route, 0),
            "errors": entry["e"],
        }
    return {
        "routes": routes,
        "rps": round(sum(r["n"] for r in per_route.values()) / window_s, 3),
        "p95_ms": _percentile_ms(everything, 95),
        "inflight": sum(flying.values()),
    }


def series(
    endpoint_id: str, seconds: int = 300, *, now: float | None = None
) -> list[dict[str, Any]]:
    """One point a second, oldest first, for the last ``seconds`` (at most ``SERIES_MAX_S``):
    ``[{"t": epoch second, "rps", "p95_ms"}]``; ``p95_ms`` is None in a second without requests."""
    seconds = max(1, min(int(seconds), SERIES_MAX_S))
    last = int(time.time() if now is None else now) - 1
    first = last - seconds + 1
    points = []
    for offset, fields in enumerate(_seconds(_redis(), str(endpoint_id), first, last)):
        n = 0
        buckets: dict[int, int] = {}
        for entry in _parse(fields).values():
            n += entry["n"]
            for index, count in entry["buckets"].items():
                buckets[index] = buckets.get(index, 0) + count
        points.append({"t": first + offset, "rps": n, "p95_ms": _percentile_ms(buckets, 95)})
    return points
