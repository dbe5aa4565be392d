"""Two timeout sweeps at once (two beat ticks overlapping, or two workers) end
each overdue session exactly once, with one event. Real transactions and row
locks: PostgreSQL only (SQLite serialises writers and TestCase hides locks).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from session_steps import launch, run

from scheduler_app import sweeps
from sessions_app.models import ResourcePolicy, Result, SessionEvent, Status
from tests.conftest import skip_or_fail

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        skip_or_fail("concurrency tests need PostgreSQL (set DATABASE_URL)")


def sweep_twice_at_once(now):
    barrier = threading.Barrier(2)
    results, errors = [], []

    def one():
        try:
            barrier.wait(timeout=10)
            results.append(sweeps.sweep_timeouts(now=now))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(results) == 2
    return results


def test_two_sweeps_at_once_end_each_session_once_with_one_event(alice, image, make_agent, group):
    make_agent("agent-1", cpu="64", mem=256 * 2**30)
    policy = ResourcePolicy.objects.get(is_default=True)
    policy.idle_timeout = timedelta(minutes=2)
    policy.max_concurrent_sessions = 100
    policy.save()
    idle = [run(launch(alice, name=f"idle-{i}")) for i in range(8)]
    jobs = [
        run(launch(alice, name=f"job-{i}", type="batch", startup_command="x", batch_timeout=60))
        for i in range(4)
    ]

    results = sweep_twice_at_once(timezone.now() + timedelta(minutes=3))

    ended = [sid for r in results for ids in r.ended.values() for sid in ids]
    assert sorted(ended) == sorted(str(s.pk) for s in idle + jobs)  # each once, by one sweep
    assert not any(r.failed for r in results)
    for session in idle + jobs:
        session.refresh_from_db()
        assert session.status == Status.TERMINATING
        reasons = SessionEvent.objects.filter(
            session=session, kernel=None, to_status=Status.TERMINATING
        ).values_list("reason", flat=True)
        assert len(reasons) == 1, list(reasons)
    assert {j.result for j in jobs} == {Result.FAILED}
    assert {i.status_reason for i in idle} == {"idle timeout: no activity for 2 min"}
    assert {j.status_reason for j in jobs} == {"batch timeout: ran longer than 1 min"}
