"""Pure decisions of the reconciler (no Django): which autoscaling rule fires,
which routes go when there are too many, and when an idle endpoint scales to
zero. Frozen dataclasses in, decisions out, ``now`` passed in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

COMPARATORS = {
    "gt": (lambda v, t: v > t, ">"),
    "ge": (lambda v, t: v >= t, "≥"),
    "lt": (lambda v, t: v < t, "<"),
    "le": (lambda v, t: v <= t, "≤"),
}


@dataclass(frozen=True)
class Rule:
    id: int
    metric: str
    comparator: str
    threshold: float
    step: int
    cooldown: int
    min_replicas: int
    max_replicas: int
    last_triggered_at: datetime | None


@dataclass(frozen=True)
class ScaleDecision:
    rule_id: int
    metric: str
    value: float
    old: int
    new: int
    reason: str


@dataclass(frozen=True)
class Skipped:
    rule_id: int
    metric: str
    reason: str


def metric_values(
    snapshot: dict | None, serving_replicas: int, cpu_util: float | None = None
) -> dict[str, float | None]:
    """The rules' metrics from a metrics snapshot (None: no data).

    ``rps_per_replica`` divides the endpoint's requests/s by the replicas serving;
    ``inflight`` is the endpoint's requests in flight, all replicas together.
    """
    if not snapshot:
        return {"rps_per_replica": None, "p95_latency_ms": None, "inflight": None, "cpu_util": None}
    rps = snapshot.get("rps")
    return {
        "rps_per_replica": float(rps) / max(1, serving_replicas) if rps is not None else None,
        "p95_latency_ms": _number(snapshot.get("p95_ms")),
        "inflight": _number(snapshot.get("inflight")),
        "cpu_util": cpu_util,
    }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def evaluate_rules(
    rules: list[Rule],
    values: dict[str, float | None],
    *,
    current: int,
    endpoint_min: int,
    endpoint_max: int,
    now: datetime,
) -> tuple[ScaleDecision | None, list[Skipped]]:
    """The first rule (by id) whose condition holds, is out of its cooldown and
    would change the replica count, as a decision; and the rules skipped for lack
    of data. The new count stays within the rule's and the endpoint's bounds."""
    skipped: list[Skipped] = []
    for rule in sorted(rules, key=lambda r: r.id):
        value = values.get(rule.metric)
        if value is None:
            skipped.append(Skipped(rule.id, rule.metric, f"no data for {rule.metric}"))
            continue
        holds, sign = COMPARATORS[rule.comparator]
        if not holds(value, rule.threshold):
            continue
        if rule.last_triggered_at is not None and now - rule.last_triggered_at < timedelta(
            seconds=rule.cooldown
        ):
            continue
        low = max(rule.min_replicas, endpoint_min)
        high = min(rule.max_replicas, endpoint_max)
        new = min(max(current + rule.step, low), high) if low <= high else current
        # A rule that scales down never takes the last replica: scale to zero is the idle rule's.
        if rule.step < 0:
            new = max(new, min(current, 1))
        if new == current:
            continue
        reason = (
            f"{rule.metric} {value:.4g} {sign} {rule.threshold:g} "
            f"(rule {rule.id}, step {rule.step:+d}): scaled {current} → {new}"
        )
        return ScaleDecision(rule.id, rule.metric, value, current, new, reason), skipped
    return None, skipped


def idle_for_zero(
    *,
    min_replicas: int,
    replicas: int,
    busy: bool,
    last_activity: datetime,
    idle_timeout: int,
    now: datetime,
) -> bool:
    """Whether an endpoint releases its replicas: min 0, some replicas, no request
    in flight or in the window, and nothing for ``idle_timeout`` seconds."""
    return (
        min_replicas == 0
        and replicas > 0
        and not busy
        and now - last_activity >= timedelta(seconds=idle_timeout)
    )


@dataclass(frozen=True)
class RouteState:
    id: int
    status: str  # PROVISIONING | HEALTHY | UNHEALTHY
    created_at: datetime


def plan_routes(routes: list[RouteState], desired: int) -> tuple[int, list[int]]:
    """(how many routes to create, which route ids to remove).

    Replicas that serve or may soon serve (HEALTHY, PROVISIONING) are counted
    against ``desired``; an UNHEALTHY one is replaced, not counted. Surplus goes
    unhealthy first, then the newest starting ones, then the newest healthy.
    """
    unhealthy = sorted((r for r in routes if r.status == "UNHEALTHY"), key=lambda r: r.created_at)
    starting = sorted(
        (r for r in routes if r.status == "PROVISIONING"), key=lambda r: r.created_at, reverse=True
    )
    healthy = sorted(
        (r for r in routes if r.status == "HEALTHY"), key=lambda r: r.created_at, reverse=True
    )
    counted = len(starting) + len(healthy)
    create = max(0, desired - counted)
    surplus = len(routes) + create - desired
    remove: list[int] = []
    for route in unhealthy + starting + healthy:
        if surplus <= 0:
            break
        remove.append(route.id)
        surplus -= 1
    return create, remove
