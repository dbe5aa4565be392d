"""The manager's /metrics: who may read it, and that its figures agree with the database.

Personas (tests/conftest.py): alice is a plain user (no metrics), root an admin.
Counters live in Redis and outlast a test, so tests compare differences.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from session_steps import launch

from backendai_web import metrics as shared
from scheduler_app.tasks import schedule_group
from sessions_app.models import Agent, AgentStatus, ResourcePolicy, Session, Status

pytestmark = pytest.mark.django_db

TOKEN = "m" * 32


def scrape(client, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    shared.flush()
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(figures, name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


def test_it_refuses_an_anonymous_visitor_and_a_plain_user(client, alice):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    client.force_login(alice)
    assert client.get("/metrics").status_code == 403


def test_it_answers_an_admin_by_login_or_by_api_token(client, admin, alice, make_token):
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION=f"Token {make_token(admin)}").status_code == 200
    )
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION=f"Token {make_token(alice)}").status_code == 403
    )
    client.force_login(admin)
    assert client.get("/metrics").status_code == 200


def test_the_metrics_token_opens_it_only_when_set_and_exact(client, settings):
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 403
    settings.BAI_METRICS_TOKEN = TOKEN
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 403


def test_a_setting_opens_it_to_anyone(client, settings):
    settings.BAI_METRICS_PUBLIC = True
    assert client.get("/metrics").status_code == 200


def test_pending_sessions_by_reason_and_placements_agree_with_the_database(
    client, admin, alice, bob, group, image, make_agent
):
    client.force_login(admin)
    before = scrape(client)
    # No agent yet: both wait for one.
    launch(alice)
    launch(bob)
    assert value(scrape(client), "bai_sessions_pending", group="default", reason="new") == 2
    schedule_group(group.pk)  # the pass the launches queue after commit
    figures = scrape(client)
    assert value(figures, "bai_sessions_pending", group="default", reason="no_agent") == 2
    # An agent that holds one of them; alice's quota then holds her second one back.
    make_agent(cpu="1", mem=2 * 2**30)
    ResourcePolicy.objects.filter(is_default=True).update(max_concurrent_sessions=1)
    launch(alice)
    schedule_group(group.pk)  # places the oldest (alice's first) and holds the rest back
    figures = scrape(client)
    pending = Session.objects.filter(status=Status.PENDING)
    assert pending.count() == 2
    assert value(figures, "bai_sessions_pending", group="default", reason="quota") == 1
    assert value(figures, "bai_sessions_pending", group="default", reason="resources") == 1
    total = sum(v for (n, _), v in figures.items() if n == "bai_sessions_pending")
    assert total == pending.count()
    scheduled = Session.objects.filter(status=Status.SCHEDULED).count()
    assert value(figures, "bai_sessions", group="default", status="SCHEDULED") == scheduled == 1
    placed = value(figures, "bai_scheduler_placed_sessions_total", group="default") - value(
        before, "bai_scheduler_placed_sessions_total", group="default"
    )
    assert placed == scheduled
    passes = value(figures, "bai_scheduler_pass_seconds_count", group="default") - value(
        before, "bai_scheduler_pass_seconds_count", group="default"
    )
    assert passes == 2
    assert value(figures, "bai_scheduler_pass_seconds_bucket", group="default", le="+Inf") == (
        value(figures, "bai_scheduler_pass_seconds_count", group="default")
    )


def test_agents_alive_and_lost_agree_with_the_database(client, admin, make_agent):
    client.force_login(admin)
    make_agent("a1")
    make_agent("a2")
    Agent.objects.filter(pk=make_agent("a3").pk).update(status=AgentStatus.LOST)
    figures = scrape(client)
    for status in AgentStatus.values:
        assert value(figures, "bai_agents", group="default", status=status) == (
            Agent.objects.filter(status=status).count()
        )
    assert value(figures, "bai_agents", group="default", status="ALIVE") == 2


def test_held_gauges_add_up_over_processes_and_counters_are_listed(client, admin):
    client.force_login(admin)
    before = scrape(client)
    shared.hold("bai_websockets_open", 2, kind="terminal")
    shared.inc("bai_app_proxy_requests", kind="http", outcome="2xx")
    figures = scrape(client)
    assert value(figures, "bai_websockets_open", kind="terminal") == (
        value(before, "bai_websockets_open", kind="terminal") + 2
    )
    assert value(figures, "bai_app_proxy_requests_total", kind="http", outcome="2xx") == (
        value(before, "bai_app_proxy_requests_total", kind="http", outcome="2xx") + 1
    )
    assert ("bai_celery_queue_length", (("queue", "celery"),)) in figures
    shared.hold("bai_websockets_open", -2, kind="terminal")
