"""Lost agents and manager restarts (scheduler_app.reconcile, the lost-agent sweep).

The rule: an agent is LOST when it has been silent for the whole lost timeout
*while* some gateway was listening all that time. A manager that was away longer
than the timeout gives every agent a full timeout to dial back in; a session that
was starting meanwhile is adopted from the agent's report, not failed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from agent import protocol
from scheduler_app import reconcile
from sessions_app import services
from sessions_app.models import Agent, AgentStatus, Kernel, Session, Status

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 30.0


@pytest.fixture(autouse=True)
def _lost_timeout(settings):
    settings.BAI_AGENT_LOST_TIMEOUT = TIMEOUT


@pytest.fixture
def beacon():
    """The gateways' listening record in Redis; ``beacon.came_back(at)`` says the
    gateways (re)started listening at that time, ``beacon.gone()`` that none listens."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = reconcile.gateway_listening_key()

    class Beacon:
        def came_back(self, at: datetime) -> None:
            client.set(key, repr(at.timestamp()), px=int(TIMEOUT * 1000))

        def gone(self) -> None:
            client.delete(key)

        def since(self) -> float:
            return float(client.get(key))

    yield Beacon()
    client.delete(key)


@pytest.fixture
def starting_session(alice, image, agent):
    """A session placed on ``agent`` and PREPARING there, its agent last heard
    from two minutes ago (the manager was down meanwhile)."""
    session = services.session_create(owner=alice, spec={"image": image.reference})
    reconcile.agent_kernel_report(
        agent_id=agent.pk,
        report={"kernel_id": str(session.pk), "status": protocol.KR_PREPARING},
    )
    assert Session.objects.get(pk=session.pk).status == Status.PREPARING
    Agent.objects.filter(pk=agent.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=2)
    )
    return session


def test_agents_are_not_lost_right_after_a_manager_restart_longer_than_the_timeout(
    agent, starting_session, beacon
):
    now = timezone.now()
    beacon.came_back(now - timedelta(seconds=1))

    assert reconcile.sweep_lost_agents(now=now) == []
    assert Agent.objects.get(pk=agent.pk).status == AgentStatus.ALIVE
    assert Session.objects.get(pk=starting_session.pk).status == Status.PREPARING


def test_a_starting_session_is_adopted_when_its_agent_comes_back_with_it_running(
    agent, starting_session, beacon
):
    now = timezone.now()
    beacon.came_back(now - timedelta(seconds=5))
    reconcile.sweep_lost_agents(now=now)

    running = {
        "kernel_id": str(starting_session.pk),
        "session_id": str(starting_session.pk),
        "status": protocol.KR_RUNNING,
        "container_id": "c-main1",
    }
    reconcile.agent_register(agent=agent, info={"slots": agent.capacity_slots})
    commands = reconcile.agent_reconcile(agent_id=agent.pk, reports=[running])

    assert commands == []  # adopted: neither created again nor destroyed
    session = Session.objects.get(pk=starting_session.pk)
    assert session.status == Status.RUNNING
    assert Kernel.objects.get(pk=starting_session.pk).container_id == "c-main1"


def test_a_truly_silent_agent_is_lost_one_timeout_after_the_manager_came_back(
    agent, starting_session, beacon
):
    back = timezone.now()
    beacon.came_back(back)

    assert reconcile.sweep_lost_agents(now=back + timedelta(seconds=TIMEOUT - 1)) == []
    assert reconcile.sweep_lost_agents(now=back + timedelta(seconds=TIMEOUT + 1)) == [agent.pk]
    lost = Agent.objects.get(pk=agent.pk)
    assert lost.status == AgentStatus.LOST
    assert "no heartbeat" in lost.status_reason
    session = Session.objects.get(pk=starting_session.pk)
    assert session.status == Status.ERROR
    assert "lost" in session.status_reason


def test_an_agent_that_heartbeats_after_the_restart_is_never_lost(agent, starting_session, beacon):
    back = timezone.now()
    beacon.came_back(back)
    reconcile.agent_heartbeat(agent_id=agent.pk, now=back + timedelta(seconds=2))

    assert reconcile.sweep_lost_agents(now=back + timedelta(seconds=TIMEOUT + 1)) == []
    assert Agent.objects.get(pk=agent.pk).status == AgentStatus.ALIVE


def test_no_agent_is_lost_while_no_gateway_listens(agent, starting_session, beacon):
    beacon.gone()

    assert reconcile.sweep_lost_agents() == []
    assert Agent.objects.get(pk=agent.pk).status == AgentStatus.ALIVE


def test_without_redis_the_sweep_goes_by_heartbeats_alone(agent, starting_session, monkeypatch):
    def unreachable():
        raise redis.ConnectionError("connection refused")

    monkeypatch.setattr(reconcile, "gateway_listening_since", unreachable)

    assert reconcile.sweep_lost_agents() == [agent.pk]


def test_a_gateway_beat_keeps_the_start_of_the_listening_period(beacon):
    started = timezone.now() - timedelta(minutes=5)
    beacon.came_back(started)
    reconcile.gateway_listening_beat()
    assert reconcile.gateway_listening_since() == datetime.fromtimestamp(
        started.timestamp(), tz=UTC
    )

    # Once no gateway has beaten for the expiry, the next beat starts a new period.
    beacon.gone()
    before = time.time()
    reconcile.gateway_listening_beat()
    assert beacon.since() >= before
