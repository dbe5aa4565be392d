"""Reads: the ownership rule for endpoints, and what the router needs
(``router_view``, ``token_ok``; exact signatures in the serving contract)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from sessions_app.errors import NotFound
from sessions_app.selectors import as_uuid, policy_for_user

from .models import Endpoint, EndpointEvent, EndpointToken, Route, RouteStatus
from .services import hash_token

MAX_HISTORY = 500


def endpoints_for_user(*, user: AbstractBaseUser, include_all: bool = False) -> QuerySet[Endpoint]:
    """A user's own endpoints; admins see everyone's when ``include_all``."""
    qs = Endpoint.objects.select_related(
        "owner", "image", "resource_group", "model_folder", "model_folder__owner"
    ).prefetch_related(Prefetch("routes", queryset=Route.objects.order_by("id")), "rules")
    if include_all and user.is_staff:
        return qs
    return qs.filter(owner=user)


@dataclass(frozen=True)
class EndpointQuota:
    """What a user's policy allows of serving (None: unlimited). Replicas are the user's
    sessions: they count against the session limits like any other session."""

    endpoint_count: int
    max_endpoints: int | None
    max_concurrent_sessions: int | None
    max_pending_sessions: int | None


def endpoint_quota(*, user: AbstractBaseUser) -> EndpointQuota:
    policy = policy_for_user(user=user)
    return EndpointQuota(
        endpoint_count=Endpoint.objects.filter(owner=user).count(),
        max_endpoints=policy.max_endpoints if policy else None,
        max_concurrent_sessions=policy.max_concurrent_sessions if policy else None,
        max_pending_sessions=policy.max_pending_sessions if policy else None,
    )


def get_endpoint_for_user(*, user: AbstractBaseUser, endpoint_id: object) -> Endpoint:
    """The one ownership check: another user's endpoint is simply not found."""
    pk = as_uuid(endpoint_id)
    qs = endpoints_for_user(user=user, include_all=True)
    endpoint = qs.filter(pk=pk).first() if pk else None
    if endpoint is None:
        raise NotFound("No such endpoint.")
    return endpoint


def endpoint_history(*, endpoint: Endpoint) -> list[EndpointEvent]:
    """The newest MAX_HISTORY events, oldest first."""
    newest = list(endpoint.events.order_by("-created_at", "-id")[:MAX_HISTORY])
    return newest[::-1]


# --- for the router ----------------------------------------------------------------------


@dataclass(frozen=True)
class RouteTarget:
    route_id: int
    ratio: float
    session_id: str
    # {"session_id", "kernel_id", "agent_id", "port"}: main1 of the replica session, as
    # proxy_app.access.resolve finds it for an app (the router builds its Target from it).
    target: dict[str, Any]


@dataclass(frozen=True)
class RouterView:
    endpoint_id: str
    owner_id: int
    open_to_public: bool
    status: str
    status_reason: str
    replicas: int
    min_replicas: int
    routes: list[RouteTarget] = field(default_factory=list)


def router_view(name: str) -> RouterView | None:
    """The endpoint the router serves at /serve/<name>/, with its HEALTHY routes only."""
    if not isinstance(name, str) or len(name) > 64 or "\x00" in name:
        return None
    endpoint = Endpoint.objects.filter(name=name).first()
    if endpoint is None:
        return None
    healthy = (
        Route.objects.filter(endpoint=endpoint, status=RouteStatus.HEALTHY, session__isnull=False)
        .select_related("session")
        .prefetch_related("session__kernels")
        .order_by("id")
    )
    routes = []
    for route in healthy:
        main = next((k for k in route.session.kernels.all() if k.cluster_role == "main"), None)
        if main is None or main.agent_id is None:
            continue
        routes.append(
            RouteTarget(
                route_id=route.pk,
                ratio=route.traffic_ratio,
                session_id=str(route.session_id),
                target={
                    "session_id": str(route.session_id),
                    "kernel_id": str(main.pk),
                    "agent_id": main.agent_id,
                    "port": endpoint.port,
                },
            )
        )
    return RouterView(
        endpoint_id=str(endpoint.pk),
        owner_id=endpoint.owner_id,
        open_to_public=endpoint.open_to_public,
        status=endpoint.status,
        status_reason=endpoint.status_reason,
        replicas=endpoint.replicas,
        min_replicas=endpoint.min_replicas,
        routes=routes,
    )


def token_ok(endpoint_id: str, presented: str) -> bool:
    """Whether ``presented`` is an unexpired token of THIS endpoint (a token of
    another endpoint is refused). The digests are compared in constant time."""
    pk = as_uuid(endpoint_id)
    if pk is None or not isinstance(presented, str) or not presented or len(presented) > 256:
        return False
    digest = hash_token(presented)
    candidates = EndpointToken.objects.filter(endpoint_id=pk).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )
    ok = False
    for stored in candidates.values_list("digest", flat=True):
        ok |= hmac.compare_digest(stored, digest)
    return ok
