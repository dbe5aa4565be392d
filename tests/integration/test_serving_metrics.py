"""serving_app.metrics against the real Redis of the test settings (REDIS_URL).

Every test uses an endpoint id of its own and a fixed clock (``now=``), so runs and tests never
read each other's seconds.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from django.conf import settings

from serving_app import metrics

NOW = 1_800_000_000.0  # a whole second; the snapshot reads the seconds before it


@pytest.fixture
def endpoint() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def client() -> redis.Redis:
    try:
        c = redis.Redis.from_url(settings.REDIS_URL)
        c.ping()
    except redis.RedisError as exc:
        from tests.conftest import skip_or_fail

        skip_or_fail(f"no Redis answers at {settings.REDIS_URL}: {exc}")
    return c


def test_the_snapshot_gives_rps_percentiles_and_errors_per_route_over_its_window(
    endpoint, client
) -> None:
    # Route 1: 10 requests a second for 10 s, 9 fast (10 ms) and 1 slow (200 ms) each second.
    for second in range(10):
        at = NOW - 10 + second
        for i in range(10):
            metrics.record(endpoint, 1, 0.2 if i == 9 else 0.01, ok=True, now=at)
    # Route 2: 5 requests, 2 failed, all in the last second.
    for i in range(5):
        metrics.record(endpoint, 2, 0.05, ok=i >= 2, now=NOW - 1)
    # This second is still filling: not in the snapshot.
    metrics.record(endpoint, 1, 5.0, ok=False, now=NOW)

    snap = metrics.snapshot(endpoint, window_s=10, now=NOW)
    one, two = snap["routes"][1], snap["routes"][2]
    assert one["rps"] == 10.0 and one["errors"] == 0
    assert 10 <= one["p50_ms"] <= 12  # the bucket's upper bound: at most 20 % high
    assert 200 <= one["p95_ms"] <= 240  # one in ten is slow: the 95th is among them
    assert two["rps"] == 0.5 and two["errors"] == 2
    assert 50 <= two["p50_ms"] <= 60
    assert snap["rps"] == 10.5
    assert 200 <= snap["p95_ms"] <= 240  # 10 slow + 5 at 50 ms of 105: the 95th is slow
    assert snap["inflight"] == 0

    narrow = metrics.snapshot(endpoint, window_s=1, now=NOW)
    assert narrow["routes"][1]["rps"] == 10.0 and narrow["routes"][2]["rps"] == 5.0


def test_an_endpoint_without_requests_has_an_empty_snapshot_and_flat_series(endpoint) -> None:
    snap = metrics.snapshot(endpoint, now=NOW)
    assert snap == {"routes": {}, "rps": 0.0, "p95_ms": None, "inflight": 0}
    points = metrics.series(endpoint, seconds=5, now=NOW)
    assert [p["t"] for p in points] == [int(NOW) - 5 + i for i in range(5)]
    assert all(p["rps"] == 0 and p["p95_ms"] is None for p in points)


def test_the_series_has_one_point_a_second_across_routes(endpoint) -> None:
    metrics.record(endpoint, 1, 0.002, ok=True, now=NOW - 3)
    metrics.record(endpoint, 2, 0.002, ok=True, now=NOW - 3)
    metrics.record(endpoint, 2, 0.4, ok=False, now=NOW - 1)
    points = metrics.series(endpoint, seconds=3, now=NOW)
    assert [(p["t"], p["rps"]) for p in points] == [
        (int(NOW) - 3, 2),
        (int(NOW) - 2, 0),
        (int(NOW) - 1, 1),
    ]
    assert 2 <= points[0]["p95_ms"] <= 2.4
    assert points[1]["p95_ms"] is None
    assert 400 <= points[2]["p95_ms"] <= 480


def test_in_flight_requests_are_counted_per_route(endpoint) -> None:
    metrics.inflight(endpoint, 1, +1)
    metrics.inflight(endpoint, 1, +1)
    metrics.inflight(endpoint, 2, +1)
    metrics.inflight(endpoint, 1, -1)
    snap = metrics.snapshot(endpoint)
    assert snap["inflight"] == 2
    assert snap["routes"][1]["inflight"] == 1 and snap["routes"][2]["inflight"] == 1
    assert snap["routes"][1]["rps"] == 0.0


def test_in_flight_counts_of_a_dead_router_process_are_not_counted(endpoint, client) -> None:
    metrics.inflight(endpoint, 1, +1)
    # A process that died with 3 requests in flight: its liveness key is gone.
    client.hset(f"{metrics.PREFIX}in:{endpoint}", "1|deadprocess0", 3)
    assert metrics.snapshot(endpoint)["routes"][1]["inflight"] == 1


async def test_the_async_variants_write_what_the_sync_readers_read(endpoint) -> None:
    await metrics.ainflight(endpoint, 7, +1)
    await metrics.arecord(endpoint, 7, 0.03, True, now=NOW - 1)
    await metrics.arecord(endpoint, 7, 0.03, False, now=NOW - 1)
    snap = metrics.snapshot(endpoint, window_s=1, now=NOW)
    assert snap["routes"][7] == {
        "rps": 2.0,
        "p50_ms": snap["routes"][7]["p50_ms"],
        "p95_ms": snap["routes"][7]["p95_ms"],
        "inflight": 1,
        "errors": 1,
    }
    assert 30 <= snap["routes"][7]["p95_ms"] <= 36
    await metrics.ainflight(endpoint, 7, -1)
    assert metrics.snapshot(endpoint, window_s=1, now=NOW)["inflight"] == 0


def test_memory_is_bounded_every_second_expires_and_has_few_fields(endpoint, client) -> None:
    import time

    now = time.time()
    for i in range(2000):  # latencies all over the range: still at most one field a bucket
        metrics.record(endpoint, 1, 10 ** (-4 + 6 * i / 2000), ok=i % 2 == 0, now=now)
    key = f"{metrics.PREFIX}m:{endpoint}:{int(now)}"
    assert client.hlen(key) <= len(metrics.BOUNDS) + 2
    assert 0 < client.ttl(key) <= metrics.KEEP_S
    metrics.inflight(endpoint, 1, +1)
    assert 0 < client.ttl(f"{metrics.PREFIX}in:{endpoint}") <= metrics.KEEP_S


def test_windows_and_series_are_capped(endpoint) -> None:
    metrics.record(endpoint, 1, 0.01, ok=True, now=NOW - metrics.WINDOW_MAX_S - 5)
    assert metrics.snapshot(endpoint, window_s=10_000, now=NOW)["rps"] == 0.0
    assert len(metrics.series(endpoint, seconds=10_000, now=NOW)) == metrics.SERIES_MAX_S
