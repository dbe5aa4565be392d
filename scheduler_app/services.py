"""The scheduling pass: what acts on sessions_app's pending sessions. (The
agent side lives in ``reconcile``, the time limits in ``sweeps``.)

One pass = one short transaction under the group's lock: snapshot → pure
policy → commit. Agents are nudged after commit; they are never called inside
the transaction.

One row never stops a pass: a pending session the snapshot cannot use
(``selectors.Rejects``: slots out of range or unreadable, a start time or batch
timeout out of range, no kernels) is cancelled with that reason, and an agent
whose capacity cannot be read is left out with the reason in its
``status_reason``; the rest of the group is placed in the same pass.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, CharField, F, JSONField, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from sessions_app import live
from sessions_app import services as session_services
from sessions_app.models import (
    Agent,
    AgentStatus,
    Kernel,
    ResourceGroup,
    Session,
    SessionEvent,
    Status,
)
from sessions_app.slots import from_strings, shortfall, to_strings

from . import policy, selectors
from .locks import lock_group
from .reconcile import notify_agents

logger = logging.getLogger(__name__)


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
    "batch_timeout",
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
            result.seconds = time.perf_counter() - started
            return result
        rejects = selectors.Rejects()
        snapshot = selectors.build_snapshot(group=group, now=now, pending=pending, rejects=rejects)
        t0 = time.perf_counter()
        result.snapshot_seconds = t0 - started
        decisions = policy.schedule(snapshot)
        t1 = time.perf_counter()
        result.policy_seconds = t1 - t0
        by_id = {str(s.pk): s for s in pending}
        _apply_placements(decisions.placements, by_id, now, result)
        _apply_waits(decisions.waits, by_id, now, result)
        _record_rejected_agents(group=group, rejects=rejects.agents)
        for session_id, reason in rejects.sessions.items():
            logger.warning("pass %s: session %s %s", group.name, session_id, reason)
        rejected = [policy.Cancellation(sid, why) for sid, why in rejects.sessions.items()]
        for cancel in [*rejected, *decisions.cancellations]:
            session = by_id[cancel.session_id]
            for kernel in session.kernels.filter(status=Status.PENDING):
                if kernel.mark_cancelled(cancel.reason):
                    live.status_changed(kernel)
            if session.mark_cancelled(cancel.reason):
                live.status_changed(session)
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


def _record_rejected_agents(*, group: ResourceGroup, rejects: dict[str, str]) -> None:
    """Say on each agent the pass left out why; clear the word on the others."""
    for agent_id, reason in rejects.items():
        reason = reason[:255]
        if (
            Agent.objects.filter(pk=agent_id)
            .exclude(status_reason=reason)
            .update(status_reason=reason)
        ):
            logger.warning("agent %s %s", agent_id, reason)
    # An agent fixed since (its capacity, or the kernel it ran) is usable again.
    Agent.objects.filter(
        resource_group=group,
        status=AgentStatus.ALIVE,
        status_reason__startswith=selectors.AGENT_REJECTED,
    ).exclude(pk__in=list(rejects)).update(status_reason="connected")


def _apply_placements(
    placements: list[policy.Placement], by_id: dict[str, Session], now: datetime, result: PassResult
) -> None:
    if not placements:
        return
    kernels_by_agent: dict[str, list[str]] = {}
    for placement in placements:
        for kernel_id, agent_id in placement.assignments.items():
            kernels_by_agent.setdefault(agent_id, []).append(kernel_id)
    sessions = [by_id[p.session_id] for p in placements]
    reason = "placed on agents; starting"
    Session.bulk_transition(
        [s.pk for s in sessions], Status.PENDING, Status.SCHEDULED, reason, now=now
    )
    for session in sessions:
        live.session_changed(
            owner_id=session.owner_id,
            session_id=str(session.pk),
            status=Status.SCHEDULED,
            reason=reason,
        )
    # One statement for every kernel of the pass (one per agent cost ~4 ms each,
    # seconds for a thousand agents), each row getting its own agent. The reason
    # is shared, since a status and its event row hold the same text.
    kernel_ids = [kernel_id for ids in kernels_by_agent.values() for kernel_id in ids]
    reason = "placed on its agent; starting"
    Kernel.bulk_transition(
        kernel_ids,
        Status.PENDING,
        Status.SCHEDULED,
        reason,
        now=now,
        agent_id=_agent_per_kernel(kernels_by_agent),
    )
    live.kernels_changed(kernel_ids=kernel_ids, status=Status.SCHEDULED, reason=reason)
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
                    reason=reason if reason.startswith("waiting") else f"waiting: {reason}",
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


def schedulable_group_ids(group_id: int | None) -> list[int]:
    qs = ResourceGroup.objects.filter(is_active=True)
    if group_id is not None:
        qs = qs.filter(pk=group_id)
    return list(qs.values_list("pk", flat=True))
