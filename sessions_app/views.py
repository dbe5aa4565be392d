"""HTML pages. Thin: authorise, select, render; data reaches the page's JS
module through ``json_script`` and live updates through the websockets."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from . import selectors, tokens
from .api import SessionDetailSerializer
from .errors import NotFound
from .models import Session

MAX_ROWS = 200


def session_row(session: Session) -> dict[str, Any]:
    """What the sessions table shows of one session (kernels prefetched)."""
    return {
        "id": str(session.pk),
        "name": session.name,
        "owner": session.owner.username,
        "type": session.session_type,
        "status": session.status,
        "status_reason": session.status_reason,
        "result": session.result,
        "cluster_mode": session.cluster_mode,
        "cluster_size": session.cluster_size,
        "resources": session.requested_slots,
        "image": session.image.reference,
        "resource_group": session.resource_group.name,
        "created_at": session.created_at.isoformat(),
        "started_at": session.started_at.isoformat() if session.started_at else None,
        "terminated_at": session.terminated_at.isoformat() if session.terminated_at else None,
        "kernels": [
            {"hostname": k.cluster_hostname, "status": k.status, "role": k.cluster_role}
            for k in session.kernels.all()
        ],
    }


def _list_page(request: HttpRequest, *, open_launch: bool) -> HttpResponse:
    show_all = request.user.is_staff and request.GET.get("all") in ("1", "true")
    sessions = selectors.sessions_for_user(user=request.user, include_all=show_all)[:MAX_ROWS]
    return render(
        request,
        "sessions/list.html",
        {
            "rows": [session_row(s) for s in sessions],
            "page": {"openLaunch": open_launch, "showAll": show_all, "user": request.user.username},
            "show_all": show_all,
        },
    )


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request, open_launch=False)


@login_required
def session_new(request: HttpRequest) -> HttpResponse:
    """The list with the launch dialog open (a link anyone can bookmark)."""
    return _list_page(request, open_launch=True)


def _session_or_404(request: HttpRequest, session_id: str) -> Session:
    try:
        return selectors.get_session_for_user(user=request.user, session_id=session_id)
    except NotFound:
        raise Http404("No such session.") from None


@login_required
def session_detail(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _session_or_404(request, session_id)
    return render(
        request,
        "sessions/detail.html",
        {"session": session, "data": SessionDetailSerializer(session).data},
    )


@login_required
def session_terminal(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _session_or_404(request, session_id)
    return render(
        request,
        "sessions/terminal.html",
        {
            "session": session,
            "data": {"id": str(session.pk), "name": session.name, "status": session.status},
        },
    )


def _duration(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


def _profile_page(request: HttpRequest, **extra: Any) -> HttpResponse:
    now = timezone.now()
    rows = [
        {
            "id": token.pk,
            "prefix": tokens.token_prefix(token),
            "created": token.created,
            "expiry": token.expiry,
            "expired": tokens.token_is_expired(token, now),
        }
        for token in tokens.tokens_for_user(user=request.user)
    ]
    context = {"tokens": rows, "ttl": _duration(settings.BAI_TOKEN_TTL), **extra}
    return render(request, "profile.html", context)


@login_required
def profile(request: HttpRequest) -> HttpResponse:
    """The user's own page: their API tokens (by prefix), each with a Revoke button."""
    revoked = request.GET.get("revoked", "")[: tokens.PREFIX_LENGTH]
    return _profile_page(request, revoked=revoked if revoked.isalnum() else "")


@login_required
@require_POST
def profile_token_create(request: HttpRequest) -> HttpResponse:
    # Rendered, not redirected: the token's plain text must not wait in a session or cookie.
    _, key = tokens.token_create(user=request.user)
    return _profile_page(request, new_token=key)


@login_required
@require_POST
def profile_token_revoke(request: HttpRequest, token_id: str) -> HttpResponse:
    token = tokens.tokens_for_user(user=request.user).filter(pk=token_id).first()
    if token is None or not tokens.token_revoke(user=request.user, token_id=token_id):
        raise Http404("No such token.")
    return redirect(f"{reverse('profile')}?revoked={tokens.token_prefix(token)}")
