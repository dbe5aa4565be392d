"""The lost-agent sweep running while kernel reports and terminations arrive
for the same sessions never deadlocks, and leaves every kernel and session
consistent.

Every path takes its row locks in one order -- the session, then its kernels,
then their agent -- as reports and terminations always have. The sweep used to
lock the agent first (marking it LOST) and then walk its kernels' sessions in
the same transaction, while a report held a session and waited for the agent
to refresh its occupancy: PostgreSQL broke the cycle by aborting one of them.

Real transactions and row locks: PostgreSQL only, one connection per thread.
"""

from __future__ import annotations

import random
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agent import protocol
from scheduler_app import reconcile, tasks
from sessions_app import services
from sessions_app.errors import Conflict
from sessions_app.models import (
    OCCUPYING,
    TERMINAL,
    Agent,
    AgentStatus,
    Kernel,
    ResourcePolicy,
    Session,
    Status,
    derive_session_status,
)
from tests.conftest import skip_or_fail

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 20


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        skip_or_fail("concurrency tests need PostgreSQL (set DATABASE_URL)")


@pytest.fixture(autouse=True)
def _no_passes(monkeypatch):
    # Celery is eager in tests: an ending session would run a pass inline.
    monkeypatch.setattr(tasks, "request_pass", lambda resource_group_id: None)


@pytest.fixture(autouse=True)
def _gateways_listened_all_along(monkeypatch):
    # The sweep declares an agent lost only when the gateways listened for the
    # whole timeout (a manager restart is not the agents' silence).
    monkeypatch.setattr(
        reconcile, "gateway_listening_since", lambda: timezone.now() - timedelta(days=1)
    )


def _running_clusters(owner, image, lost: Agent, alive: Agent) -> list[Session]:
    """Clusters of two with main1 on the agent that will be lost and sub1 on
    one that stays, every kernel running (as the agents reported)."""
    sessions = []
    for i in range(SESSIONS):
        session = services.session_create(
            owner=owner,
            spec={
                "image": image.reference,
                "name": f"s{i}",
                "cluster_mode": "multi-node",
                "cluster_size": 2,
                "resources": {"cpu": "1", "mem": "256m"},
            },
        )
        for kernel in session.kernels.all():
            where = lost if kernel.cluster_hostname == "main1" else alive
            Kernel.bulk_transition(
                [kernel.pk], Status.PENDING, Status.SCHEDULED, "placed", agent=where
            )
            kernel.refresh_from_db()
            reconcile.kernel_apply_report(kernel=kernel, report={"status": protocol.KR_RUNNING})
        session.refresh_from_db()
        assert session.status == Status.RUNNING
        sessions.append(session)
    return sessions


def _in_thread(errors: list[BaseException], start: threading.Barrier, work) -> threading.Thread:
    def body() -> None:
        try:
            start.wait()
            work()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
        finally:
            connection.close()

    return threading.Thread(target=body)


def test_the_lost_agent_sweep_never_deadlocks_with_reports_and_terminations(
    alice, image, group, make_agent
):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_concurrent_sessions=None, max_pending_sessions=None
    )
    lost = make_agent("agent-lost", cpu="64", mem=64 * 2**30)
    alive = make_agent("agent-alive", cpu="64", mem=64 * 2**30)
    sessions = _running_clusters(alice, image, lost, alive)
    Agent.objects.filter(pk=lost.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    Agent.objects.filter(pk=alive.pk).update(last_heartbeat_at=timezone.now())
    main_kernels = list(Kernel.objects.filter(agent=lost).values_list("pk", flat=True))
    rng = random.Random(10)

    def sweep() -> None:
        assert reconcile.sweep_lost_agents() == [lost.pk]

    def late_reports() -> None:
        # The lost agent's last words arrive while it is being declared lost.
        for kernel_id in rng.sample(main_kernels, len(main_kernels)):
            reconcile.agent_kernel_report(
                agent_id=lost.pk,
                report={"kernel_id": str(kernel_id), "status": protocol.KR_EXITED, "exit_code": 0},
            )

    def terminations() -> None:
        for session in rng.sample(sessions, len(sessions) // 2):
            try:
                services.session_terminate(session=session, reason="the user ended it")
            except Conflict:
                pass  # already ended by the sweep or a report

    errors: list[BaseException] = []
    start = threading.Barrier(3)
    threads = [_in_thread(errors, start, work) for work in (sweep, late_reports, terminations)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert Agent.objects.get(pk=lost.pk).status == AgentStatus.LOST
    assert not Kernel.objects.filter(agent=lost, status__in=OCCUPYING).exists()
    assert Agent.objects.get(pk=lost.pk).occupied_slots == {}
    for session in Session.objects.prefetch_related("kernels"):
        kernels = list(session.kernels.all())
        main = next(k for k in kernels if k.cluster_hostname == "main1")
        derived = derive_session_status(main.status, [k.status for k in kernels])
        assert main.status in TERMINAL
        assert session.status in (derived, *TERMINAL), (session.status, derived)
        assert session.status in (Status.TERMINATING, *TERMINAL)


def test_kernels_of_an_agent_declared_lost_by_an_interrupted_sweep_are_ended_by_the_next(
    alice, image, group, make_agent
):
    lost = make_agent("agent-lost", cpu="64", mem=64 * 2**30)
    alive = make_agent("agent-alive", cpu="64", mem=64 * 2**30)
    sessions = _running_clusters(alice, image, lost, alive)[:2]
    # A sweep killed after marking the agent LOST, before ending its kernels.
    reason = "agent agent-lost lost: no heartbeat for 3600 s"
    Agent.objects.filter(pk=lost.pk).update(status=AgentStatus.LOST, status_reason=reason)

    assert reconcile.sweep_lost_agents() == []

    assert not Kernel.objects.filter(agent=lost, status__in=OCCUPYING).exists()
    main = Kernel.objects.get(pk=sessions[0].pk)
    assert (main.status, main.status_reason) == (Status.ERROR, reason)
