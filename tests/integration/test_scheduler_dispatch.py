"""The dispatcher on the database: what a waiting session says, how admins'
scheduling settings take effect at the next pass, head-of-line avoidance,
terminations racing a pass, and an agent joining.

Sessions are launched through ``session_create`` as the API does; passes run
through ``schedule_pass`` (on_commit hooks do not fire inside these tests'
transaction, so nothing runs a pass behind the test's back).

Personas (tests/conftest.py): ``alice`` and ``bob`` launch sessions and read
their own through the API; ``admin`` changes resource groups and reads the
session list in Django admin.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone
from session_steps import launch, place, run

from agent import protocol
from scheduler_app import policy, reconcile
from scheduler_app import services as scheduler
from sessions_app import services
from sessions_app.models import (
    Agent,
    AgentStatus,
    ResourcePolicy,
    SessionEvent,
    Status,
)
from tests.conftest import skip_or_fail
from tests.live import wait_for

pytestmark = pytest.mark.django_db

GIB = 2**30


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _roomy_default_policy(group):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_concurrent_sessions=50, max_pending_sessions=50
    )


def admin_edit_group(client, admin, group, **changes):
    """Change a resource group the way an admin does: POST its admin change form."""
    client.force_login(admin)
    group.refresh_from_db()
    form = {
        "name": group.name,
        "description": group.description,
        "is_active": "on" if group.is_active else "",
        "session_selection": group.session_selection,
        "num_retries_to_skip": str(group.num_retries_to_skip),
        "agent_selection": group.agent_selection,
        "allowed_session_types": group.allowed_session_types,
        "pending_timeout": "",
        "_save": "Save",
    }
    form.update({key: str(value) for key, value in changes.items()})
    url = reverse("admin:sessions_app_resourcegroup_change", args=[group.pk])
    response = client.post(url, form)
    assert response.status_code == 302, response.context["adminform"].form.errors
    group.refresh_from_db()
    return group


def kernel_agents(session):
    return sorted(k.agent_id for k in session.kernels.all())


def waiting_events(session):
    return list(
        SessionEvent.objects.filter(
            session=session, kernel=None, reason__startswith="waiting:"
        ).values_list("reason", flat=True)
    )


# --- why a session waits ----------------------------------------------------


def test_a_session_that_cannot_be_placed_says_why_in_the_api_and_in_admin(
    api, client, alice, admin, image, make_agent
):
    make_agent("agent-1", cpu="8")
    run(launch(alice, name="small", resources={"cpu": "2", "mem": "1g"}))
    big = launch(alice, name="big", resources={"cpu": "8", "mem": "1g"})

    place(big)

    reason = "needs 8 cpu per container; largest free on an agent: 6"
    body = api(alice).get(f"/api/v1/sessions/{big.pk}/").json()
    assert (body["status"], body["status_reason"]) == (Status.PENDING, reason)
    assert body["scheduling_attempts"] == 1
    assert {k["status"] for k in body["kernels"]} == {Status.PENDING}
    client.force_login(admin)
    page = client.get(reverse("admin:sessions_app_session_changelist")).content.decode()
    assert reason in page


def test_every_pass_a_session_is_short_of_resources_counts_as_an_attempt(
    api, alice, image, make_agent
):
    make_agent("agent-1", cpu="4")
    run(launch(alice, name="hog", resources={"cpu": "4", "mem": "1g"}))
    short = launch(alice, name="short", resources={"cpu": "2", "mem": "1g"})
    later = launch(
        alice,
        name="later",
        type="batch",
        startup_command="true",
        starts_at=(timezone.now() + timedelta(hours=1)).isoformat(),
    )

    for _ in range(3):
        place(short)

    assert api(alice).get(f"/api/v1/sessions/{short.pk}/").json()["scheduling_attempts"] == 3
    # Held back by a check (its start time), not by resources: no attempt counted.
    later.refresh_from_db()
    assert later.status == Status.PENDING
    assert later.scheduling_attempts == 0
    assert later.status_reason.startswith("starts at")


def test_a_wait_writes_an_event_only_when_its_reason_changes(alice, image, make_agent):
    make_agent("agent-1", cpu="8")
    run(launch(alice, name="first", resources={"cpu": "2", "mem": "1g"}))
    big = launch(alice, name="big", resources={"cpu": "8", "mem": "1g"})

    for _ in range(3):
        place(big)
    assert waiting_events(big) == [
        "waiting: needs 8 cpu per container; largest free on an agent: 6"
    ]

    make_agent("agent-2", cpu="7")
    for _ in range(2):
        place(big)

    assert waiting_events(big) == [
        "waiting: needs 8 cpu per container; largest free on an agent: 6",
        "waiting: needs 8 cpu per container; largest free on an agent: 7",
    ]
    assert big.scheduling_attempts == 5


# --- admins change the policy; the next pass follows ------------------------


def test_switching_a_group_from_fifo_to_drf_in_admin_changes_who_goes_next(
    client, admin, alice, bob, image, group, make_agent
):
    make_agent("agent-1", cpu="4", mem=64 * GIB)
    two = {"cpu": "2", "mem": "1g"}
    run(launch(alice, name="a-running", resources=two))
    a_next = launch(alice, name="a-next", resources=two)
    a_last = launch(alice, name="a-last", resources=two)
    b_first = launch(bob, name="b-first", resources=two)
    assert group.session_selection == "fifo"

    # FIFO: the oldest goes first, although alice already holds half the agent.
    place(a_next)
    assert a_next.status == Status.SCHEDULED
    b_first.refresh_from_db()
    assert b_first.status == Status.PENDING

    admin_edit_group(client, admin, group, session_selection="drf")
    services.session_terminate(session=a_next, reason="done")
    for kernel in a_next.kernels.all():
        reconcile.agent_kernel_report(
            agent_id=kernel.agent_id,
            report={"kernel_id": str(kernel.pk), "status": protocol.KR_GONE},
        )

    # DRF: bob holds nothing, so his newer session goes before alice's older one.
    place(b_first)
    assert b_first.status == Status.SCHEDULED
    a_last.refresh_from_db()
    assert a_last.status == Status.PENDING


def test_switching_a_group_from_dispersed_to_concentrated_in_admin_changes_where_kernels_go(
    client, admin, alice, image, group, make_agent
):
    make_agent("big", cpu="16", mem=64 * GIB)
    make_agent("small", cpu="4", mem=64 * GIB)
    admin_edit_group(client, admin, group, agent_selection="dispersed")
    one = {"cpu": "2", "mem": "1g"}

    spread = place(launch(alice, name="spread", resources=one))
    assert kernel_agents(spread) == ["big"]  # the most free

    admin_edit_group(client, admin, group, agent_selection="concentrated")
    packed = place(launch(alice, name="packed", resources=one))
    assert kernel_agents(packed) == ["small"]  # the least free that fits


def test_head_of_line_avoidance_set_in_admin_lets_later_sessions_past_a_stuck_one(
    client, admin, alice, image, group, make_agent
):
    make_agent("agent-1", cpu="4", mem=64 * GIB)
    run(launch(alice, name="hog", resources={"cpu": "2", "mem": "1g"}))
    stuck = launch(alice, name="stuck", resources={"cpu": "4", "mem": "1g"})
    small = launch(alice, name="small", resources={"cpu": "1", "mem": "1g"})

    # Plain FIFO: the head blocks everything behind it, pass after pass.
    for _ in range(3):
        place(stuck)
    small.refresh_from_db()
    assert small.status == Status.PENDING
    assert (
        small.status_reason
        == f"queued behind session {str(stuck.pk)[:8]} which waits for resources"
    )
    assert small.scheduling_attempts == 0

    admin_edit_group(client, admin, group, num_retries_to_skip=3)
    place(stuck)  # 4 failures now: more than 3
    small.refresh_from_db()
    assert small.status == Status.PENDING

    place(stuck)  # pushed behind the others
    small.refresh_from_db()
    assert small.status == Status.SCHEDULED
    assert stuck.status == Status.PENDING
    assert stuck.scheduling_attempts == 5


# --- terminations racing a pass ---------------------------------------------


def test_a_session_terminated_just_before_a_pass_is_never_placed(alice, image, make_agent):
    make_agent("agent-1", cpu="8")
    gone = launch(alice, name="gone", cluster_mode="multi-node", cluster_size=2)
    kept = launch(alice, name="kept")
    services.session_terminate(session=gone, reason="changed my mind")

    place(kept)

    gone.refresh_from_db()
    assert gone.status == Status.CANCELLED
    assert kept.status == Status.SCHEDULED
    assert all(k.agent_id is None for k in gone.kernels.all())
    assert not gone.events.filter(to_status=Status.SCHEDULED).exists()


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        skip_or_fail("racing a pass needs PostgreSQL's row locks (set DATABASE_URL)")


def _in_thread(target):
    errors = []

    def body():
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_a_terminate_in_flight_when_a_pass_starts_keeps_the_session_off_the_agents(
    postgres_only, monkeypatch, alice, image, make_agent
):
    monkeypatch.setattr("scheduler_app.tasks.request_pass", lambda resource_group_id: None)
    make_agent("agent-1", cpu="8")
    gone = launch(alice, name="gone", cluster_mode="multi-node", cluster_size=2)
    kept = launch(alice, name="kept")
    locked, release = threading.Event(), threading.Event()

    def terminate():
        with transaction.atomic():
            services.session_terminate(session=gone, reason="changed my mind")
            locked.set()  # the row lock is held until this commits
            assert release.wait(timeout=30)

    thread, errors = _in_thread(terminate)
    assert locked.wait(timeout=30)
    try:
        result = scheduler.schedule_pass(group_id=gone.resource_group_id)
    finally:
        release.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert result.placed_sessions == 1
    scheduler.schedule_pass(group_id=gone.resource_group_id)

    gone.refresh_from_db()
    kept.refresh_from_db()
    assert (gone.status, kept.status) == (Status.CANCELLED, Status.SCHEDULED)
    assert all(k.agent_id is None for k in gone.kernels.all())
    assert not gone.events.filter(to_status=Status.SCHEDULED).exists()


def _backends_waiting_on_a_lock():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_terminate_arriving_during_a_pass_waits_for_it_then_ends_what_it_placed(
    postgres_only, monkeypatch, alice, image, make_agent
):
    monkeypatch.setattr("scheduler_app.tasks.request_pass", lambda resource_group_id: None)
    make_agent("agent-1", cpu="8")
    late = launch(alice, name="late", cluster_mode="multi-node", cluster_size=2)
    deciding, decided = threading.Event(), threading.Event()
    real_schedule = policy.schedule

    def slow_schedule(snapshot):
        deciding.set()
        assert decided.wait(timeout=30)
        return real_schedule(snapshot)

    monkeypatch.setattr(policy, "schedule", slow_schedule)

    def terminate():
        assert deciding.wait(timeout=30)
        services.session_terminate(session=late, reason="changed my mind")

    def release_once_the_terminate_waits():
        # Its own connection: the main one is inside the pass.
        wait_for(lambda: _backends_waiting_on_a_lock() > 0, timeout=30, what="a lock wait")
        decided.set()

    thread, errors = _in_thread(terminate)
    watcher, watch_errors = _in_thread(release_once_the_terminate_waits)
    result = scheduler.schedule_pass(group_id=late.resource_group_id)
    thread.join(timeout=30)
    watcher.join(timeout=30)
    assert not errors + watch_errors, errors + watch_errors

    assert result.placed_sessions == 1
    late.refresh_from_db()
    assert late.status == Status.TERMINATING
    assert {k.status for k in late.kernels.all()} == {Status.TERMINATING}
    assert late.events.filter(to_status=Status.SCHEDULED, kernel=None).count() == 1


# --- an agent joining --------------------------------------------------------


def test_an_agent_joining_runs_a_pass_that_places_the_waiting_sessions(
    alice, image, group, django_capture_on_commit_callbacks
):
    newcomer = Agent(id="newcomer", resource_group=group, status=AgentStatus.LOST)
    newcomer.set_new_token()
    newcomer.save()
    waiting = [launch(alice, name=f"w{i}") for i in range(3)]
    scheduler.schedule_pass(group_id=group.pk)
    for session in waiting:
        session.refresh_from_db()
        assert session.status_reason == "no agent alive and schedulable in resource group default"

    with django_capture_on_commit_callbacks(execute=True):
        reconcile.agent_register(agent=newcomer, info={"slots": {"cpu": "8", "mem": str(16 * GIB)}})

    for session in waiting:
        session.refresh_from_db()
        assert session.status == Status.SCHEDULED, session.status_reason
        assert kernel_agents(session) == ["newcomer"]
