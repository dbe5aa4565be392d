"""HTML pages. Thin: authorise, select, render; data reaches the page's JS
module through ``json_script`` and live updates through the websockets."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults

from . import selectors
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


# --- error pages: HTML for people, the API's JSON under /api/ -------------------------


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def _api_error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"message": message, "extra": {}}, status=status)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return _api_error("The request is malformed.", 400)
    return defaults.bad_request(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return _api_error("No such API endpoint or object.", 404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return _api_error("The server could not finish this request; it has been logged.", 500)
    return defaults.server_error(request)
