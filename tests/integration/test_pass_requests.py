"""Requests for a scheduling pass coalesce through a "pass queued" flag in
Redis, and a flag whose pass was lost with a killed worker holds scheduling
back only briefly: it expires after ``BAI_PASS_QUEUED_TTL``, and a starting
worker clears every flag and queues a pass. (The real worker killed mid-pass
is in test_celery_worker.py.)

The broker is replaced by a list of the passes sent; the flags are in the
real Redis, under a database name of this test's own.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from scheduler_app import tasks


@pytest.fixture
def sent(settings, monkeypatch):
    """The group ids of the passes sent to the broker, in order."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    prefix = f"bai:pass-queued:flags-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setattr(tasks, "_flag_prefix", lambda: prefix)
    calls: list[int | None] = []
    monkeypatch.setattr(tasks.schedule_group, "delay", calls.append)
    try:
        tasks._flags().ping()
    except redis.RedisError:
        pytest.skip("no Redis at REDIS_URL")
    yield calls
    tasks.clear_queued_flags()


def test_a_burst_of_requests_queues_one_pass_per_group(sent):
    for _ in range(5):
        tasks.request_pass(7)
    tasks.request_pass(8)

    assert sent == [7, 8]


def test_a_request_after_the_pass_started_queues_the_next_one(sent, monkeypatch):
    monkeypatch.setattr("scheduler_app.services.schedulable_group_ids", lambda group_id: [])
    tasks.request_pass(7)
    tasks.schedule_group(7)  # the worker starts the pass
    tasks.request_pass(7)

    assert sent == [7, 7]


def test_the_flag_of_a_pass_lost_with_its_worker_expires_after_the_ttl(sent, settings):
    settings.BAI_PASS_QUEUED_TTL = 1
    tasks.request_pass(7)  # ...and the worker that took it dies
    tasks.request_pass(7)
    assert sent == [7]

    deadline = time.monotonic() + 3
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        tasks.request_pass(7)

    assert sent == [7, 7]


def test_a_starting_worker_clears_every_flag_of_its_database_and_queues_a_pass(sent):
    other = f"bai:pass-queued:another-{uuid.uuid4().hex[:8]}:7"
    tasks._flags().set(other, 1, ex=30)
    for group_id in (7, 8, None):
        tasks.request_pass(group_id)
    assert sent == [7, 8, None]

    tasks._resume_scheduling()

    assert sent == [7, 8, None, None]
    assert tasks._flags().exists(tasks._flag(7), tasks._flag(8)) == 0
    assert tasks._flags().exists(other) == 1
    tasks._flags().delete(other)
