"""Reads. Every query a user can trigger is scoped to what that user may see."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, Q, QuerySet

from . import slots as slotlib
from .errors import NotFound
from .models import (
    ACTIVE,
    Agent,
    AgentStatus,
    DataFolder,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    Session,
    SessionEvent,
    SessionTemplate,
    Status,
    UserResourcePolicy,
)


def sessions_for_user(*, user: AbstractBaseUser, include_all: bool = False) -> QuerySet[Session]:
    """A user's own sessions; admins see everyone's when ``include_all``."""
    qs = Session.objects.select_related("image", "resource_group", "owner").prefetch_related(
        Prefetch("kernels", queryset=Kernel.objects.select_related("agent").order_by("local_rank"))
    )
    if include_all and user.is_staff:
        return qs
    return qs.filter(owner=user)


def as_uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


def get_session_for_user(*, user: AbstractBaseUser, session_id: object) -> Session:
    """The one ownership check: another user's session is simply not found."""
    pk = as_uuid(session_id)
    qs = Session.objects.select_related("image", "resource_group", "owner")
    if not user.is_staff:
        qs = qs.filter(owner=user)
    session = qs.filter(pk=pk).first() if pk else None
    if session is None:
        raise NotFound("No such session.")
    return session


def get_kernel_for_user(*, user: AbstractBaseUser, session_id: object, kernel_ref: str) -> Kernel:
    """A kernel by id or by hostname (``main1``, ``sub2``) within a visible session."""
    session = get_session_for_user(user=user, session_id=session_id)
    if "\x00" in kernel_ref or len(kernel_ref) > 64:  # never a hostname, and NUL breaks the query
        raise NotFound("No such kernel in this session.")
    lookup = Q(cluster_hostname=kernel_ref)
    pk = as_uuid(kernel_ref)
    if pk is not None:
        lookup |= Q(pk=pk)
    kernel = Kernel.objects.filter(lookup, session=session).select_related("agent").first()
    if kernel is None:
        raise NotFound("No such kernel in this session.")
    return kernel


def session_events(*, session: Session) -> QuerySet[SessionEvent]:
    return (
        SessionEvent.objects.filter(session=session)
        .select_related("kernel")
        .order_by("created_at", "id")
    )


def folders_for_user(*, user: AbstractBaseUser) -> QuerySet[DataFolder]:
    return DataFolder.objects.filter(owner=user)


def templates_for_user(
    *, user: AbstractBaseUser, include_all: bool = False
) -> QuerySet[SessionTemplate]:
    """Own templates plus shared ones (admins' or marked shared); admins see
    everyone's when ``include_all``."""
    if include_all and user.is_staff:
        return SessionTemplate.objects.all()
    return SessionTemplate.objects.filter(Q(owner=user) | Q(is_shared=True) | Q(owner__isnull=True))


def images_for_user(*, user: AbstractBaseUser) -> QuerySet[Image]:
    return Image.objects.filter(is_active=True).prefetch_related("allowed_groups")


def resource_groups_for_user(*, user: AbstractBaseUser) -> QuerySet[ResourceGroup]:
    qs = ResourceGroup.objects.filter(is_active=True)
    policy = policy_for_user(user=user)
    if policy is not None:
        allowed = list(policy.allowed_resource_groups.values_list("pk", flat=True))
        if allowed:
            qs = qs.filter(pk__in=allowed)
    return qs


def policy_for_user(*, user: AbstractBaseUser) -> ResourcePolicy | None:
    assignment = UserResourcePolicy.objects.filter(user=user).select_related("policy").first()
    if assignment is not None:
        return assignment.policy
    return ResourcePolicy.objects.filter(is_default=True).first()


def user_usage(*, user: AbstractBaseUser) -> dict[str, object]:
    """What the user holds now: counts by phase and the slots of placed kernels."""
    sessions = Session.objects.filter(owner=user, status__in=ACTIVE)
    pending = sessions.filter(status=Status.PENDING).count()
    active = sessions.exclude(status=Status.PENDING).count()
    occupied: dict[str, Decimal] = {}
    for requested in Kernel.objects.filter(
        session__owner=user, status__in=ACTIVE - {Status.PENDING}
    ).values_list("requested_slots", flat=True):
        occupied = slotlib.add(occupied, slotlib.from_strings(requested))
    return {"pending_sessions": pending, "active_sessions": active, "occupied_slots": occupied}


def agents_in_group(*, group: ResourceGroup) -> QuerySet[Agent]:
    """Agents that could ever take a kernel of this group (alive or expected back)."""
    return Agent.objects.filter(resource_group=group, schedulable=True).exclude(
        status=AgentStatus.TERMINATED
    )
