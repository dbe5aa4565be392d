"""The reconciler on the database: replicas created through session_create (type
inference, model folder read-only), health moving routes HEALTHY ⇄ UNHEALTHY and an
unhealthy replica replaced, bounded start retries then DEGRADED, autoscaling rules
with cooldowns and bounds, scale to zero, and every change in the history.

Health checks are stood in for here (``health.check_all`` patched; tests/docker/test_serving.py
runs the real ones); metrics are the real ones in Redis, written as the router writes them
(the ``traffic`` fixture)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from serving_app import health, reconcile
from serving_app.models import Endpoint, EndpointEvent, Route, RouteStatus
from sessions_app.models import Kernel, Session, Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def probes(monkeypatch):
    """Every health check answers what ``probes.ok`` says for its route (default: ok)."""

    class Probes:
        ok: dict[int, bool | None] = {}
        default = True
        seen: list[int] = []

    def check_all(batch):
        Probes.seen.extend(p.route_id for p in batch)
        return {
            p.route_id: health.Result(
                Probes.ok.get(p.route_id, Probes.default),
                "" if Probes.ok.get(p.route_id, Probes.default) else "GET /health answered 503",
                200,
            )
            for p in batch
        }

    monkeypatch.setattr(health, "check_all", check_all)
    return Probes


def _run(endpoint, now=None):
    assert reconcile.reconcile_endpoint(endpoint.pk, now=now)
    endpoint.refresh_from_db()
    return list(endpoint.routes.order_by("id"))


def _start(route, agent, status=Status.RUNNING):
    Kernel.objects.filter(session=route.session_id).update(
        agent=agent, status=status, started_at=timezone.now()
    )
    Session.objects.filter(pk=route.session_id).update(status=status, started_at=timezone.now())


def _messages(endpoint, kind=None):
    qs = EndpointEvent.objects.filter(endpoint=endpoint).order_by("id")
    if kind:
        qs = qs.filter(kind=kind)
    return [e.message for e in qs]


def test_it_creates_inference_replicas_with_the_model_folder_read_only(make_endpoint, folder):
    endpoint = make_endpoint()
    routes = _run(endpoint)
    assert [r.status for r in routes] == ["PROVISIONING", "PROVISIONING"]
    session = routes[0].session
    assert session.session_type == "inference"
    assert list(session.mounts.all()) == [folder]
    assert list(session.readonly_mounts.all()) == [folder]
    assert session.environ["BAI_MODEL_DIR"] == "/home/work/iris-model"
    assert session.startup_command == "python3 -m http.server 8000"
    assert session.preopen_ports == [8000]
    assert endpoint.status == "PROVISIONING"
    assert endpoint.status_reason == "0 of 2 replicas healthy; 2 starting"
    # A second pass changes nothing: the replicas are there.
    assert len(_run(endpoint)) == 2


def test_routes_turn_healthy_and_the_endpoint_ready(make_endpoint, agent, probes):
    endpoint = make_endpoint()
    for route in _run(endpoint):
        _start(route, agent)
    routes = _run(endpoint)
    assert [r.status for r in routes] == ["HEALTHY", "HEALTHY"]
    assert endpoint.status == "READY" and endpoint.status_reason == ""
    assert _messages(endpoint, "health") == [
        f"replica {routes[0].pk} healthy (GET /health: 200)",
        f"replica {routes[1].pk} healthy (GET /health: 200)",
    ]


def test_an_unhealthy_replica_is_marked_and_replaced(make_endpoint, agent, probes, settings):
    settings.BAI_SERVE_UNHEALTHY_AFTER = 2
    endpoint = make_endpoint(health_interval=1)
    first = _run(endpoint)
    for route in first:
        _start(route, agent)
    _run(endpoint)
    probes.ok = {first[0].pk: False}
    later = timezone.now() + timedelta(seconds=2)
    routes = _run(endpoint, now=later)
    assert routes[0].status == "HEALTHY" and routes[0].consecutive_failures == 1
    routes = _run(endpoint, now=later + timedelta(seconds=2))
    statuses = {r.pk: r.status for r in routes}
    assert statuses[first[0].pk] == "TERMINATING"
    assert statuses[first[1].pk] == "HEALTHY"
    (new,) = [r for r in routes if r.pk not in (first[0].pk, first[1].pk)]
    assert new.status == "PROVISIONING"
    assert Session.objects.get(pk=first[0].session_id).status in ("TERMINATING", "TERMINATED")
    health_events = _messages(endpoint, "health")
    assert (
        f"replica {first[0].pk} unhealthy: GET /health answered 503 (2 failed checks in a row)"
        in health_events
    )
    assert f"replica {first[0].pk} removed: unhealthy (GET /health answered 503)" in health_events


def test_a_replica_whose_session_ended_turns_unhealthy_and_is_replaced(
    make_endpoint, agent, probes
):
    endpoint = make_endpoint(replicas=1)
    (route,) = _run(endpoint)
    _start(route, agent)
    _run(endpoint)
    Kernel.objects.filter(session=route.session_id).update(status=Status.ERROR)
    Session.objects.filter(pk=route.session_id).update(
        status=Status.ERROR, status_reason="container exited (137)"
    )
    routes = _run(endpoint)
    assert [r.status for r in routes] == ["TERMINATING", "PROVISIONING"]
    assert any(
        "unhealthy: its session ended (container exited (137))" in m for m in _messages(endpoint)
    )


def test_surplus_replicas_go_unhealthy_first(make_endpoint, agent, probes):
    endpoint = make_endpoint(replicas=3)
    routes = _run(endpoint)
    for route in routes:
        _start(route, agent)
    _run(endpoint)
    Route.objects.filter(pk=routes[1].pk).update(status=RouteStatus.UNHEALTHY)
    Endpoint.objects.filter(pk=endpoint.pk).update(replicas=1)
    after = {r.pk: r.status for r in _run(endpoint)}
    assert after[routes[1].pk] == "TERMINATING"
    assert after[routes[2].pk] == "TERMINATING"  # the newest healthy next
    assert after[routes[0].pk] == "HEALTHY"


def test_failed_starts_are_retried_a_bounded_number_of_times_then_degraded(make_endpoint, settings):
    settings.BAI_SERVE_MAX_START_RETRIES = 2
    endpoint = make_endpoint(replicas=1)
    for _ in range(5):
        for route in endpoint.routes.filter(status="PROVISIONING"):
            Kernel.objects.filter(session=route.session_id).update(status=Status.ERROR)
            Session.objects.filter(pk=route.session_id).update(
                status=Status.ERROR, status_reason="image bai-kernel/minimal:1 is missing"
            )
        _run(endpoint)
    failed = endpoint.routes.filter(status="FAILED_TO_START").count()
    assert failed == 3  # the first start and two retries
    assert endpoint.status == "DEGRADED"
    assert "failed to start 3 times in a row" in endpoint.status_reason
    assert "image bai-kernel/minimal:1 is missing" in endpoint.status_reason
    assert len(_messages(endpoint, "failure")) == 4  # three failures and the degradation
    # The owner acts: starts are tried again.
    from serving_app import services

    services.endpoint_scale(endpoint=endpoint, user=endpoint.owner, replicas=2)
    _run(endpoint)
    assert endpoint.routes.filter(status="PROVISIONING").count() == 2


def test_a_launch_the_quota_refuses_is_a_failed_start_with_the_reason(make_endpoint, settings):
    """A replica past what the policy ever allows fails (the pending limit only makes it
    wait: tests/serving/test_quota.py)."""
    from sessions_app.models import ResourcePolicy

    endpoint = make_endpoint(replicas=1, resources={"cpu": "2"})
    ResourcePolicy.objects.filter(is_default=True).update(total_resource_slots={"cpu": "1"})
    (route,) = _run(endpoint)
    assert route.status == "FAILED_TO_START"
    assert "could not start replica" in _messages(endpoint, "failure")[0]


def _rule(endpoint, **fields):
    from serving_app import services

    return services.rule_create(
        endpoint=endpoint,
        data={
            "metric": "rps_per_replica",
            "comparator": "gt",
            "threshold": 10,
            "step": 1,
            **fields,
        },
    )


def _serving(endpoint, agent):
    for route in _run(endpoint):
        if route.session_id and route.status == "PROVISIONING":
            _start(route, agent)
    return _run(endpoint)


def test_a_rule_scales_up_records_the_metric_value_and_waits_its_cooldown(
    make_endpoint, agent, probes, traffic
):
    endpoint = make_endpoint(replicas=1)
    rule = _rule(endpoint, cooldown=60)
    _serving(endpoint, agent)
    traffic(endpoint, rps=41.2, inflight=2)
    _run(endpoint)
    assert endpoint.replicas == 2
    event = EndpointEvent.objects.filter(endpoint=endpoint, kind="scale").last()
    assert event.data == {
        "metric": "rps_per_replica",
        "value": 41.2,
        "rule": rule.pk,
        "from": 1,
        "to": 2,
    }
    assert event.message.startswith("rps_per_replica 41.2 > 10")
    assert "scaled 1 → 2" in event.message
    _run(endpoint)
    assert endpoint.replicas == 2  # within the cooldown
    _run(endpoint, now=timezone.now() + timedelta(seconds=61))
    assert endpoint.replicas == 3


def test_rules_stay_within_their_and_the_endpoints_bounds(make_endpoint, agent, probes, traffic):
    endpoint = make_endpoint(replicas=1, max_replicas=2)
    _rule(endpoint, step=5, cooldown=1)
    _serving(endpoint, agent)
    traffic(endpoint, rps=100, inflight=0)
    _run(endpoint)
    assert endpoint.replicas == 2


def test_a_scale_down_rule_never_takes_the_last_replica(make_endpoint, agent, probes, traffic):
    endpoint = make_endpoint(replicas=2, min_replicas=0)
    _rule(endpoint, comparator="lt", threshold=1, step=-4, cooldown=1)
    _serving(endpoint, agent)
    traffic(endpoint, rps=0.2, inflight=1)
    _run(endpoint)
    assert endpoint.replicas == 1


def test_cpu_rules_say_there_is_no_data_once(make_endpoint, agent, probes, traffic):
    endpoint = make_endpoint(replicas=1)
    rule = _rule(endpoint, metric="cpu_util", threshold=0.8)
    _serving(endpoint, agent)
    _run(endpoint)
    notes = [m for m in _messages(endpoint, "scale") if "skipped" in m]
    assert notes == [
        f"rule {rule.pk} skipped: no data for cpu_util (agents do not report replicas' CPU use)"
    ]
    assert endpoint.replicas == 1


def test_an_idle_endpoint_with_min_zero_scales_to_zero_and_wakes(
    make_endpoint, agent, probes, traffic, settings
):
    from serving_app import services

    settings.BAI_SERVE_IDLE_TIMEOUT = 60
    endpoint = make_endpoint(replicas=1, min_replicas=0)
    _serving(endpoint, agent)
    _run(endpoint, now=timezone.now() + timedelta(seconds=30))
    assert endpoint.replicas == 1
    routes = _run(endpoint, now=timezone.now() + timedelta(seconds=61))
    assert endpoint.replicas == 0
    assert [r.status for r in routes] == ["TERMINATING"]
    event = EndpointEvent.objects.get(endpoint=endpoint, data__metric="idle_seconds")
    assert (
        event.data["from"] == 1 and event.data["to"] == 0 and event.data["metric"] == "idle_seconds"
    )
    assert "scaled 1 → 0: idle for" in event.message
    Kernel.objects.filter(session=routes[0].session_id).update(status=Status.TERMINATED)
    Session.objects.filter(pk=routes[0].session_id).update(status=Status.TERMINATED)
    assert _run(endpoint) == []
    assert endpoint.status == "SCALED_TO_ZERO"
    services.wake(str(endpoint.pk), "a request arrived while scaled to zero")
    (route,) = _run(endpoint)
    assert route.status == "PROVISIONING"
    assert "scaled 0 → 1: a request arrived while scaled to zero" in _messages(endpoint, "scale")


def test_traffic_keeps_an_endpoint_awake(make_endpoint, agent, probes, traffic, settings):
    settings.BAI_SERVE_IDLE_TIMEOUT = 60
    endpoint = make_endpoint(replicas=1, min_replicas=0)
    _serving(endpoint, agent)
    traffic(endpoint, rps=0.5, inflight=0)
    _run(endpoint, now=timezone.now() + timedelta(seconds=120))
    assert endpoint.replicas == 1 and endpoint.last_request_at is not None


def test_a_pass_already_running_is_not_run_twice(make_endpoint):
    from django.core.cache import cache

    endpoint = make_endpoint()
    cache.add(f"bai:serve:reconcile:{endpoint.pk}", 1, 60)
    try:
        assert reconcile.reconcile_endpoint(endpoint.pk) is False
    finally:
        cache.delete(f"bai:serve:reconcile:{endpoint.pk}")
    assert not endpoint.routes.exists()


def test_beat_runs_every_endpoint(make_endpoint, settings):
    from serving_app.tasks import reconcile_endpoints

    assert "reconcile-endpoints" in settings.CELERY_BEAT_SCHEDULE
    endpoint = make_endpoint()
    reconcile_endpoints.delay()
    assert endpoint.routes.count() == 2
