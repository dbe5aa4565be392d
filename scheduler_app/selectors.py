"""Reads that build the scheduler's plain snapshots from the database."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q

from sessions_app import selectors as session_selectors
from sessions_app.models import (
    Agent,
    AgentStatus,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    Session,
    Status,
    UserResourcePolicy,
)
from sessions_app.policy import dependency_state
from sessions_app.selectors import agent_occupancy

from . import policy

# agent_occupancy lives with the other reads of held slots (sessions_app.selectors), which
# the launch preview shares; the scheduler's services read it from here as before.
__all__ = ["agent_occupancy", "build_snapshot", "owner_usage"]

# A slot a policy does not list is unlimited; the policy type reads a missing
# slot as 0, so unlisted known slots get an amount no request reaches.
_UNLIMITED = Decimal(10) ** 30
_ZERO = Decimal(0)


def _slots(raw: dict[str, Any] | None) -> policy.ResourceSlots:
    return policy.ResourceSlots.from_mapping(raw or {})


class _SlotsCache:
    """Parse each distinct stored slot dict once per pass: thousands of kernels
    share a handful of shapes, and parsing exact decimals is the costly part."""

    def __init__(self) -> None:
        self._parsed: dict[str, policy.ResourceSlots] = {}

    def __call__(self, text: str | None) -> policy.ResourceSlots:
        slots = self._parsed.get(text or "")
        if slots is None:
            slots = self._parsed[text or ""] = _slots(json.loads(text) if text else None)
        return slots


# The stored JSON as text: no per-row decoding, and the text is the cache key.
_as_text = session_selectors.slots_as_text


def _quota(p: ResourcePolicy | None, groups: dict[int, str]) -> policy.Quota:
    if p is None:
        return policy.Quota(None, None, None, None, None)
    total = None
    if p.total_resource_slots:
        listed = {k: Decimal(str(v)) for k, v in p.total_resource_slots.items()}
        total = policy.ResourceSlots.from_mapping(
            {slot: listed.get(slot, _UNLIMITED) for slot in {*settings.BAI_SLOT_TYPES, *listed}}
        )
    allowed_ids = [g.pk for g in p.allowed_resource_groups.all()]
    return policy.Quota(
        total_slots=total,
        max_concurrent_sessions=p.max_concurrent_sessions,
        max_pending_sessions=p.max_pending_sessions,
        max_containers_per_session=p.max_containers_per_session,
        allowed_resource_groups=frozenset(groups[i] for i in allowed_ids if i in groups) or None,
        max_concurrent_system_sessions=p.max_concurrent_sftp_sessions,
    )


def build_snapshot(
    *, group: ResourceGroup, now: datetime, pending: list[Session]
) -> policy.Snapshot:
    """Everything the policy needs for one pass over ``pending``: the PENDING
    sessions of ``group`` that the pass holds (schedule_pass locks them)."""
    group_names = dict(ResourceGroup.objects.values_list("pk", "name"))
    slots = _SlotsCache()
    # Kernels and dependencies are read by a join on the group's pending
    # sessions rather than by a list of thousands of ids: the same rows, or a
    # few more (sessions that arrived since or that another transaction holds),
    # which nothing below looks up.
    in_queue = Q(session__resource_group=group, session__status=Status.PENDING)
    kernels_by_session: dict[Any, list[policy.KernelRequest]] = defaultdict(list)
    for kernel_id, session_id, requested in (
        Kernel.objects.filter(in_queue)
        .order_by("local_rank")
        .values_list("pk", "session_id", _as_text("requested_slots"))
    ):
        kernels_by_session[session_id].append(
            policy.KernelRequest(str(kernel_id), slots(requested))
        )

    depends: dict[Any, list[str]] = defaultdict(list)
    through = Session.depends_on.through
    for from_id, to_id in through.objects.filter(
        from_session__resource_group=group, from_session__status=Status.PENDING
    ).values_list("from_session_id", "to_session_id"):
        depends[from_id].append(str(to_id))
    dependency_ids = {d for ds in depends.values() for d in ds}
    dependencies = {
        str(pk): dependency_state(
            status=st, result=result, name=name, exit_code=code, status_reason=why
        )
        for pk, st, result, name, code, why in Session.objects.filter(
            pk__in=dependency_ids
        ).values_list("pk", "status", "result", "name", "exit_code", "status_reason")
    }

    pending_states = tuple(
        policy.PendingSession(
            session_id=str(s.pk),
            owner_id=str(s.owner_id),
            created_at=s.created_at,
            session_type=s.session_type,
            cluster_mode=s.cluster_mode,
            kernels=tuple(kernels_by_session[s.pk]),
            attempts=s.scheduling_attempts,
            depends_on=tuple(depends.get(s.pk, ())),
            starts_at=s.starts_at,
        )
        for s in pending
        if kernels_by_session.get(s.pk)
    )

    agents = list(
        Agent.objects.filter(
            resource_group=group, status=AgentStatus.ALIVE, schedulable=True
        ).values_list("pk", _as_text("capacity_slots"))
    )
    occupied = agent_occupancy(agent_ids=[pk for pk, _ in agents])
    agent_states = tuple(
        policy.AgentState(
            agent_id=pk,
            capacity=slots(capacity),
            occupied=policy.ResourceSlots.from_mapping(occupied.get(pk, {})),
        )
        for pk, capacity in agents
    )

    owner_ids = {s.owner_id for s in pending}
    usage = owner_usage(owner_ids=owner_ids)
    default_policy = (
        ResourcePolicy.objects.filter(is_default=True)
        .prefetch_related("allowed_resource_groups")
        .first()
    )
    assigned = {
        a.user_id: a.policy
        for a in UserResourcePolicy.objects.filter(user_id__in=owner_ids).select_related("policy")
    }
    quotas = {str(uid): _quota(p, group_names) for uid, p in assigned.items()}

    return policy.Snapshot(
        group=policy.GroupConfig(
            name=group.name,
            session_selection=group.session_selection,
            num_retries_to_skip=group.num_retries_to_skip,
            agent_selection=group.agent_selection,
            allowed_session_types=frozenset(group.allowed_session_types),
            pending_timeout=group.pending_timeout,
            roundrobin_cursor=group.roundrobin_cursor,
        ),
        now=now,
        pending=pending_states,
        agents=agent_states,
        usage=usage,
        quotas=quotas,
        dependencies=dependencies,
        default_quota=_quota(default_policy, group_names),
    )


def owner_usage(*, owner_ids: set[int]) -> dict[str, policy.OwnerUsage]:
    return {
        str(uid): policy.OwnerUsage(
            occupied=policy.ResourceSlots.from_mapping(usage.held),
            active_sessions=usage.active,
            pending_sessions=usage.pending,
            active_system_sessions=usage.active_system,
        )
        for uid, usage in session_selectors.owner_usage(owner_ids=owner_ids).items()
    }
