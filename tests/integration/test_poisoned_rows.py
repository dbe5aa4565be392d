"""Rows no API would write (put there by hand, or by an older release) never
stop a scheduling pass, a timeout sweep, or the pages that list sessions: the
row that cannot be handled leaves with the reason recorded on it, and everyone
else's sessions are placed or ended in the same pass or sweep.

The poison goes in with SQL or a bare ORM update, around every check of the
API. Passes run through ``schedule_pass``; on_commit hooks do not fire inside
these tests' transactions, so nothing runs a pass behind the test's back.

Personas (tests/conftest.py): ``alice`` owns the poisoned sessions and reads
them through the API; ``bob`` is everyone else, whose sessions must not wait
for hers; ``admin`` reads the session list in Django admin.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from session_steps import launch, place, run

from backendai_web.db import FAR_FUTURE, FAR_PAST
from scheduler_app import selectors, sweeps
from scheduler_app import services as scheduler
from sessions_app import deadlines
from sessions_app.models import (
    Agent,
    Kernel,
    ResourcePolicy,
    Result,
    Session,
    SessionEvent,
    Status,
)
from tests.conftest import skip_or_fail

pytestmark = pytest.mark.django_db

# The dates of the issue: PostgreSQL holds them, Python's datetime does not.
AFTER_YEAR_9999 = "9999-12-31T23:59:59-14:00"
BEFORE_YEAR_1 = "0001-01-01T00:00:00+14:00"


@pytest.fixture(autouse=True)
def _roomy_default_policy(group):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_concurrent_sessions=50, max_pending_sessions=50
    )


@pytest.fixture
def postgres():
    """Dates beyond Python's range and durations beyond 2**63 microseconds: only
    PostgreSQL stores them (SQLite refuses them on the way in)."""
    if connection.vendor != "postgresql":
        skip_or_fail("this poison needs PostgreSQL to be stored (set DATABASE_URL)")


def set_with_sql(session: Session, column: str, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE sessions_app_session SET {column} = %s WHERE id = %s", [value, session.pk]
        )


def the_reason(session: Session) -> tuple[str, str]:
    session.refresh_from_db()
    return session.status, session.status_reason


# --- the scheduling pass ----------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "words"),
    [
        ({"cpu": "0.0000000000000000001"}, "cpu '0.0000000000000000001', which is out of range"),
        ({"cpu": "1e100"}, "cpu '1e100', which is out of range"),
        ({"cpu": "NaN"}, "cpu 'NaN', which is not a finite number"),
        ({"cpu": "lots"}, "cpu 'lots', which is not a number"),
        ({"cpu": "0.0001"}, "cpu '0.0001': at most 3 decimal places"),
        ({"mem": "1.5"}, "mem '1.5': must be a whole number"),
        ({"cpu": "-1"}, "cpu '-1': must not be negative"),
        ({"cpu": [1]}, "cpu [1]"),
        ("garbage", "slots 'garbage', which are not a mapping"),
    ],
    ids=[
        "1e-19",
        "1e100",
        "nan",
        "text",
        "finer-than-millicores",
        "half-a-byte",
        "negative",
        "list",
        "not-a-mapping",
    ],
)
def test_a_pass_cancels_a_session_whose_kernel_asks_for_unusable_slots_and_places_the_others(
    alice, bob, image, agent, requested, words
):
    poisoned = launch(alice, name="poisoned", cluster_mode="multi-node", cluster_size=2)
    Kernel.objects.filter(session=poisoned, cluster_hostname="sub1").update(
        requested_slots=requested
    )
    others = launch(bob, name="others")

    result = scheduler.schedule_pass(group_id=others.resource_group_id)

    assert place(others).status == Status.SCHEDULED
    status, reason = the_reason(poisoned)
    assert status == Status.CANCELLED
    assert reason.startswith("cannot be scheduled: kernel sub1 asks for ")
    assert words in reason
    assert set(poisoned.kernels.values_list("status", flat=True)) == {Status.CANCELLED}
    assert (result.placed_sessions, result.cancelled) == (1, 1)


def test_a_poisoned_session_at_the_head_of_the_queue_does_not_hold_up_the_ones_behind_it(
    alice, bob, image, agent
):
    poisoned = launch(alice, name="first")
    Kernel.objects.filter(session=poisoned).update(requested_slots={"cpu": "NaN"})
    behind = [launch(bob, name=f"behind-{i}") for i in range(3)]

    scheduler.schedule_pass(group_id=agent.resource_group_id)

    assert the_reason(poisoned)[0] == Status.CANCELLED
    assert [place(s).status for s in behind] == [Status.SCHEDULED] * 3


def test_the_dependents_of_a_poisoned_session_are_cancelled_naming_it(alice, image, agent):
    poisoned = launch(alice, name="prepare")
    Kernel.objects.filter(session=poisoned).update(requested_slots={"cpu": "lots"})
    dependent = launch(alice, name="train", depends_on=[str(poisoned.pk)])

    scheduler.schedule_pass(group_id=agent.resource_group_id)

    status, reason = the_reason(dependent)
    assert status == Status.CANCELLED
    assert "dependency prepare cancelled: cannot be scheduled" in reason


@pytest.mark.parametrize(
    "starts_at", [AFTER_YEAR_9999, BEFORE_YEAR_1], ids=["after-9999", "before-1"]
)
def test_a_pass_cancels_a_session_whose_start_time_python_cannot_hold(
    postgres, alice, bob, image, agent, starts_at
):
    poisoned = launch(alice, name="poisoned")
    set_with_sql(poisoned, "starts_at", starts_at)
    others = launch(bob, name="others")

    scheduler.schedule_pass(group_id=others.resource_group_id)

    assert place(others).status == Status.SCHEDULED
    assert the_reason(poisoned) == (
        Status.CANCELLED,
        "cannot be scheduled: its start time is not a date between the years 1 and 9999",
    )


def test_a_pass_cancels_a_session_that_starts_later_than_the_api_would_ever_allow(
    alice, bob, image, agent
):
    poisoned = launch(alice, name="poisoned")
    Session.objects.filter(pk=poisoned.pk).update(starts_at=timezone.now() + timedelta(days=4000))
    others = launch(bob, name="others")

    scheduler.schedule_pass(group_id=others.resource_group_id)

    assert place(others).status == Status.SCHEDULED
    status, reason = the_reason(poisoned)
    assert status == Status.CANCELLED
    assert "is more than 366 days after it was created" in reason


def test_a_pass_cancels_a_pending_session_with_an_enormous_batch_timeout(
    postgres, alice, bob, image, agent
):
    poisoned = launch(alice, name="poisoned", type="batch", startup_command="true")
    Session.objects.filter(pk=poisoned.pk).update(batch_timeout=timedelta(seconds=8e13))
    others = launch(bob, name="others")

    scheduler.schedule_pass(group_id=others.resource_group_id)

    assert place(others).status == Status.SCHEDULED
    status, reason = the_reason(poisoned)
    assert status == Status.CANCELLED
    assert reason.startswith("cannot be scheduled: its batch timeout 925925925 d")
    assert reason.endswith("is out of range (more than 0 s, at most 366 d)")


def test_a_pass_cancels_a_pending_session_without_kernels(alice, bob, image, agent):
    poisoned = launch(alice, name="poisoned")
    Kernel.objects.filter(session=poisoned).delete()
    others = launch(bob, name="others")

    # Its kernels may still be on their way (written by a slower writer): it waits a while.
    scheduler.schedule_pass(group_id=others.resource_group_id)
    assert place(others).status == Status.SCHEDULED
    assert the_reason(poisoned)[0] == Status.PENDING

    later = timezone.now() + selectors.NO_KERNELS_GRACE + timedelta(seconds=1)
    scheduler.schedule_pass(group_id=others.resource_group_id, now=later)
    assert the_reason(poisoned) == (Status.CANCELLED, "cannot be scheduled: it has no kernels")


def test_a_pass_leaves_out_an_agent_whose_capacity_it_cannot_read_and_says_why_on_it(
    alice, image, make_agent
):
    make_agent("agent-1", cpu="8")
    session = launch(alice, name="work")
    broken = make_agent("agent-0", cpu="NaN")

    assert place(session).status == Status.SCHEDULED
    assert {k.agent_id for k in session.kernels.all()} == {"agent-1"}
    broken.refresh_from_db()
    assert (
        broken.status_reason
        == "not schedulable: its capacity has cpu 'NaN', which is not a finite number"
    )

    # Fixed by the admin: the next pass uses it again and clears the word.
    Agent.objects.filter(pk="agent-0").update(capacity_slots={"cpu": "64", "mem": str(2**36)})
    later = launch(alice, name="later", resources={"cpu": "32", "mem": "1g"})
    assert place(later).status == Status.SCHEDULED
    assert {k.agent_id for k in later.kernels.all()} == {"agent-0"}
    broken.refresh_from_db()
    assert broken.status_reason == "connected"


def test_an_agent_running_a_kernel_whose_slots_cannot_be_read_takes_nothing_new(
    alice, bob, image, make_agent
):
    make_agent("agent-1", cpu="8")
    running = run(launch(alice, name="running"))
    Kernel.objects.filter(session=running).update(requested_slots={"cpu": "garbage"})
    make_agent("agent-2", cpu="8")
    others = launch(bob, name="others")

    assert place(others).status == Status.SCHEDULED
    assert {k.agent_id for k in others.kernels.all()} == {"agent-2"}
    reason = Agent.objects.get(pk="agent-1").status_reason
    assert reason.startswith("not schedulable: a kernel it runs holds cpu 'garbage'")


# --- the pages and the API with a poisoned row ------------------------------------


@pytest.mark.parametrize(
    "starts_at", [AFTER_YEAR_9999, BEFORE_YEAR_1], ids=["after-9999", "before-1"]
)
def test_the_owners_list_terminate_and_the_admins_list_answer_with_a_far_off_start_time(
    postgres, api, client, alice, admin, image, agent, starts_at
):
    poisoned = launch(alice, name="poisoned", type="batch", startup_command="true")
    set_with_sql(poisoned, "starts_at", starts_at)
    edge = FAR_FUTURE if starts_at == AFTER_YEAR_9999 else FAR_PAST
    shown_as = edge.isoformat()[:10]  # 9999-12-31 or 0001-01-01

    listed = api(alice).get("/api/v1/sessions/")
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()] == ["poisoned"]
    shown = api(alice).get(f"/api/v1/sessions/{poisoned.pk}/").json()["starts_at"]
    assert shown.startswith(shown_as)
    client.force_login(admin)
    page = client.get(reverse("admin:sessions_app_session_changelist"))
    assert page.status_code == 200
    assert "poisoned" in page.content.decode()
    ended = api(alice).post(f"/api/v1/sessions/{poisoned.pk}/terminate/", {}, format="json")
    assert ended.status_code == 200, ended.content
    assert the_reason(poisoned)[0] == Status.CANCELLED


def test_the_owners_list_shows_an_enormous_batch_timeout_as_due(postgres, api, alice, image, agent):
    session = run(launch(alice, name="poisoned", type="batch", startup_command="true"))
    Session.objects.filter(pk=session.pk).update(batch_timeout=timedelta(seconds=8e13))

    listed = api(alice).get("/api/v1/sessions/")

    assert listed.status_code == 200
    (body,) = listed.json()
    assert body["batch_deadline"] is not None
    assert body["seconds_left"] == 0


def test_a_lifetime_limit_too_long_to_reach_shows_no_deadline(postgres, api, alice, image, agent):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_session_lifetime=timedelta(days=999_999_000), idle_timeout=timedelta(days=999_999_000)
    )
    run(launch(alice, name="forever"))

    listed = api(alice).get("/api/v1/sessions/")

    assert listed.status_code == 200
    (body,) = listed.json()
    assert (body["lifetime_deadline"], body["idle_deadline"], body["seconds_left"]) == (
        None,
        None,
        None,
    )


# --- the timeout sweep ------------------------------------------------------------


def _batch(owner, name, timeout):
    return run(
        launch(owner, name=name, type="batch", startup_command="sleep 99", batch_timeout=timeout)
    )


def test_a_sweep_ends_a_session_with_an_enormous_batch_timeout_with_the_reason_and_the_others_too(
    postgres, alice, bob, image, agent
):
    poisoned = _batch(alice, "poisoned", 60)
    Session.objects.filter(pk=poisoned.pk).update(batch_timeout=timedelta(seconds=8e13))
    overdue = _batch(bob, "overdue", 60)

    result = sweeps.sweep_timeouts(now=timezone.now() + timedelta(seconds=61))

    assert sorted(result.ended["batch"]) == sorted([str(poisoned.pk), str(overdue.pk)])
    assert result.failed == []
    status, reason = the_reason(poisoned)
    assert status == Status.TERMINATING
    assert reason.startswith("batch timeout: 925925925 d")
    assert reason.endswith("is out of range (more than 0 s, at most 366 d)")
    assert poisoned.result == Result.FAILED
    assert the_reason(overdue) == (Status.TERMINATING, "batch timeout: ran longer than 1 min")


@pytest.mark.parametrize("timeout", [timedelta(0), timedelta(seconds=-5)], ids=["zero", "negative"])
def test_a_sweep_ends_a_session_whose_batch_timeout_is_not_positive(alice, image, agent, timeout):
    poisoned = _batch(alice, "poisoned", 60)
    Session.objects.filter(pk=poisoned.pk).update(batch_timeout=timeout)

    result = sweeps.sweep_timeouts()

    assert result.ended == {"batch": [str(poisoned.pk)]}
    assert "is out of range" in the_reason(poisoned)[1]


def test_a_sweep_carries_on_past_limits_too_long_to_reach(postgres, alice, bob, image, agent):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_session_lifetime=timedelta(days=999_999_000), idle_timeout=timedelta(days=999_999_000)
    )
    forever = run(launch(alice, name="forever"))
    overdue = _batch(bob, "overdue", 60)

    result = sweeps.sweep_timeouts(now=timezone.now() + timedelta(seconds=61))

    assert result.ended == {"batch": [str(overdue.pk)]}
    assert the_reason(forever)[0] == Status.RUNNING


def test_a_sweep_carries_on_past_a_start_time_python_cannot_hold(
    postgres, alice, bob, image, agent
):
    ResourcePolicy.objects.filter(is_default=True).update(max_session_lifetime=timedelta(hours=1))
    odd = _batch(alice, "odd", 60)
    set_with_sql(odd, "started_at", "294276-01-01T00:00:00Z")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE sessions_app_kernel SET started_at = '294276-01-01T00:00:00Z' WHERE session_id = %s",
            [odd.pk],
        )
    overdue = _batch(bob, "overdue", 60)

    result = sweeps.sweep_timeouts(now=timezone.now() + timedelta(seconds=61))

    assert result.ended == {"batch": [str(overdue.pk)]}
    assert result.failed == []
    assert the_reason(odd)[0] == Status.RUNNING


def test_a_sweep_ends_a_session_it_cannot_work_out_with_the_error_and_carries_on(
    alice, bob, image, agent, monkeypatch
):
    broken = _batch(alice, "broken", 60)
    overdue = _batch(bob, "overdue", 60)
    real = deadlines.session_deadlines

    def fails_for_broken(*, session, **kwargs):
        if session.pk == broken.pk:
            raise OverflowError("date value out of range")
        return real(session=session, **kwargs)

    monkeypatch.setattr(sweeps, "session_deadlines", fails_for_broken)

    result = sweeps.sweep_timeouts(now=timezone.now() + timedelta(seconds=61))

    assert result.ended == {"batch": [str(overdue.pk)], "unhandled": [str(broken.pk)]}
    assert the_reason(broken) == (
        Status.TERMINATING,
        "ended: its time limits cannot be checked (OverflowError: date value out of range)",
    )
    ended = SessionEvent.objects.filter(session=broken, kernel=None, to_status=Status.TERMINATING)
    assert ended.count() == 1
