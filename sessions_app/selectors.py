"""Reads. Every query a user can trigger is scoped to what that user may see."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, Q, QuerySet

from .errors import NotFound
from .models import (
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


def get_template_for_user(*, user: AbstractBaseUser, template_id: object) -> SessionTemplate:
    """A template the user may read (own and shared ones; admins any), else NotFound."""
    try:
        pk = int(str(template_id))
    except ValueError:
        pk = None
    qs = templates_for_user(user=user, include_all=True).select_related("owner")
    template = qs.filter(pk=pk).first() if pk is not None else None
    if template is None:
        raise NotFound("No such template.")
    return template


def template_can_change(*, user: AbstractBaseUser, template: SessionTemplate) -> bool:
    """Own templates; admins also every other, shared ones included."""
    return template.owner_id == user.pk or bool(user.is_staff)


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


def agents_in_group(*, group: ResourceGroup) -> QuerySet[Agent]:
    """Agents that could ever take a kernel of this group (alive or expected back)."""
    return Agent.objects.filter(resource_group=group, schedulable=True).exclude(
        status=AgentStatus.TERMINATED
    )
