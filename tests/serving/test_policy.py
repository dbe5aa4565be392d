"""The reconciler's pure decisions (serving_app.policy), table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from serving_app.policy import (
    RouteState,
    Rule,
    evaluate_rules,
    idle_for_zero,
    metric_values,
    plan_routes,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _rule(**kw):
    base = dict(
        id=1, metric="rps_per_replica", comparator="gt", threshold=10.0, step=1, cooldown=60,
        min_replicas=0, max_replicas=16, last_triggered_at=None,
    )  # fmt: skip
    return Rule(**{**base, **kw})


@pytest.mark.parametrize(
    "rule, value, current, expected",
    [
        (_rule(), 11, 1, 2),
        (_rule(), 10, 1, None),
        (_rule(comparator="ge"), 10, 1, 2),
        (_rule(comparator="lt", step=-1), 9, 3, 2),
        (_rule(comparator="le", step=-1), 10, 3, 2),
        (_rule(step=5, max_replicas=4), 11, 1, 4),
        (_rule(step=1, max_replicas=2), 11, 2, None),
        (_rule(comparator="lt", step=-3, min_replicas=2), 0, 4, 2),
        (_rule(comparator="lt", step=-3), 0, 2, 1),  # never the last replica
        (_rule(last_triggered_at=NOW - timedelta(seconds=59)), 11, 1, None),
        (_rule(last_triggered_at=NOW - timedelta(seconds=60)), 11, 1, 2),
    ],
)
def test_a_rule_fires_within_bounds_and_cooldowns(rule, value, current, expected):
    decision, _ = evaluate_rules(
        [rule], {rule.metric: value}, current=current, endpoint_min=0, endpoint_max=16, now=NOW
    )
    assert (decision.new if decision else None) == expected


def test_the_endpoint_bounds_apply_too():
    decision, _ = evaluate_rules(
        [_rule(step=9)], {"rps_per_replica": 50}, current=1, endpoint_min=1, endpoint_max=3, now=NOW
    )
    assert decision.new == 3 and decision.value == 50


def test_a_metric_without_data_is_skipped_with_a_reason():
    decision, skipped = evaluate_rules(
        [_rule(metric="cpu_util")], metric_values(None, 1), current=1, endpoint_min=0,
        endpoint_max=16, now=NOW,
    )  # fmt: skip
    assert decision is None and skipped[0].reason == "no data for cpu_util"


def test_requests_per_replica_divide_by_the_replicas_serving():
    values = metric_values({"rps": 30.0, "p95_ms": 12.5, "inflight": 4}, 3)
    assert values == {
        "rps_per_replica": 10.0,
        "p95_latency_ms": 12.5,
        "inflight": 4.0,
        "cpu_util": None,
    }


@pytest.mark.parametrize(
    "statuses, desired, create, removed",
    [
        ([], 2, 2, []),
        (["HEALTHY", "HEALTHY"], 2, 0, []),
        (["HEALTHY", "UNHEALTHY"], 2, 1, [2]),
        (["HEALTHY", "HEALTHY", "UNHEALTHY"], 2, 0, [3]),
        (["HEALTHY", "HEALTHY", "PROVISIONING"], 1, 0, [3, 2]),
        (["UNHEALTHY", "UNHEALTHY"], 0, 0, [1, 2]),
    ],
)
def test_routes_are_planned_unhealthy_first(statuses, desired, create, removed):
    routes = [RouteState(i + 1, s, NOW + timedelta(seconds=i)) for i, s in enumerate(statuses)]
    assert plan_routes(routes, desired) == (create, removed)


def test_scale_to_zero_needs_min_zero_and_quiet():
    args = dict(
        min_replicas=0,
        replicas=1,
        busy=False,
        last_activity=NOW - timedelta(seconds=300),
        idle_timeout=300,
        now=NOW,
    )
    assert idle_for_zero(**args)
    assert not idle_for_zero(**{**args, "min_replicas": 1})
    assert not idle_for_zero(**{**args, "busy": True})
    assert not idle_for_zero(**{**args, "last_activity": NOW - timedelta(seconds=299)})
