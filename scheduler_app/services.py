"""The machinery that acts on sessions_app's models: scheduling passes, the
agent side of reconciliation, and the lost-agent sweep.

One pass = one short transaction under the group's lock: snapshot → pure
policy → commit. Agents are nudged after commit; they are never called inside
the transaction.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, CharField, F, JSONField, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from agent import protocol
from sessions_app import live
from sessions_app import services as session_services
from sessions_app.models import (
    OCCUPYING,
    TERMINAL,
    Agent,
    AgentStatus,
    Kernel,
    ResourceGroup,
    Session,
    SessionEvent,
    Status,
    hash_token,
)
from sessions_app.slots import from_strings, shortfall, to_strings

from . import policy, selectors

logger = logging.getLogger(__name__)

# Advisory-lock keys, all in one place: (namespace, object id).
LOCKS = {"resource_group": 7301}


def lock_group(group_id: int) -> None:
    """Serialise passes and agent loss per resource group across processes.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the write
    transaction itself is exclusive (transaction_mode IMMEDIATE).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [LOCKS["resource_group"], group_id]
            )


@dataclass
class PassResult:
    group: str
    placed_sessions: int = 0
    placed_kernels: int = 0
    waiting: int = 0
    cancelled: int = 0
    agents_to_notify: set[str] = field(default_factory=set)
    # Where the time went (the benchmark prints them): the whole pass including
    # commit and after-commit pushes, and its stages.
    seconds: float = 0.0
    snapshot_seconds: float = 0.0
    policy_seconds: float = 0.0
    write_seconds: float = 0.0
    commit_seconds: float = 0.0


# What a pass reads of each pending session (not the keys, environment, ...).
_PENDING_FIELDS = (
    "id",
    "owner_id",
    "resource_group_id",
    "status",
    "status_reason",
    "created_at",
    "session_type",
    "cluster_mode",
    "scheduling_attempts",
    "starts_at",
    "designated_agents",
)


def schedule_pass(*, group_id: int, now: datetime | None = None) -> PassResult:
    """Place what fits of one resource group's pending sessions."""
    started = time.perf_counter()
    now = now or timezone.now()
    with transaction.atomic():
        lock_group(group_id)
        group = ResourceGroup.objects.get(pk=group_id)
        result = PassResult(group=group.name)
        # Row locks on the pending sessions: a concurrent terminate waits for
        # this pass and then sees the outcome, so every bulk move below is exact.
        pending = list(
            Session.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(resource_group=group, status=Status.PENDING)
            .only(*_PENDING_FIELDS)
            .order_by("created_at")
        )
        if not pending:
            return result
        snapshot = selectors.build_snapshot(group=group, now=now, pending=pending)
        t0 = time.perf_counter()
        result.snapshot_seconds = t0 - started
        decisions = policy.schedule(snapshot)
        t1 = time.perf_counter()
        result.policy_seconds = t1 - t0
        by_id = {str(s.pk): s for s in pending}
        _apply_placements(decisions.placements, by_id, now, result)
        _apply_waits(decisions.waits, by_id, now, result)
        for cancel in decisions.cancellations:
            session = by_id[cancel.session_id]
            for kernel in session.kernels.filter(status=Status.PENDING):
                kernel.mark_cancelled(cancel.reason)
            if session.mark_cancelled(cancel.reason):
                result.cancelled += 1
                # Its dependents go now, with reasons that name the whole chain.
                session_services.session_cancel_dependents(session=session)
        if decisions.roundrobin_cursor != group.roundrobin_cursor:
            ResourceGroup.objects.filter(pk=group.pk).update(
                roundrobin_cursor=decisions.roundrobin_cursor
            )
        if result.placed_kernels:
            _store_occupancy(result.agents_to_notify)
        agents = sorted(result.agents_to_notify)
        transaction.on_commit(lambda: notify_agents(agents))
        if result.cancelled:
            # Cancelling may cancel dependents elsewhere: look again everywhere.
            session_services.request_scheduling(group_id=None)
        t2 = time.perf_counter()
        result.write_seconds = t2 - t1
    result.seconds = time.perf_counter() - started
    result.commit_seconds = result.seconds - (t2 - started)
    if result.placed_sessions or result.cancelled:
        logger.info(
            "pass %s: placed %d sessions (%d kernels), %d waiting, %d cancelled in %.3f s",
            result.group,
            result.placed_sessions,
            result.placed_kernels,
            result.waiting,
            result.cancelled,
            result.seconds,
        )
    return result


def _apply_placements(
    placements: list[policy.Placement], by_id: dict[str, Session], now: datetime, result: PassResult
) -> None:
    if not placements:
        return
    kernels_by_agent: dict[str, list[str]] = {}
    for placement in placements:
        for kernel_id, agent_id in placement.assignments.items():
            kernels_by_agent.setdefault(agent_id, []).append(kernel_id)
    session_ids = [by_id[p.session_id].pk for p in placements]
    Session.bulk_transition(
        session_ids, Status.PENDING, Status.SCHEDULED, "placed on agents; starting", now=now
    )
    # One statement for every kernel of the pass (one per agent cost ~4 ms each,
    # seconds for a thousand agents), each row getting its own agent. The reason
    # is shared, since a status and its event row hold the same text.
    Kernel.bulk_transition(
        [kernel_id for kernel_ids in kernels_by_agent.values() for kernel_id in kernel_ids],
        Status.PENDING,
        Status.SCHEDULED,
        "placed on its agent; starting",
        now=now,
        agent_id=_agent_per_kernel(kernels_by_agent),
    )
    result.placed_sessions = len(placements)
    result.placed_kernels = sum(len(v) for v in kernels_by_agent.values())
    result.agents_to_notify.update(kernels_by_agent)


def _agent_per_kernel(kernels_by_agent: dict[str, list[str]]) -> Any:
    """The agent_id of each kernel, as one expression for one UPDATE."""
    if connection.vendor == "postgresql":
        return _jsonb_lookup(
            Kernel,
            {
                kernel_id: agent_id
                for agent_id, ids in kernels_by_agent.items()
                for kernel_id in ids
            },
            "->>",
            CharField(),
        )
    return Case(
        *(When(pk__in=ids, then=Value(agent_id)) for agent_id, ids in kernels_by_agent.items()),
        output_field=CharField(),
    )


def _jsonb_lookup(model: Any, by_pk: dict[str, Any], operator: str, output_field: Any) -> RawSQL:
    """PostgreSQL: each row's own value, looked up by its primary key (as text) in
    one jsonb parameter. A CASE with a branch per value costs Django ~0.25 ms a
    branch to build and PostgreSQL a walk through the branches for every row."""
    quote = connection.ops.quote_name
    column = f"{quote(model._meta.db_table)}.{quote(model._meta.pk.column)}"
    return RawSQL(
        f"(%s::jsonb {operator} {column}::text)", [json.dumps(by_pk)], output_field=output_field
    )


def _apply_waits(
    waits: list[policy.Wait], by_id: dict[str, Session], now: datetime, result: PassResult
) -> None:
    """Persist each waiting session's reason and attempt count; log an event
    only when the reason changes, so the history stays readable.

    A few statements whatever the queue length: one for the attempts, one for
    the new reasons (elsewhere than PostgreSQL: one per distinct reason), one
    for the events.
    """
    attempted: list[Any] = []
    by_reason: dict[str, list[Any]] = defaultdict(list)
    events: list[SessionEvent] = []
    for wait in waits:
        session = by_id[wait.session_id]
        reason = wait.reason[:500]
        if wait.counts_as_attempt:
            session.scheduling_attempts += 1
            attempted.append(session.pk)
        if session.status_reason != reason:
            session.status_reason = reason
            by_reason[reason].append(session.pk)
            events.append(
                SessionEvent(
                    session=session,
                    from_status=Status.PENDING,
                    to_status=Status.PENDING,
                    reason=f"waiting: {reason}",
                    created_at=now,
                )
            )
            live.session_changed(
                owner_id=session.owner_id,
                session_id=str(session.pk),
                status=Status.PENDING,
                reason=reason,
            )
    # The rows are locked by this pass, so the increment is exact.
    for chunk in _chunks(attempted):
        Session.objects.filter(pk__in=chunk).update(
            scheduling_attempts=F("scheduling_attempts") + 1
        )
    if connection.vendor == "postgresql" and len(by_reason) > 1:
        reasons = {str(pk): reason for reason, ids in by_reason.items() for pk in ids}
        for chunk in _chunks(list(reasons)):
            Session.objects.filter(pk__in=chunk).update(
                status_reason=_jsonb_lookup(
                    Session, {pk: reasons[pk] for pk in chunk}, "->>", CharField()
                )
            )
    else:
        for reason, ids in by_reason.items():
            for chunk in _chunks(ids):
                Session.objects.filter(pk__in=chunk).update(status_reason=reason)
    if events:
        SessionEvent.objects.bulk_create(events, batch_size=2000)
    result.waiting = len(waits)


def _chunks(ids: list[Any], size: int = 5000) -> Iterator[list[Any]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


class Oversubscribed(RuntimeError):
    """A pass would commit more than an agent holds; the pass rolls back."""


def _store_occupancy(agent_ids: set[str]) -> None:
    """Re-check capacity at commit and keep Agent.occupied_slots (shown in
    admin and the API) equal to the value derived from the kernels."""
    occupied = selectors.agent_occupancy(agent_ids=list(agent_ids))
    agents = list(Agent.objects.filter(pk__in=agent_ids))
    for agent in agents:
        held = occupied.get(agent.pk, {})
        capacity = from_strings(agent.capacity_slots or {})
        over = shortfall(held, capacity)
        if over:
            raise Oversubscribed(f"agent {agent.pk} would hold {held} of {capacity}; rolled back")
        agent.occupied_slots = to_strings(held)
    if connection.vendor == "postgresql":
        Agent.objects.filter(pk__in=agent_ids).update(
            occupied_slots=_jsonb_lookup(
                Agent, {a.pk: a.occupied_slots for a in agents}, "->", JSONField()
            )
        )
    else:
        Agent.objects.bulk_update(agents, ["occupied_slots"], batch_size=500)


def notify_agents(agent_ids: list[str]) -> None:
    """Fast path: tell each agent's gateway to reconcile now, all in one trip
    into the event loop (a pass may touch a thousand agents). Best effort: the
    heartbeat path catches up."""
    live.group_send_many(
        [(protocol.agent_group(a), {"type": "agent.reconcile"}) for a in agent_ids]
    )


def schedulable_group_ids(group_id: int | None) -> list[int]:
    qs = ResourceGroup.objects.filter(is_active=True)
    if group_id is not None:
        qs = qs.filter(pk=group_id)
    return list(qs.values_list("pk", flat=True))


# --- agents -----------------------------------------------------------------


class AgentRefused(Exception):
    """The agent may not connect; the message says why (and is logged)."""


def agent_authenticate(*, token: str) -> Agent:
    agent = (
        Agent.objects.filter(token_hash=hash_token(token)).select_related("resource_group").first()
    )
    if agent is None:
        raise AgentRefused("unknown agent token (create the agent and its token in Django admin)")
    if agent.status == AgentStatus.TERMINATED:
        raise AgentRefused(f"agent {agent.pk} was decommissioned by an admin")
    return agent


def agent_register(*, agent: Agent, info: dict[str, Any], now: datetime | None = None) -> Agent:
    """Record what the agent says about itself and mark it alive."""
    now = now or timezone.now()
    capacity = {}
    for slot, value in (info.get("slots") or {}).items():
        capacity[str(slot)] = str(value)
    fields: dict[str, Any] = {
        "status": AgentStatus.ALIVE,
        "status_reason": "connected",
        "backend": str(info.get("backend") or "")[:16],
        "hostname": str(info.get("hostname") or "")[:255],
        "version": str(info.get("version") or "")[:64],
        "capacity_slots": capacity,
        "labels": info.get("labels") or {},
        "last_heartbeat_at": now,
        "lost_at": None,
    }
    if agent.first_contact_at is None:
        fields["first_contact_at"] = now
    wanted_group = info.get("resource_group")
    if wanted_group and wanted_group != agent.resource_group.name:
        group = ResourceGroup.objects.filter(name=wanted_group).first()
        if group is None:
            raise AgentRefused(f"resource group {wanted_group!r} does not exist")
        fields["resource_group"] = group
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(**fields)
    agent.refresh_from_db()
    logger.info("agent %s registered: %s backend, slots %s", agent.pk, agent.backend, capacity)
    session_services.request_scheduling(group_id=agent.resource_group_id)
    return agent


# Kernels created less than this long ago may not be reported yet.
CREATE_GRACE = timedelta(seconds=20)


def agent_reconcile(
    *, agent_id: str, reports: list[dict[str, Any]] | None, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Compare desired state (database) with the agent's report and return
    the commands that close the gap. ``reports`` None: no fresh report (a
    nudge after a scheduling pass) — only create what is new.
    """
    now = now or timezone.now()
    commands: list[dict[str, Any]] = []
    if reports is not None:
        Agent.objects.filter(pk=agent_id).update(last_heartbeat_at=now)
        reported = {r["kernel_id"]: r for r in reports if r.get("kernel_id")}
        for kernel_id, report in reported.items():
            _apply_report(agent_id=agent_id, kernel_id=kernel_id, report=report)
    else:
        reported = {}
    placed = {
        str(k.pk): k
        for k in Kernel.objects.filter(agent_id=agent_id, status__in=OCCUPYING).select_related(
            "session"
        )
    }
    to_create: dict[Any, list[Kernel]] = {}
    to_destroy: list[str] = []
    for kernel_id, kernel in placed.items():
        if kernel.status == Status.TERMINATING:
            if reports is not None and kernel_id not in reported:
                session_services.kernel_apply_report(
                    kernel=kernel, report={"status": protocol.KR_GONE, "reason": "destroyed"}
                )
            else:
                to_destroy.append(kernel_id)
            continue
        if kernel_id in reported:
            continue
        if kernel.status == Status.SCHEDULED:
            to_create.setdefault(kernel.session_id, []).append(kernel)
        elif reports is None:
            continue
        elif kernel.status == Status.RUNNING:
            # It ran here and the agent no longer has it.
            session_services.kernel_apply_report(
                kernel=kernel,
                report={
                    "status": protocol.KR_ERROR,
                    "reason": f"the container vanished from agent {agent_id}",
                },
            )
        elif kernel.status_changed_at and now - kernel.status_changed_at > CREATE_GRACE:
            # Preparing for long and not reported: the create was lost; send it again.
            to_create.setdefault(kernel.session_id, []).append(kernel)
    if reports is not None:
        # Reported but not wanted here: ended, unknown or placed elsewhere. Never adopt twice.
        for kernel_id, report in reported.items():
            if kernel_id not in placed and report.get("status") not in (protocol.KR_GONE,):
                to_destroy.append(kernel_id)
    for kernels in to_create.values():
        commands.append(
            session_services.create_kernels_command(session=kernels[0].session, kernels=kernels)
        )
    if to_destroy:
        commands.append(
            {
                "type": protocol.DESTROY_KERNELS,
                "kernel_ids": sorted(set(to_destroy)),
                "reason": "not wanted",
            }
        )
    return commands


def _apply_report(*, agent_id: str, kernel_id: str, report: dict[str, Any]) -> None:
    kernel = Kernel.objects.filter(pk=_uuid_or_none(kernel_id), agent_id=agent_id).first()
    if kernel is None or kernel.status in TERMINAL:
        return
    session_services.kernel_apply_report(kernel=kernel, report=report)


def agent_kernel_report(*, agent_id: str, report: dict[str, Any]) -> None:
    """A kernel_status message: apply it at once."""
    _apply_report(agent_id=agent_id, kernel_id=str(report.get("kernel_id")), report=report)


def _uuid_or_none(value: str) -> Any:
    import uuid

    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        return None


def agent_disconnected(*, agent_id: str) -> None:
    Agent.objects.filter(pk=agent_id, status=AgentStatus.ALIVE).update(
        status_reason="disconnected; waiting"
    )


def sweep_lost_agents(*, now: datetime | None = None) -> list[str]:
    """Agents silent past the timeout become LOST; their kernels end with that
    reason (their sessions too) and their slots are freed. Safe to run twice."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.BAI_AGENT_LOST_TIMEOUT)
    lost: list[str] = []
    candidates = Agent.objects.filter(status=AgentStatus.ALIVE, last_heartbeat_at__lt=now - timeout)
    for agent_id, group_id, last in candidates.values_list(
        "pk", "resource_group_id", "last_heartbeat_at"
    ):
        with transaction.atomic():
            lock_group(group_id)
            silent = int((now - last).total_seconds())
            reason = f"agent {agent_id} lost: no heartbeat for {silent} s"
            moved = Agent.objects.filter(
                pk=agent_id, status=AgentStatus.ALIVE, last_heartbeat_at__lt=now - timeout
            ).update(status=AgentStatus.LOST, status_reason=reason, lost_at=now, occupied_slots={})
            if not moved:
                continue
            lost.append(agent_id)
            logger.warning("%s", reason)
            for kernel in Kernel.objects.filter(agent_id=agent_id, status__in=OCCUPYING):
                session_services.kernel_apply_report(
                    kernel=kernel, report={"status": protocol.KR_ERROR, "reason": reason}
                )
    return lost
