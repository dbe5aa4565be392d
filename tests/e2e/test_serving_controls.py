"""The endpoint page's own controls and figures in Chromium, without an engine: the rows are
made as the reconciler leaves them (a HEALTHY route whose session runs, a starting one whose
last health check found nothing listening, one that failed to start) and the router's metrics
are the real ones in Redis.

- every status serving uses has its badge colour;
- a route with no latency figure shows "—", never "— ms"; one with requests shows its p95;
- the starting route's row says why it is not healthy yet ("nothing listens on port N");
- autoscaling rules are added to and removed from the existing endpoint;
- the "Scaling to N replica(s)" note goes once N replicas serve;
- the list shows the endpoints the policy allows and that replicas count as sessions.

Personas: ``alice`` owns the endpoint. Screenshots at 1366 and 390 px go to
test-artifacts/e2e/<test>/.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SILENT = "nothing listens on port 8000 of the kernel"


def _orm(call, *args, **kwargs):
    """Run ORM calls off this thread, where Playwright's sync API keeps an event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()


def _deploy(alice, image):
    """An endpoint of 2 replicas: route 1 serves, route 2 is starting and silent, and a third
    failed to start; requests of route 1 in the router's metrics, one in flight on route 2."""
    from django.utils import timezone

    from serving_app import metrics, services
    from serving_app.models import Route, RouteStatus
    from sessions_app.models import Session, Status

    endpoint = services.endpoint_create(
        owner=alice,
        data={
            "name": "iris",
            "image": image.reference,
            "start_command": "python3 -m http.server 8000",
            "replicas": 2,
            "min_replicas": 1,
            "max_replicas": 3,
        },
    )
    serving, starting = endpoint.routes.order_by("id")[:2]
    Session.objects.filter(pk=serving.session_id).update(
        status=Status.RUNNING, started_at=timezone.now()
    )
    Route.objects.filter(pk=serving.pk).update(status=RouteStatus.HEALTHY)
    Route.objects.filter(pk=starting.pk).update(health_reason=SILENT, consecutive_failures=3)
    Route.objects.create(
        endpoint=endpoint,
        status=RouteStatus.FAILED_TO_START,
        health_reason="its session ended (exited with code 1)",
    )
    when = time.time() - 2
    for latency in (0.010, 0.020, 0.030, 0.040):
        metrics.record(str(endpoint.pk), serving.pk, latency, True, now=when)
    metrics.inflight(str(endpoint.pk), starting.pk, 1)
    return str(endpoint.pk), serving.pk, starting.pk


def _all_serving(endpoint_id):
    """Every replica the endpoint wants is up: its live routes HEALTHY."""
    from serving_app.models import LIVE_ROUTES, Route, RouteStatus

    Route.objects.filter(endpoint_id=endpoint_id, status__in=LIVE_ROUTES).update(
        status=RouteStatus.HEALTHY, health_reason=""
    )
    return Route.objects.filter(endpoint_id=endpoint_id, status=RouteStatus.HEALTHY).count()


def test_the_endpoint_page_shows_badges_figures_reasons_rules_and_scaling(
    users, images, live_server_url, login, shot
):
    from serving_app import metrics
    from serving_app.models import AutoScalingRule, EndpointStatus, RouteStatus
    from sessions_app.models import ResourcePolicy

    image = images["bai-kernel/minimal:1"]
    endpoint_id, serving, starting = _orm(_deploy, users["alice"], image)
    _orm(lambda: ResourcePolicy.objects.filter(is_default=True).update(max_endpoints=3))
    try:
        page = login("alice", screenshot=False, viewport={"width": 1366, "height": 900})
        # The list: the endpoints the policy allows, and that replicas are sessions of hers.
        page.goto(f"{live_server_url}/serving/")
        page.wait_for_function("() => window.servingReady === true")
        assert page.inner_text("#quota-endpoints") == "1 of 3"
        assert "counts against your limits: at most 10 running, at most 20 pending" in (
            page.inner_text("#quota-replicas")
        )
        assert page.get_attribute('#endpoints-body tr[data-name="iris"] .badge', "data-status")
        shot(page, "list-quota")
        page.goto(f"{live_server_url}/serving/{endpoint_id}/")
        page.wait_for_selector(f'#routes-body tr[data-id="{starting}"]')

        # Badges: every endpoint and route status has a colour of its own.
        statuses = sorted({*EndpointStatus.values, *RouteStatus.values})
        colours = page.evaluate(
            """(statuses) => statuses.map((s) => {
                const b = document.createElement("span");
                b.className = `badge s-${s}`;
                document.body.append(b);
                const style = getComputedStyle(b);
                const found = [s, style.backgroundColor, style.color];
                b.remove();
                return found;
            })""",
            statuses,
        )
        plain = page.evaluate("() => getComputedStyle(document.body).color")
        for status, background, colour in colours:
            assert background != "rgba(0, 0, 0, 0)", status
            assert colour != plain, status

        # Figures: p95 of the serving route; "—" alone where there is none.
        row = f'#routes-body tr[data-id="{serving}"] [data-role="p95"]'
        page.wait_for_function(
            "(sel) => /^[0-9.]+ ms$/.test(document.querySelector(sel).textContent)", arg=row
        )
        assert page.inner_text(f'#routes-body tr[data-id="{starting}"] [data-role="p95"]') == "—"
        assert "— ms" not in page.inner_text("#routes-body")

        # The silent replica says why it is not healthy, on its row.
        reason = page.inner_text(
            f'#routes-body tr[data-id="{starting}"] [data-role="health-reason"]'
        )
        assert reason == SILENT
        shot(page, "routes-badges-reasons", full_page=True)

        # Rules: added to the existing endpoint, then removed.
        page.select_option('#rule-form [name="rule_metric"]', "p95_latency_ms")
        page.select_option('#rule-form [name="rule_comparator"]', "ge")
        page.fill('#rule-form [name="rule_threshold"]', "250")
        page.fill('#rule-form [name="rule_step"]', "1")
        page.fill('#rule-form [name="rule_cooldown"]', "30")
        page.click("#rule-add")
        page.wait_for_selector("#rules li[data-id]")
        (rule,) = _orm(lambda: list(AutoScalingRule.objects.filter(endpoint_id=endpoint_id)))
        assert (rule.metric, rule.comparator, rule.threshold, rule.step, rule.cooldown) == (
            "p95_latency_ms",
            "ge",
            250.0,
            1,
            30,
        )
        assert "p95_latency_ms ≥ 250 → +1 replica(s), cooldown 30 s" in page.inner_text("#rules")
        shot(page, "rule-added", full_page=True)
        page.click(f'#rules li[data-id="{rule.pk}"] [data-action="delete-rule"]')
        page.wait_for_selector("#rules li.muted")
        assert not _orm(lambda: AutoScalingRule.objects.filter(endpoint_id=endpoint_id).exists())

        # Scaling: the note stays while replicas start, and goes once 3 serve.
        page.click("#scale-up")
        page.wait_for_selector("#status:not([hidden])")
        assert "Scaling to 3 replica(s)" in page.inner_text("#status")
        page.wait_for_timeout(2500)  # a refresh with 1 of 3 serving: the note stays
        assert page.is_visible("#status")
        assert _orm(_all_serving, endpoint_id) == 3
        page.wait_for_selector("#status", state="hidden", timeout=10_000)

        narrow = login("alice", screenshot=False, viewport={"width": 390, "height": 844})
        narrow.goto(f"{live_server_url}/serving/{endpoint_id}/")
        narrow.wait_for_selector(f'#routes-body tr[data-id="{serving}"]')
        # The top bar's narrow layout is the navigation's (issue #24 item 6), not this page's.
        shot(narrow, "endpoint-390px", full_page=True, axe_exclude=["header.topbar"])
        assert page.js_errors == [] and narrow.js_errors == []
    finally:
        metrics.inflight(endpoint_id, starting, -1)


def test_the_endpoints_list_keeps_the_url_readable_on_a_phone(
    users, images, live_server_url, login, shot
):
    """At 390 px the URL column is not squeezed to a few letters a line (a row of a dozen
    lines): the URL takes at most three lines and the table scrolls in its own box."""
    _orm(_deploy, users["alice"], images["bai-kernel/minimal:1"])
    page = login("alice", screenshot=False, viewport={"width": 390, "height": 844})
    page.goto(f"{live_server_url}/serving/")
    page.wait_for_function("() => window.servingReady === true")
    url = page.locator("#endpoints-body .ep-url").first
    lines = url.evaluate(
        "e => Math.round(e.getBoundingClientRect().height"
        " / parseFloat(getComputedStyle(e).lineHeight))"
    )
    shot(page, "endpoints-list-390", full_page=True)
    assert lines <= 3, lines
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
