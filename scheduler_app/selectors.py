"""Reads that build the scheduler's plain snapshots from the database.

Every row is checked as it is read, since a row written around the API (by
hand, or by an older release) must not stop a pass: a pending session whose
kernels ask for slots the policy cannot use (``1e-19`` cpu, ``NaN``, text),
whose start time or batch timeout is out of range, or that has no kernels is
left out of the snapshot and named in ``Rejects`` with the reason the pass
records on it; so is an agent whose capacity, or a kernel it runs, cannot be
read. Slots are checked against their documented precision
(``sessions_app.policy.slot_value_refusal``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q

from backendai_web.db import FAR_FUTURE, FAR_PAST
from sessions_app import agent_selectors
from sessions_app import selectors as session_selectors
from sessions_app.deadlines import batch_timeout_refusal
from sessions_app.launch import MAX_START_AHEAD
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
from sessions_app.selectors import agent_occupancy, read_slots

from . import policy

logger = logging.getLogger(__name__)

# agent_occupancy lives with the other reads of held slots (sessions_app.selectors), which
# the launch preview shares; the scheduler's services read it from here as before.
__all__ = ["agent_occupancy", "build_snapshot", "owner_usage"]

# A slot a policy does not list is unlimited; the policy type reads a missing
# slot as 0, so unlisted known slots get an amount no request reaches.
_UNLIMITED = Decimal(10) ** 30
_ZERO = Decimal(0)


@dataclass
class Rejects:
    """Rows a pass leaves out, each with the reason it records on that row."""

    sessions: dict[str, str] = field(default_factory=dict)  # session id -> reason
    agents: dict[str, str] = field(default_factory=dict)  # agent id -> reason


class _SlotsCache:
    """Parse each distinct stored slot dict once per pass: thousands of kernels
    share a handful of shapes, and parsing exact decimals is the costly part.
    Returns the slots, or why they cannot be used (``read_slots``, strict)."""

    def __init__(self) -> None:
        self._parsed: dict[str, policy.ResourceSlots | str] = {}

    def __call__(self, text: str | None) -> policy.ResourceSlots | str:
        slots = self._parsed.get(text or "")
        if slots is None:
            amounts = read_slots(text, strict=True)
            slots = self._parsed[text or ""] = (
                amounts if isinstance(amounts, str) else policy.ResourceSlots.from_mapping(amounts)
            )
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


def agent_selector_for(*, group: ResourceGroup) -> policy.AgentSelector:
    """The group's agent selector built with its options; one that cannot be used (not
    installed, broken, bad options stored anyway) becomes a stand-in under which every session
    waits with the reason, rather than a pass that fails."""
    try:
        selector = agent_selectors.agent_selector_build(
            name=group.agent_selection, options=group.agent_selector_options
        )
    except agent_selectors.AgentSelectorError as exc:
        logger.warning("resource group %s cannot place sessions: %s", group.name, exc.message)
        return policy.UnavailableAgentSelector(exc.message)
    assert isinstance(selector, policy.AgentSelector)  # agent_selector_build checks the class
    return selector


def _pinned(designated: Any) -> tuple[str, ...]:
    # Launch validates the list; a row that got through anyway pins to what it names (and so
    # waits, naming it) rather than being placed anywhere or stopping the pass.
    if isinstance(designated, list):
        return tuple(str(agent_id) for agent_id in designated)
    return (str(designated),) if designated else ()


# The start of the status reason of an agent the pass leaves out.
AGENT_REJECTED = "not schedulable:"


# A session is written with its kernels in one transaction; one without any
# for this long was not (a writer that commits them separately is given time).
NO_KERNELS_GRACE = timedelta(minutes=1)


def _session_refusal(session: Session, *, has_kernels: bool, now: datetime) -> str | None:
    """Why a pending session (its kernels' slots aside) can never be scheduled, or None."""
    if not has_kernels:
        if now - session.created_at > NO_KERNELS_GRACE:
            return "cannot be scheduled: it has no kernels"
        return None
    starts_at = session.starts_at
    if starts_at is not None:
        if starts_at in (FAR_PAST, FAR_FUTURE):
            return "cannot be scheduled: its start time is not a date between the years 1 and 9999"
        if starts_at - session.created_at > MAX_START_AHEAD:
            return (
                f"cannot be scheduled: its start time {starts_at.isoformat()} is more than "
                f"{MAX_START_AHEAD.days} days after it was created"
            )
    why = batch_timeout_refusal(session.batch_timeout)
    if why is not None:
        return f"cannot be scheduled: its batch timeout {why}"
    return None


def build_snapshot(
    *,
    group: ResourceGroup,
    now: datetime,
    pending: list[Session],
    rejects: Rejects | None = None,
) -> policy.Snapshot:
    """Everything the policy needs for one pass over ``pending``: the PENDING
    sessions of ``group`` that the pass holds (schedule_pass locks them).

    Sessions and agents that cannot be used are left out and named in
    ``rejects`` (when given) with the reason to record on them.
    """
    rejects = rejects if rejects is not None else Rejects()
    group_names = dict(ResourceGroup.objects.values_list("pk", "name"))
    slots = _SlotsCache()
    # Kernels and dependencies are read by a join on the group's pending
    # sessions rather than by a list of thousands of ids: the same rows, or a
    # few more (sessions that arrived since or that another transaction holds),
    # which nothing below looks up.
    in_queue = Q(session__resource_group=group, session__status=Status.PENDING)
    kernels_by_session: dict[Any, list[policy.KernelRequest]] = defaultdict(list)
    bad_kernels: dict[Any, str] = {}
    for kernel_id, session_id, hostname, requested in (
        Kernel.objects.filter(in_queue)
        .order_by("local_rank")
        .values_list("pk", "session_id", "cluster_hostname", _as_text("requested_slots"))
    ):
        asked = slots(requested)
        if isinstance(asked, str):
            bad_kernels.setdefault(
                session_id, f"cannot be scheduled: kernel {hostname} asks for {asked}"
            )
        else:
            kernels_by_session[session_id].append(policy.KernelRequest(str(kernel_id), asked))

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

    schedulable: list[Session] = []
    for s in pending:
        has_kernels = s.pk in kernels_by_session
        why = bad_kernels.get(s.pk) or _session_refusal(s, has_kernels=has_kernels, now=now)
        if why is not None:
            rejects.sessions[str(s.pk)] = why
        elif has_kernels:
            schedulable.append(s)
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
            pinned_agents=_pinned(s.designated_agents),
        )
        for s in schedulable
    )

    agents = list(
        Agent.objects.filter(
            resource_group=group, status=AgentStatus.ALIVE, schedulable=True
        ).values_list("pk", _as_text("capacity_slots"))
    )
    unreadable: dict[str, str] = {}
    occupied = agent_occupancy(agent_ids=[pk for pk, _ in agents], unreadable=unreadable)
    agent_states = []
    for pk, capacity in agents:
        has = slots(capacity)
        if isinstance(has, str):
            rejects.agents[pk] = f"{AGENT_REJECTED} its capacity has {has}"
        elif pk in unreadable:
            rejects.agents[pk] = (
                f"{AGENT_REJECTED} a kernel it runs holds {unreadable[pk]}, "
                "so what is free there is not known"
            )
        else:
            agent_states.append(
                policy.AgentState(
                    agent_id=pk,
                    capacity=has,
                    occupied=policy.ResourceSlots.from_mapping(occupied.get(pk, {})),
                )
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
            agent_selector=agent_selector_for(group=group),
        ),
        now=now,
        pending=pending_states,
        agents=tuple(agent_states),
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
