"""Metrics that events in many processes add to: counters, a histogram, and gauges
each process holds (its open websockets). Read by the manager's ``/metrics``
(``sessions_app.metrics``), which adds the figures it reads from the database.

Why Redis and not prometheus-client's multiprocess mode: the manager runs as
several daphne processes, Celery workers and the apps proxy, possibly on several
hosts, behind a balancer that hands a scrape to any one of them. Multiprocess
mode sums the files of one directory on one host, and keeps a killed process's
gauges until someone marks it dead (nobody does, for a ``kill -9``). Redis is
already the store every process shares. So:

- counters and histogram buckets are ``HINCRBYFLOAT`` fields of one hash, and
  survive the restart of any process;
- a gauge that a process holds (its open websockets) is a hash of that process
  with a lease: refreshed while the process lives, gone ``GAUGE_LEASE`` seconds
  after it dies, so a killed daphne's sockets stop counting by themselves.

Recording never waits on Redis: it updates this process's buffer, and one daemon
thread writes the buffer out (within ``FLUSH_EVERY`` seconds, at once when idle,
and at exit). Redis trouble loses at most that buffer's counts, and is logged.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from backendai_web import redis as shared_redis

logger = logging.getLogger(__name__)

FLUSH_EVERY = 0.5
GAUGE_LEASE = 15
GAUGE_RENEW = 5.0


@dataclass(frozen=True)
class Metric:
    kind: str  # counter | histogram | gauge
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


# Every metric recorded through this module: docs/operations.md (Metrics) lists them.
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METRICS: dict[str, Metric] = {
    "bai_scheduler_pass_seconds": Metric(
        "histogram",
        "Duration of one scheduling pass of one resource group",
        ("group",),
        PASS_BUCKETS,
    ),
    "bai_scheduler_placed_sessions": Metric(
        "counter", "Sessions placed on agents by scheduling passes", ("group",)
    ),
    "bai_scheduler_placed_kernels": Metric(
        "counter", "Kernels placed on agents by scheduling passes", ("group",)
    ),
    "bai_app_proxy_requests": Metric(
        "counter",
        "Requests to the apps proxy, by kind (http, websocket, tcp) and outcome",
        ("kind", "outcome"),
    ),
    "bai_websockets_open": Metric(
        "gauge",
        "Open websockets on the manager, by kind (agent, sessions, logs, terminal, execute)",
        ("kind",),
    ),
}

Labels = tuple[tuple[str, str], ...]


def _namespace() -> str:
    # Keyed by database, like the scheduler's flags: test runs and a dev server may share a Redis.
    return f"bai:metrics:{settings.DATABASES['default']['NAME']}"


def counters_key() -> str:
    return f"{_namespace()}:sum"


def gauges_prefix() -> str:
    return f"{_namespace()}:held:"


def encode(name: str, labels: Labels) -> str:
    return name + "|" + "\x1f".join(f"{k}={v}" for k, v in labels)


def decode(field: str) -> tuple[str, Labels]:
    name, _, rest = field.partition("|")
    pairs = [p.partition("=") for p in rest.split("\x1f")] if rest else []
    return name, tuple((k, v) for k, _, v in pairs)


def _labels(name: str, values: dict[str, Any]) -> Labels:
    metric = METRICS[name]
    if set(values) != set(metric.labels):
        raise ValueError(f"{name} takes labels {metric.labels}, not {sorted(values)}")
    return tuple((k, str(values[k])) for k in metric.labels)


class _Buffer:
    """This process's unwritten counts and its held gauges, and the thread that writes them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sums: dict[str, float] = defaultdict(float)
        self.held: dict[str, float] = defaultdict(float)
        self.held_changed = False
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = 0
        self.client: redis.Redis | None = None

    def _start(self) -> None:
        # Again after a fork (Celery's prefork children, daphne never): a thread does not survive it.
        if self.thread is not None and self.pid == os.getpid():
            return
        self.pid = os.getpid()
        self.sums.clear()
        self.held.clear()
        self.client = None
        self.thread = threading.Thread(target=self._run, name="bai-metrics", daemon=True)
        self.thread.start()
        atexit.register(self.flush)

    def add(self, field: str, amount: float) -> None:
        with self.lock:
            self._start()
            self.sums[field] += amount
        self.wake.set()

    def hold(self, field: str, amount: float) -> None:
        with self.lock:
            self._start()
            self.held[field] += amount
            self.held_changed = True
        self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait(GAUGE_RENEW)
            self.wake.clear()
            self.flush()
            # Coalesce a burst of events into one write.
            threading.Event().wait(FLUSH_EVERY)

    def _held_key(self) -> str:
        return f"{gauges_prefix()}{socket.gethostname()}:{self.pid}"

    def flush(self) -> None:
        with self.lock:
            sums, self.sums = dict(self.sums), defaultdict(float)
            held = {k: v for k, v in self.held.items()}
            self.held_changed = False
        try:
            if self.client is None:
                self.client = shared_redis.client(timeout=None)
            pipe = self.client.pipeline(transaction=False)
            for field, amount in sums.items():
                pipe.hincrbyfloat(counters_key(), field, amount)
            if held:
                key = self._held_key()
                pipe.delete(key)
                pipe.hset(key, mapping=held)
                pipe.expire(key, GAUGE_LEASE)
            pipe.execute()
        except redis.RedisError:
            logger.warning("metrics not written (redis); %d counts lost", len(sums), exc_info=True)


_buffer = _Buffer()


def inc(name: str, amount: float = 1.0, **labels: Any) -> None:
    """Add to a counter (``amount`` >= 0)."""
    _buffer.add(encode(name, _labels(name, labels)), amount)


def observe(name: str, value: float, **labels: Any) -> None:
    """Record one value in a histogram: its bucket, its sum and its count."""
    metric = METRICS[name]
    base = _labels(name, labels)
    for bound in metric.buckets:
        if value <= bound:
            _buffer.add(encode(f"{name}_bucket", (*base, ("le", repr(bound)))), 1)
    _buffer.add(encode(f"{name}_bucket", (*base, ("le", "+Inf"))), 1)
    _buffer.add(encode(f"{name}_sum", base), value)
    _buffer.add(encode(f"{name}_count", base), 1)


def hold(name: str, amount: float, **labels: Any) -> None:
    """Add to a gauge this process holds (and that ends with it)."""
    _buffer.hold(encode(name, _labels(name, labels)), amount)


def flush() -> None:
    """Write this process's buffer now (tests, and before a short process ends)."""
    _buffer.flush()


def read(client: redis.Redis) -> tuple[dict[str, float], dict[str, float]]:
    """(counter and histogram fields, held gauges summed over live processes), as stored."""
    sums = {k.decode(): float(v) for k, v in client.hgetall(counters_key()).items()}
    held: dict[str, float] = defaultdict(float)
    for key in client.scan_iter(match=gauges_prefix() + "*", count=1000):
        for field, value in client.hgetall(key).items():
            held[field.decode()] += float(value)
    return sums, dict(held)
