"""The reconciler: brings each endpoint's routes to what the endpoint wants.

One pass of one endpoint (``reconcile_endpoint``), safe to run twice and from
several workers at once (a lease per endpoint, and the endpoint's row lock
around every change of its routes):

1. routes follow their sessions: a replica whose session ended before it served
   FAILED_TO_START (the endpoint counts the failure); one that served turns UNHEALTHY;
2. health checks (no transaction open): every route whose session runs and whose
   check is due is probed through the apps proxy; HEALTHY ⇄ UNHEALTHY after
   ``BAI_SERVE_UNHEALTHY_AFTER`` failures in a row; a replica that never passes within
   ``BAI_SERVE_START_TIMEOUT`` failed to start;
3. autoscaling: the rules against ``serving_app.metrics.snapshot``, scale to zero when
   idle (min 0);
4. convergence: replicas created up to the desired count (through
   ``sessions_app.services.session_create``) and surplus removed, unhealthy first;
   after ``BAI_SERVE_MAX_START_RETRIES`` failed starts in a row the endpoint is
   DEGRADED with the reason and stops trying until its owner changes it.

Every scale, failure and health change is an EndpointEvent with its reason.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from sessions_app import services as session_services
from sessions_app.errors import ApplicationError, Conflict, InvalidInput, PendingLimitReached
from sessions_app.models import TERMINAL, Session, Status

from . import health, policy
from .models import (
    LIVE_ROUTES,
    AutoScalingRule,
    Endpoint,
    EndpointStatus,
    EventKind,
    Route,
    RouteStatus,
    record,
)
from .services import no_command, replica_spec, start_command_of

logger = logging.getLogger(__name__)

LEASE_SECONDS = 60
KEEP_FAILED_ROUTES = 5
R = RouteStatus


def reconcile_endpoint(endpoint_id: Any, *, now: datetime | None = None) -> bool:
    """One pass of one endpoint; False when another pass holds it (or it is gone)."""
    lease = f"bai:serve:reconcile:{endpoint_id}"
    if not cache.add(lease, 1, LEASE_SECONDS):
        return False
    try:
        endpoint = Endpoint.objects.filter(pk=endpoint_id).first()
        if endpoint is None or endpoint.status == EndpointStatus.DESTROYING:
            return False
        _follow_sessions(endpoint, now or timezone.now())
        probe_trouble = _check_health(endpoint, now or timezone.now())
        _autoscale(endpoint, now or timezone.now())
        _converge(endpoint, now or timezone.now(), probe_trouble)
        return True
    finally:
        cache.delete(lease)


def endpoint_ids() -> list[str]:
    return [
        str(pk)
        for pk in Endpoint.objects.exclude(status=EndpointStatus.DESTROYING).values_list(
            "pk", flat=True
        )
    ]


# --- 1. routes follow their sessions ------------------------------------------------------------


def _fail_start(endpoint: Endpoint, route: Route, why: str) -> None:
    if route.transition(R.FAILED_TO_START, health_reason=why[:300]):
        Endpoint.objects.filter(pk=endpoint.pk).update(start_failures=F("start_failures") + 1)
        record(
            endpoint,
            EventKind.FAILURE,
            f"replica {route.pk} failed to start: {why}",
            route=route.pk,
        )
        _end_session(route.session, f"replica of endpoint {endpoint.name} failed to start")


def _end_session(session: Session | None, reason: str) -> None:
    if session is None:
        return
    session.refresh_from_db(fields=["status"])
    if session.status in TERMINAL:
        return
    try:
        session_services.session_terminate(session=session, reason=reason)
    except Conflict:
        pass  # it ended meanwhile


def _follow_sessions(endpoint: Endpoint, now: datetime) -> None:
    routes = list(endpoint.routes.select_related("session"))
    for route in routes:
        session = route.session
        ended = (
            session is None or session.status in TERMINAL or session.status == Status.TERMINATING
        )
        why = (session.status_reason if session else "") or "its session is gone"
        if route.status == R.PROVISIONING and ended:
            _fail_start(endpoint, route, f"its session ended ({why})")
        elif route.status == R.HEALTHY and ended:
            if route.transition(R.UNHEALTHY, health_reason=f"its session ended: {why}"[:300]):
                record(
                    endpoint,
                    EventKind.HEALTH,
                    f"replica {route.pk} unhealthy: its session ended ({why})",
                    route=route.pk,
                )
        elif route.status == R.TERMINATING:
            if session is None or session.status in TERMINAL:
                route.delete()
            else:
                _end_session(session, f"replica of endpoint {endpoint.name} removed")
    failed = [r for r in routes if r.status == R.FAILED_TO_START]
    for route in sorted(failed, key=lambda r: r.pk)[:-KEEP_FAILED_ROUTES]:
        if route.session is None or route.session.status in TERMINAL:
            route.delete()


# --- 2. health ------------------------------------------------------------------------------------


def _probes(endpoint: Endpoint, now: datetime) -> list[health.Probe]:
    due = []
    interval = timedelta(seconds=endpoint.health_interval)
    routes = (
        endpoint.routes.filter(status__in=LIVE_ROUTES, session__status=Status.RUNNING)
        .select_related("session")
        .prefetch_related("session__kernels")
    )
    for route in routes:
        if route.last_checked_at is not None and now - route.last_checked_at < interval:
            continue
        main = next((k for k in route.session.kernels.all() if k.cluster_role == "main"), None)
        if main is None or main.agent_id is None:
            continue
        due.append(
            health.Probe(route.pk, main.agent_id, str(main.pk), endpoint.port, endpoint.health_path)
        )
    return due


def _check_health(endpoint: Endpoint, now: datetime) -> str:
    """Probe the due routes and apply the results; returns why checks could not run ("" if they did)."""
    results = health.check_all(_probes(endpoint, now))
    trouble = ""
    after = settings.BAI_SERVE_UNHEALTHY_AFTER
    start_timeout = timedelta(seconds=settings.BAI_SERVE_START_TIMEOUT)
    for route_id, result in results.items():
        route = Route.objects.filter(pk=route_id).select_related("session").first()
        if route is None or route.status not in LIVE_ROUTES:
            continue
        if result.ok is None:
            trouble = result.reason
            continue
        if result.ok:
            healthy_now = route.status != R.HEALTHY
            moved = (
                route.transition(
                    R.HEALTHY, consecutive_failures=0, last_checked_at=now, health_reason=""
                )
                if healthy_now
                else Route.objects.filter(pk=route.pk).update(
                    consecutive_failures=0, last_checked_at=now, health_reason=""
                )
            )
            if healthy_now and moved:
                Endpoint.objects.filter(pk=endpoint.pk).update(start_failures=0)
                record(
                    endpoint,
                    EventKind.HEALTH,
                    f"replica {route.pk} healthy (GET {endpoint.health_path}: {result.status})",
                    route=route.pk,
                    status=result.status,
                )
            continue
        failures = route.consecutive_failures + 1
        fields = {
            "consecutive_failures": failures,
            "last_checked_at": now,
            "health_reason": result.reason[:300],
        }
        if route.status == R.HEALTHY and failures >= after:
            if route.transition(R.UNHEALTHY, **fields):
                record(
                    endpoint,
                    EventKind.HEALTH,
                    f"replica {route.pk} unhealthy: {result.reason} ({failures} failed checks in a row)",
                    route=route.pk,
                    failures=failures,
                )
            continue
        Route.objects.filter(pk=route.pk, status=route.status).update(**fields)
        started = route.session.started_at if route.session else None
        if route.status == R.PROVISIONING and started and now - started > start_timeout:
            route.refresh_from_db()
            _fail_start(
                endpoint,
                route,
                f"no successful health check within {start_timeout.seconds} s of starting "
                f"({result.reason})",
            )
    return trouble


# --- 3. autoscaling -------------------------------------------------------------------------------


def snapshot(endpoint_id: str) -> dict | None:
    """The router's metrics of the endpoint (serving_app.metrics), or None without them."""
    try:
        from . import metrics  # written by the router; absent until it lands
    except ImportError:
        return None
    try:
        return metrics.snapshot(endpoint_id, window_s=settings.BAI_SERVE_METRICS_WINDOW)
    except Exception:  # noqa: BLE001 - Redis away: no data, the pass goes on
        logger.warning("metrics of endpoint %s unavailable", endpoint_id, exc_info=True)
        return None


def series(endpoint_id: str) -> list[dict]:
    """The router's 5-minute series of the endpoint (for charts), or [] without metrics."""
    try:
        from . import metrics
    except ImportError:
        return []
    try:
        return metrics.series(endpoint_id, seconds=300)
    except Exception:  # noqa: BLE001 - Redis away: no data
        logger.warning("metrics of endpoint %s unavailable", endpoint_id, exc_info=True)
        return []


def _autoscale(endpoint: Endpoint, now: datetime) -> None:
    if endpoint.replicas == 0:
        return
    snap = snapshot(str(endpoint.pk))
    busy = bool(snap) and (float(snap.get("rps") or 0) > 0 or float(snap.get("inflight") or 0) > 0)
    if busy and (
        endpoint.last_request_at is None or now - endpoint.last_request_at > timedelta(seconds=1)
    ):
        Endpoint.objects.filter(pk=endpoint.pk).update(last_request_at=now)
        endpoint.last_request_at = now
    # The idle clock starts once a replica serves: an endpoint still starting (woken by a
    # request the router holds until a replica is healthy) is never idle.
    healthy_since = (
        endpoint.routes.filter(status=R.HEALTHY)
        .order_by("-status_changed_at")
        .values_list("status_changed_at", flat=True)
        .first()
    )
    starting = healthy_since is None
    last = max(
        t
        for t in (endpoint.last_request_at, endpoint.scaled_at, endpoint.created_at, healthy_since)
        if t
    )
    if not starting and policy.idle_for_zero(
        min_replicas=endpoint.min_replicas,
        replicas=endpoint.replicas,
        busy=busy,
        last_activity=last,
        idle_timeout=settings.BAI_SERVE_IDLE_TIMEOUT,
        now=now,
    ):
        idle = int((now - last).total_seconds())
        _apply_scale(
            endpoint,
            old=endpoint.replicas,
            new=0,
            why=f"idle for {idle} s (no request) and min_replicas is 0",
            data={"metric": "idle_seconds", "value": idle},
        )
        return
    rules = [
        policy.Rule(
            r.pk,
            r.metric,
            r.comparator,
            r.threshold,
            r.step,
            r.cooldown,
            r.min_replicas,
            r.max_replicas,
            r.last_triggered_at,
        )
        for r in endpoint.rules.all()
    ]
    if not rules:
        return
    serving = endpoint.routes.filter(status=R.HEALTHY).count()
    values = policy.metric_values(snap, serving)
    decision, skipped = policy.evaluate_rules(
        rules,
        values,
        current=endpoint.replicas,
        endpoint_min=endpoint.min_replicas,
        endpoint_max=endpoint.max_replicas,
        now=now,
    )
    for skip in skipped:
        rule = next(r for r in rules if r.id == skip.rule_id)
        # One note per rule and cooldown, not one per pass.
        if cache.add(f"bai:serve:nodata:{skip.rule_id}", 1, rule.cooldown):
            why = skip.reason
            if skip.metric == "cpu_util":
                why += " (agents do not report replicas' CPU use)"
            record(
                endpoint,
                EventKind.SCALE,
                f"rule {skip.rule_id} skipped: {why}",
                rule=skip.rule_id,
                metric=skip.metric,
                value=None,
            )
    if decision is not None:
        _apply_scale(
            endpoint,
            old=decision.old,
            new=decision.new,
            why=decision.reason,
            data={
                "metric": decision.metric,
                "value": round(decision.value, 4),
                "rule": decision.rule_id,
            },
            rule_id=decision.rule_id,
            now=now,
        )


def _apply_scale(
    endpoint: Endpoint,
    *,
    old: int,
    new: int,
    why: str,
    data: dict[str, Any],
    rule_id: int | None = None,
    now: datetime | None = None,
) -> None:
    """Set the desired count if nobody changed it since it was read (compare-and-swap)."""
    now = now or timezone.now()
    with transaction.atomic():
        fields: dict[str, Any] = {"replicas": new}
        if (old == 0) != (new == 0):
            fields["scaled_at"] = now
        if new == 0:
            fields["status"] = EndpointStatus.SCALED_TO_ZERO
            fields["status_reason"] = "scaled to zero while idle; the next request wakes it"
        won = (
            Endpoint.objects.filter(pk=endpoint.pk, replicas=old)
            .exclude(status=EndpointStatus.DESTROYING)
            .update(**fields)
            == 1
        )
        if not won:
            return
        for key, value in fields.items():
            setattr(endpoint, key, value)
        if rule_id is not None:
            AutoScalingRule.objects.filter(pk=rule_id).update(last_triggered_at=now)
        message = why if f"scaled {old} → {new}" in why else f"scaled {old} → {new}: {why}"
        record(endpoint, EventKind.SCALE, message, **{**data, "from": old, "to": new})
    logger.info("endpoint %s scaled %d → %d: %s", endpoint.pk, old, new, why)


# --- 4. convergence -------------------------------------------------------------------------------


def _create_replica(endpoint: Endpoint) -> str | None:
    """One new route and its session; returns why it could not start, or None."""
    route = Route.objects.create(endpoint=endpoint, status=R.PROVISIONING)
    name = f"serve-{route.pk}-{endpoint.name}"[:64].rstrip("-.")
    try:
        if not start_command_of(endpoint):  # its image lost its serving command since
            raise InvalidInput(no_command(endpoint))
        with transaction.atomic():
            session = session_services.session_create(
                owner=endpoint.owner, spec=replica_spec(endpoint, name=name)
            )
            if endpoint.model_folder_id is not None:
                # Read-only: the model is the endpoint's, never the replica's to change.
                session.readonly_mounts.add(endpoint.model_folder_id)
            Route.objects.filter(pk=route.pk).update(session=session)
    except PendingLimitReached:
        # The owner's pending limit (replicas are sessions of the owner like any other): not
        # a failed start; the replica is asked again on a later pass, and the status says why.
        route.delete()
        raise
    except ApplicationError as exc:
        route.transition(R.FAILED_TO_START, health_reason=exc.message[:300])
        Endpoint.objects.filter(pk=endpoint.pk).update(start_failures=F("start_failures") + 1)
        record(
            endpoint,
            EventKind.FAILURE,
            f"could not start replica {route.pk}: {exc.message}",
            route=route.pk,
        )
        return exc.message
    logger.info("endpoint %s: replica %s started as session %s", endpoint.pk, route.pk, session.pk)
    return None


def _remove_replica(endpoint: Endpoint, route: Route, desired: int) -> None:
    was = route.status
    if not route.transition(R.TERMINATING):
        return
    if was == R.UNHEALTHY:
        message = (
            f"replica {route.pk} removed: unhealthy ({route.health_reason or 'failed checks'})"
        )
        kind = EventKind.HEALTH
    else:
        message = f"replica {route.pk} removed: more replicas than the {desired} wanted"
        kind = EventKind.SCALE
    record(endpoint, kind, message, route=route.pk)
    _end_session(route.session, f"replica of endpoint {endpoint.name} removed")


def _converge(endpoint: Endpoint, now: datetime, probe_trouble: str) -> None:
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk=endpoint.pk)
            .exclude(status=EndpointStatus.DESTROYING)
            .select_related(
                "owner", "image", "resource_group", "model_folder", "model_folder__owner"
            )
            .first()
        )
        if endpoint is None:
            return  # another worker holds it, or it is being deleted
        desired = endpoint.replicas
        routes = list(endpoint.routes.filter(status__in=LIVE_ROUTES).select_related("session"))
        create, remove = policy.plan_routes(
            [policy.RouteState(r.pk, r.status, r.created_at) for r in routes], desired
        )
        exhausted = endpoint.start_failures > settings.BAI_SERVE_MAX_START_RETRIES
        waiting = ""
        if not exhausted:
            for _ in range(create):
                try:
                    if _create_replica(endpoint):
                        break
                except PendingLimitReached as exc:
                    waiting = exc.message
                    break
        else:
            # Do not take serving replicas away while no replacement can start.
            remove = [
                pk for pk in remove if next(r for r in routes if r.pk == pk).status == R.UNHEALTHY
            ]
        by_id = {r.pk: r for r in routes}
        for pk in remove:
            _remove_replica(endpoint, by_id[pk], desired)
        endpoint.refresh_from_db(fields=["start_failures"])
        _set_status(endpoint, probe_trouble, waiting)


def _set_status(endpoint: Endpoint, probe_trouble: str, waiting: str = "") -> None:
    counts: dict[str, int] = {}
    for status in endpoint.routes.values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    healthy, starting, unhealthy = (
        counts.get(s, 0) for s in (R.HEALTHY, R.PROVISIONING, R.UNHEALTHY)
    )
    desired = endpoint.replicas
    if desired == 0 and healthy + starting + unhealthy == 0:
        status, reason = (
            EndpointStatus.SCALED_TO_ZERO,
            "no replica; the next request wakes it"
            if endpoint.min_replicas == 0
            else "scaled to 0 replicas",
        )
    elif endpoint.start_failures > settings.BAI_SERVE_MAX_START_RETRIES:
        last = endpoint.routes.filter(status=R.FAILED_TO_START).order_by("-pk").first()
        why = last.health_reason if last else "unknown"
        status = EndpointStatus.DEGRADED
        reason = (
            f"a replica failed to start {endpoint.start_failures} times in a row ({why}); "
            "not retrying until the endpoint is changed or scaled"
        )
    elif healthy >= desired:
        status, reason = EndpointStatus.READY, ""
    elif unhealthy:
        status = EndpointStatus.DEGRADED
        reason = f"{healthy} of {desired} replicas healthy; {unhealthy} unhealthy, being replaced"
    else:
        status = EndpointStatus.PROVISIONING
        reason = f"{healthy} of {desired} replicas healthy; {starting} starting"
        # What the last health check of a starting replica found (e.g. nothing listens).
        checked = (
            endpoint.routes.filter(status=R.PROVISIONING)
            .exclude(health_reason="")
            .order_by("pk")
            .first()
        )
        if checked is not None:
            reason = f"{reason}; replica {checked.pk}: {checked.health_reason}"
    if waiting and status != EndpointStatus.READY:
        reason = f"{reason}; more replicas wait for the owner's quota ({waiting})"
    if probe_trouble and status != EndpointStatus.READY:
        reason = f"{reason}; health checks cannot run: {probe_trouble}"
    if (status, reason) == (endpoint.status, endpoint.status_reason):
        return
    Endpoint.objects.filter(pk=endpoint.pk).update(status=status, status_reason=reason[:2000])
    if status == EndpointStatus.DEGRADED and endpoint.status != EndpointStatus.DEGRADED:
        record(endpoint, EventKind.FAILURE, f"degraded: {reason}")
    endpoint.status, endpoint.status_reason = status, reason
