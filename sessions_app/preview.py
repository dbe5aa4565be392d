"""Will it fit: a launch spec judged against the user's quota and the group's free slots now.

Reads only: nothing is written and nothing is queued. The spec is checked by
``launch.plan_preview``, so a bad spec is refused exactly as a launch would be.
The verdict applies the scheduler's rules (``sessions_app.policy``) in the
scheduler's order, and gives its words:

- ``never``: a launch would be refused because the session can never fit (the
  quota's bounds on one session, more than the group's largest agent), or a
  dependency already ended without success;
- ``wait``: it would be accepted and wait: for its start time, its dependencies,
  the owner's quota (sessions or slots held now), a FIFO queue that is stuck
  on a session short of resources, or free slots;
- ``start_now``: none of that; the next scheduling pass should place it.

It is a forecast of the next pass, not a reservation: other launches may take
the free slots first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from bai_common.units import format_amount, format_decimal, format_slot

from . import policy as rules
from . import selectors
from .launch import LaunchPlan, plan_preview, plan_warnings
from .models import (
    ClusterMode,
    ResourcePolicy,
    Session,
    SessionSelection,
    SessionType,
    Status,
)

START_NOW, WAIT, NEVER = "start_now", "wait", "never"
VERDICTS = (START_NOW, WAIT, NEVER)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Preview:
    verdict: str
    reason: str
    reasons: list[str]
    resources: dict[str, Any]
    quota: dict[str, Any]
    resource_group: dict[str, Any]
    # What the launch will not do that its user may count on (``ssh sub1``); never refused.
    warnings: list[str]


def launch_preview(*, owner: AbstractBaseUser, spec: Any) -> Preview:
    """What launching ``spec`` as ``owner`` would do now, and why (see the module docstring).

    Raises what ``launch.plan_launch`` raises for a bad spec and for the pending limit.
    """
    plan, never = plan_preview(owner=owner, spec=spec)
    policy = selectors.policy_for_user(user=owner)
    usage = selectors.owner_usage(owner_ids={owner.pk})[owner.pk]
    total = _total(plan)
    rooms = _rooms(plan)
    quota = _quota(plan, policy, usage, total)
    group = _group(plan, rooms)

    reasons: list[str] = []
    if never is None:
        never = _dependencies(plan, reasons)
    if never is not None:
        verdict, reasons = NEVER, [never]
    else:
        if plan.starts_at is not None and plan.starts_at > timezone.now():
            reasons.append(rules.start_time_wait(plan.starts_at))
        reasons += _quota_waits(plan, policy, usage, total)
        if blocker := _stuck_fifo_head(plan):
            reasons.append(rules.queued_behind(str(blocker)))
        shortage = rules.placement_shortage(
            kernels=plan.kernel_slots,
            single_node=plan.cluster_mode == ClusterMode.SINGLE_NODE,
            free=[room.free for room in rooms],
            group=plan.group.name,
        )
        if shortage is not None:
            reasons.append(shortage)
        verdict = WAIT if reasons else START_NOW
    reason = reasons[0] if reasons else _fits_words(plan)
    return Preview(
        verdict=verdict,
        reason=reason,
        reasons=reasons,
        resources=_resources(plan, total),
        quota=quota,
        resource_group=group,
        warnings=plan_warnings(plan),
    )


def _fits_words(plan: LaunchPlan) -> str:
    if plan.cluster_size == 1:
        return f"fits now: an agent of resource group {plan.group.name} has room for it"
    return (
        f"fits now: the agents of resource group {plan.group.name} have room "
        f"for all {plan.cluster_size} containers"
    )


def _total(plan: LaunchPlan) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for one in plan.kernel_slots:
        for slot, value in one.items():
            total[slot] = total.get(slot, _ZERO) + value
    return total


def _strings(slots: dict[str, Decimal]) -> dict[str, str]:
    return {slot: format_decimal(value) for slot, value in slots.items()}


def _text(slots: dict[str, Decimal]) -> str:
    shown = [format_slot(s, slots[s]) for s in rules.slot_order(slots) if slots.get(s, _ZERO) > 0]
    return ", ".join(shown) or "nothing"


def _resources(plan: LaunchPlan, total: dict[str, Decimal]) -> dict[str, Any]:
    containers = [{"role": "main", "count": 1, "resources": _strings(plan.main.slots)}]
    if plan.cluster_size > 1:
        containers.append(
            {"role": "sub", "count": plan.cluster_size - 1, "resources": _strings(plan.sub.slots)}
        )
    return {
        "cluster_mode": plan.cluster_mode,
        "cluster_size": plan.cluster_size,
        "containers": containers,
        "total": _strings(total),
        "text": _text(total),
    }


# --- the user's quota ------------------------------------------------------------------------


def _limits(policy: ResourcePolicy | None) -> dict[str, Decimal]:
    if policy is None:
        return {}
    return {slot: Decimal(str(v)) for slot, v in (policy.total_resource_slots or {}).items()}


def _quota(
    plan: LaunchPlan,
    policy: ResourcePolicy | None,
    usage: selectors.OwnerUsage,
    total: dict[str, Decimal],
) -> dict[str, Any]:
    """What is left of the owner's quota, per slot and in sessions (None: unlimited).

    System sessions count against their own session limit and no slot limit.
    """
    system = plan.session_type == SessionType.SYSTEM
    limits = {} if system else _limits(policy)
    slots = {}
    for slot in rules.slot_order({*settings.BAI_SLOT_TYPES, *limits, *total}):
        used, limit = usage.held.get(slot, _ZERO), limits.get(slot)
        left = None if limit is None else max(limit - used, _ZERO)
        text = (
            "unlimited"
            if left is None
            else f"{format_amount(slot, left)} left of {format_slot(slot, limit)}"
        )
        slots[slot] = {
            "limit": None if limit is None else format_decimal(limit),
            "used": format_decimal(used),
            "left": None if left is None else format_decimal(left),
            "text": text,
        }
    if system:
        active = usage.active_system
        session_limit = policy.max_concurrent_sftp_sessions if policy else None
    else:
        active = usage.active
        session_limit = policy.max_concurrent_sessions if policy else None
    pending_limit = policy.max_pending_sessions if policy and not system else None
    return {
        "policy": policy.name if policy else None,
        "slots": slots,
        "sessions": _count(session_limit, active, "active"),
        "pending_sessions": _count(pending_limit, usage.pending, "pending"),
        "max_containers_per_session": policy.max_containers_per_session if policy else None,
    }


def _count(limit: int | None, used: int, key: str) -> dict[str, Any]:
    return {"limit": limit, key: used, "left": None if limit is None else max(limit - used, 0)}


def _quota_waits(
    plan: LaunchPlan,
    policy: ResourcePolicy | None,
    usage: selectors.OwnerUsage,
    total: dict[str, Decimal],
) -> list[str]:
    """The quota checks of a scheduling pass, against what the owner holds now."""
    if policy is None:
        return []
    if plan.session_type == SessionType.SYSTEM:
        refusal = rules.concurrent_refusal(
            usage.active_system, policy.max_concurrent_sftp_sessions, system=True
        )
        return [refusal] if refusal else []
    refusal = rules.concurrent_refusal(usage.active, policy.max_concurrent_sessions)
    if refusal is not None:
        return [refusal]
    for slot, allowed in _limits(policy).items():
        refusal = rules.total_slots_refusal(
            slot=slot,
            held=usage.held.get(slot, _ZERO),
            wanted=total.get(slot, _ZERO),
            allowed=allowed,
            amount=partial(format_amount, slot),
        )
        if refusal is not None:
            return [refusal]
    return []


# --- dependencies and the queue --------------------------------------------------------------


def _dependencies(plan: LaunchPlan, reasons: list[str]) -> str | None:
    """Why it can never start (a dependency ended without success), or None; the
    dependencies still running are added to ``reasons``."""
    if not plan.depends_on:
        return None
    labelled = [
        (
            dep.name or str(dep.pk)[:8],
            rules.dependency_state(
                status=dep.status,
                result=dep.result,
                name=dep.name,
                exit_code=dep.exit_code,
                status_reason=dep.status_reason,
            ),
        )
        for dep in plan.depends_on
    ]
    failed, waiting = rules.dependencies_verdict(labelled)
    if failed is None and waiting:
        reasons.append(rules.dependencies_wait(waiting))
    return failed


def _stuck_fifo_head(plan: LaunchPlan) -> uuid.UUID | None:
    """FIFO: the oldest pending session the pass takes before a new one that already
    failed to fit for lack of resources (it blocks the queue behind it), or None."""
    group = plan.group
    if group.session_selection != SessionSelection.FIFO:
        return None
    ahead = Session.objects.filter(
        resource_group=group, status=Status.PENDING, scheduling_attempts__gt=0
    )
    if group.num_retries_to_skip > 0:
        # With head-of-line avoidance, sessions past their retries go behind the new one.
        ahead = ahead.filter(scheduling_attempts__lte=group.num_retries_to_skip)
    return ahead.order_by("created_at", "pk").values_list("pk", flat=True).first()


# --- the resource group now ------------------------------------------------------------------


@dataclass(frozen=True)
class _Room:
    """An agent that can take a kernel now."""

    capacity: dict[str, Decimal]
    occupied: dict[str, Decimal]

    @property
    def free(self) -> dict[str, Decimal]:
        return {s: v - self.occupied.get(s, _ZERO) for s, v in self.capacity.items()}


def _rooms(plan: LaunchPlan) -> list[_Room]:
    """The group's agents that can take a kernel now: alive and schedulable."""
    agents = selectors.live_agents_in_group(group=plan.group)
    occupied = selectors.agent_occupancy(agent_ids=[pk for pk, _ in agents])
    return [_Room(capacity, occupied.get(pk, {})) for pk, capacity in agents]


def _group(plan: LaunchPlan, rooms: list[_Room]) -> dict[str, Any]:
    """Per slot: the group's capacity, what is occupied, what is free, the most on one agent."""
    names = {*settings.BAI_SLOT_TYPES, *(s for room in rooms for s in room.capacity)}
    slots = {}
    for slot in rules.slot_order(names):
        capacity = sum((room.capacity.get(slot, _ZERO) for room in rooms), _ZERO)
        occupied = sum((room.occupied.get(slot, _ZERO) for room in rooms), _ZERO)
        frees = [max(room.free.get(slot, _ZERO), _ZERO) for room in rooms]
        free, largest = sum(frees, _ZERO), max(frees, default=_ZERO)
        slots[slot] = {
            "capacity": format_decimal(capacity),
            "occupied": format_decimal(occupied),
            "free": format_decimal(free),
            "largest_free": format_decimal(largest),
            "text": (
                f"{format_amount(slot, free)} free of {format_slot(slot, capacity)}; "
                f"at most {format_amount(slot, largest)} on one agent"
            ),
        }
    pending = Session.objects.filter(resource_group=plan.group, status=Status.PENDING).count()
    return {
        "name": plan.group.name,
        "session_selection": plan.group.session_selection,
        "agents": len(rooms),
        "pending_sessions": pending,
        "slots": slots,
    }
