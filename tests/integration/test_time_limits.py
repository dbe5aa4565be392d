"""Time limits, each with an injected clock (time_machine): idle timeout,
lifetime limit, batch timeout (Celery beat's ``sweep_timeouts``) and the
resource group's pending timeout (beat's ``schedule_all``).

Personas (tests/conftest.py): ``alice`` runs sessions under the default
policy; ``bob`` is given a policy of his own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from session_steps import destroyed, exit_main, launch, run

from scheduler_app import sweeps, tasks
from sessions_app import services
from sessions_app.models import (
    ResourcePolicy,
    Result,
    SessionEvent,
    Status,
    UserResourcePolicy,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
IDLE = "idle timeout: no activity for 2 min"


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


def at(clock, **delta) -> datetime:
    """Move the clock to T0 + delta; returns that time."""
    when = T0 + timedelta(**delta)
    clock.move_to(when)
    return when


@pytest.fixture
def default_policy(group):
    policy = ResourcePolicy.objects.get(is_default=True)
    policy.idle_timeout = timedelta(minutes=2)
    policy.save()
    return policy


@pytest.fixture
def running(clock, alice, image, agent, default_policy):
    """An interactive session of alice's, running since T0."""
    return run(launch(alice, name="notebook"))


def sweep(clock, **delta):
    return sweeps.sweep_timeouts(now=at(clock, **delta))


# --- idle timeout ----------------------------------------------------------------------------


def test_an_untouched_interactive_session_ends_when_its_idle_timeout_passes(clock, running):
    assert sweep(clock, minutes=1, seconds=59).count == 0
    running.refresh_from_db()
    assert running.status == Status.RUNNING

    result = sweep(clock, minutes=2)

    assert result.ended == {"idle": [str(running.pk)]}
    running.refresh_from_db()
    assert running.status == Status.TERMINATING
    assert running.status_reason == IDLE
    # The agent confirms; the reason stays visible on the ended session.
    destroyed(running)
    assert running.status == Status.TERMINATED
    assert IDLE in running.status_reason


def test_activity_just_before_the_timeout_keeps_the_session(clock, running):
    at(clock, minutes=1, seconds=59)
    services.session_touch(session_id=running.pk)

    assert sweep(clock, minutes=2, seconds=30).count == 0
    assert sweep(clock, minutes=3, seconds=58).count == 0
    running.refresh_from_db()
    assert running.status == Status.RUNNING
    # Two minutes after that last activity, it ends.
    assert sweep(clock, minutes=3, seconds=59).ended == {"idle": [str(running.pk)]}


def test_an_open_terminal_counts_as_activity_until_it_is_closed(clock, running):
    # The terminal consumer touches the session on connect and every 30 s while open.
    for second in range(0, 20 * 60, 10):
        at(clock, seconds=second)
        if second % 30 == 0:
            services.session_touch(session_id=running.pk)
        assert sweeps.sweep_timeouts(now=T0 + timedelta(seconds=second)).count == 0
    running.refresh_from_db()
    assert running.status == Status.RUNNING

    # Closed at 19:30 (the last touch): two minutes later it is idle.
    assert sweep(clock, minutes=21, seconds=29).count == 0
    assert sweep(clock, minutes=21, seconds=30).ended == {"idle": [str(running.pk)]}


def test_reading_the_session_is_not_activity_even_by_its_owner(clock, running, api, alice, admin):
    """An open page reads the session (and its runs and logs): that is no activity, as
    in Backend.AI and JupyterHub; what the owner does is (tests/channels)."""
    at(clock, minutes=1, seconds=30)
    assert api(alice).get(f"/api/v1/sessions/{running.pk}/").status_code == 200
    at(clock, minutes=1, seconds=45)
    assert api(admin).get(f"/api/v1/sessions/{running.pk}/").status_code == 200

    assert sweep(clock, minutes=1, seconds=59).count == 0
    assert sweep(clock, minutes=2).count == 1


def test_the_idle_clock_starts_when_the_session_starts_running(
    clock, alice, image, agent, default_policy
):
    session = launch(alice, name="slow-pull")
    # Five minutes pending and pulling are not idleness.
    at(clock, minutes=5)
    run(session)
    assert sweep(clock, minutes=6, seconds=59).count == 0
    assert sweep(clock, minutes=7).count == 1


def test_batch_sessions_are_never_idle_while_main1_runs(clock, alice, image, agent, default_policy):
    batch = run(launch(alice, name="train", type="batch", startup_command="python train.py"))
    assert sweep(clock, hours=5).count == 0
    batch.refresh_from_db()
    assert batch.status == Status.RUNNING


def test_a_policy_without_an_idle_timeout_keeps_sessions_of_its_users(
    clock, alice, bob, image, agent, default_policy
):
    patient = ResourcePolicy.objects.create(name="patient")
    UserResourcePolicy.objects.create(user=bob, policy=patient)
    bobs = run(launch(bob, name="bobs"))
    alices = run(launch(alice, name="alices"))

    assert sweep(clock, hours=1).ended == {"idle": [str(alices.pk)]}
    bobs.refresh_from_db()
    assert bobs.status == Status.RUNNING


def test_an_idle_timeout_changed_in_admin_applies_to_running_sessions(
    clock, running, default_policy
):
    default_policy.idle_timeout = timedelta(minutes=10)
    default_policy.save()
    assert sweep(clock, minutes=9).count == 0
    default_policy.idle_timeout = timedelta(minutes=5)
    default_policy.save()
    assert sweep(clock, minutes=9, seconds=10).count == 1


# --- lifetime limit --------------------------------------------------------------------------


def test_the_lifetime_limit_ends_a_busy_session(clock, running, default_policy):
    default_policy.max_session_lifetime = timedelta(hours=1)
    default_policy.save()
    for minute in range(60):
        at(clock, minutes=minute)
        services.session_touch(session_id=running.pk)
        assert sweeps.sweep_timeouts(now=T0 + timedelta(minutes=minute)).count == 0

    assert sweep(clock, hours=1).ended == {"lifetime": [str(running.pk)]}
    running.refresh_from_db()
    assert running.status_reason == "lifetime limit: ran longer than 1 h"


def test_the_lifetime_limit_applies_to_batch_sessions_and_fails_them(
    clock, alice, image, agent, default_policy
):
    default_policy.max_session_lifetime = timedelta(minutes=90)
    default_policy.save()
    batch = run(launch(alice, name="long", type="batch", startup_command="sleep 1d"))
    assert sweep(clock, minutes=89).count == 0
    assert sweep(clock, minutes=90).ended == {"lifetime": [str(batch.pk)]}
    batch.refresh_from_db()
    assert batch.status_reason == "lifetime limit: ran longer than 1 h 30 min"
    assert batch.result == Result.FAILED


# --- batch timeout ---------------------------------------------------------------------------


def test_a_batch_session_past_its_batch_timeout_ends_failed_with_that_reason(
    clock, alice, image, agent
):
    batch = run(
        launch(alice, name="job", type="batch", startup_command="sleep 60", batch_timeout=30)
    )
    assert sweep(clock, seconds=29).count == 0

    assert sweep(clock, seconds=30).ended == {"batch": [str(batch.pk)]}
    batch.refresh_from_db()
    assert batch.status == Status.TERMINATING
    assert batch.result == Result.FAILED
    assert batch.status_reason == "batch timeout: ran longer than 30 s"

    # main1, killed, exits with 137: the result stays FAILED and the session ends.
    exit_main(batch, 137)
    assert batch.status == Status.TERMINATED
    assert batch.result == Result.FAILED
    reasons = list(batch.events.filter(kernel=None).values_list("reason", flat=True))
    assert "batch timeout: ran longer than 30 s" in reasons


def test_the_batch_timeout_counts_from_when_main1_started_its_command(clock, alice, image, agent):
    batch = launch(alice, name="job", type="batch", startup_command="true", batch_timeout=60)
    at(clock, minutes=10)  # pending and preparing do not count
    run(batch)
    assert sweep(clock, minutes=10, seconds=59).count == 0
    assert sweep(clock, minutes=11).count == 1


# --- running twice, beat task ----------------------------------------------------------------


def test_a_second_sweep_finds_nothing_to_do(clock, running):
    assert sweep(clock, minutes=5).count == 1
    assert sweep(clock, minutes=5).count == 0
    assert sweep(clock, minutes=6).count == 0
    assert SessionEvent.objects.filter(session=running, kernel=None, reason=IDLE).count() == 1


def test_the_beat_task_runs_the_sweeps(clock, running):
    at(clock, minutes=3)
    tasks.sweep_timeouts()
    running.refresh_from_db()
    assert running.status_reason == IDLE


# --- pending timeout (the scheduling pass beat runs every 5 s) -------------------------------


def test_the_pending_timeout_of_a_resource_group_cancels_a_session_waiting_too_long(
    clock, alice, image, group, django_capture_on_commit_callbacks
):
    group.pending_timeout = timedelta(minutes=5)
    group.save()
    waiting = launch(alice, name="waits")  # the group has no agent: it cannot start

    at(clock, minutes=4, seconds=59)
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_all()
    waiting.refresh_from_db()
    assert waiting.status == Status.PENDING

    at(clock, minutes=5, seconds=5)
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_all()
    waiting.refresh_from_db()
    assert waiting.status == Status.CANCELLED
    assert waiting.status_reason == "pending timeout: waited longer than 5 min"
    assert not waiting.kernels.exclude(status=Status.CANCELLED).exists()


# --- what the API shows ----------------------------------------------------------------------


def test_the_api_shows_the_deadlines_and_the_time_left(clock, running, api, alice, default_policy):
    default_policy.max_session_lifetime = timedelta(hours=1)
    default_policy.save()
    at(clock, seconds=30)
    body = api(alice).get("/api/v1/sessions/").json()[0]
    # Listing does not count as activity on one session; the idle clock runs from T0.
    assert body["idle_deadline"] == "2030-01-07T09:02:00Z"
    assert body["lifetime_deadline"] == "2030-01-07T10:00:00Z"
    assert body["batch_deadline"] is None
    assert body["seconds_left"] == 90

    detail = api(alice).get(f"/api/v1/sessions/{running.pk}/").json()
    # Reading the session is no activity either: the idle deadline stays.
    assert detail["idle_deadline"] == "2030-01-07T09:02:00Z"
    assert detail["seconds_left"] == 90


def test_a_session_without_limits_shows_no_deadline(clock, alice, image, agent, api, group):
    session = run(launch(alice, name="free"))
    body = api(alice).get(f"/api/v1/sessions/{session.pk}/").json()
    assert body["idle_deadline"] is None
    assert body["lifetime_deadline"] is None
    assert body["seconds_left"] is None


def test_a_pending_session_shows_no_deadline(clock, alice, image, api, default_policy):
    session = launch(alice, name="later")
    body = api(alice).get(f"/api/v1/sessions/{session.pk}/").json()
    assert body["idle_deadline"] is None
    assert body["seconds_left"] is None


def test_a_pending_session_shows_the_limits_that_will_apply(clock, alice, image, api, group):
    policy = ResourcePolicy.objects.get(is_default=True)
    policy.idle_timeout = timedelta(minutes=2)
    policy.max_session_lifetime = timedelta(hours=1)
    policy.save()
    notebook = launch(alice, name="later")
    launch(alice, name="job", type="batch", startup_command="true", batch_timeout=30)

    listed = {s["name"]: s for s in api(alice).get("/api/v1/sessions/").json()}
    assert listed["later"]["status"] == "PENDING"
    assert listed["later"]["limits"] == {
        "idle_timeout": 120,
        "max_session_lifetime": 3600,
        "batch_timeout": None,
    }
    # A batch session is never idle; its own batch timeout applies.
    assert listed["job"]["limits"] == {
        "idle_timeout": None,
        "max_session_lifetime": 3600,
        "batch_timeout": 30,
    }
    detail = api(alice).get(f"/api/v1/sessions/{notebook.pk}/").json()
    assert detail["limits"]["idle_timeout"] == 120


def test_a_session_under_a_policy_without_limits_has_none(clock, alice, image, api, group):
    session = launch(alice, name="free")
    body = api(alice).get(f"/api/v1/sessions/{session.pk}/").json()
    assert body["limits"] == {
        "idle_timeout": None,
        "max_session_lifetime": None,
        "batch_timeout": None,
    }
