"""HTML pages. Thin: authorise, select, render; data reaches the page's JS
module through ``json_script`` and live updates through the websockets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.views import defaults
from django.views.decorators.http import require_GET, require_POST
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bai_common import units

from . import launch, metrics, selectors, tokens
from .api import SessionDetailSerializer, TemplateSerializer
from .errors import NotFound
from .models import Session, SessionTemplate
from .slots import SlotError, parse_slot_value

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
        "apps": [app.to_dict() for app in selectors.session_apps(session=session)],
    }


def _list_page(request: HttpRequest, *, open_launch: bool) -> HttpResponse:
    show_all = request.user.is_staff and request.GET.get("all") in ("1", "true")
    sessions = selectors.sessions_for_user(user=request.user, include_all=show_all)[:MAX_ROWS]
    return render(
        request,
        "sessions/list.html",
        {
            "rows": [session_row(s) for s in sessions],
            "page": {
                "openLaunch": open_launch,
                "showAll": show_all,
                "user": request.user.username,
                "template": _int_or_none(request.GET.get("template")) if open_launch else None,
            },
            "show_all": show_all,
        },
    )


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request, open_launch=False)


@login_required
def session_new(request: HttpRequest) -> HttpResponse:
    """The list with the launch dialog open (a link anyone can bookmark);
    ``?template=<id>`` opens it filled from that template."""
    return _list_page(request, open_launch=True)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdecimal() and len(value) < 10 else None


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


# --- templates ---------------------------------------------------------------


def slots_text(slots: Mapping[str, Any]) -> str:
    """``2 CPU · 4 GiB · 1 GPU``, as the pages' JS writes slots (``fmtSlots``)."""
    parts = []
    for slot in sorted(slots, key=lambda k: (k != "cpu", k != "mem", k)):
        raw = slots[slot]
        try:
            value = parse_slot_value(slot, raw)
        except SlotError:
            parts.append(f"{raw} {slot}")
            continue
        if slot == "mem":
            parts.append(units.format_size_shown(value))
        elif value or slot == "cpu":
            name = {"cpu": "CPU", "cuda.device": "GPU"}.get(slot, slot)
            parts.append(f"{units.format_decimal(value)} {name}")
    return " · ".join(parts)


def _hosts(count: int) -> str:
    return "sub1" if count == 1 else f"sub1–sub{count}"


def template_row(
    template: SessionTemplate, *, user: Any, catalogue: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the templates table shows of one template: each role's image and
    resources per container as a launch from it would create them."""
    spec = template.spec if isinstance(template.spec, dict) else {}
    roles = spec.get("roles") or {}
    main, sub = roles.get("main") or {}, roles.get("sub") or {}
    size = spec.get("cluster_size") or 1 + int(sub.get("replicas") or 0)
    common = spec.get("resources") or {}
    per_role = [("main1", main.get("image"), {**common, **(main.get("resources") or {})})]
    if size > 1:
        per_role.append(
            (_hosts(size - 1), sub.get("image"), {**common, **(sub.get("resources") or {})})
        )
    uneven = len({repr(r[2]) for r in per_role}) > 1
    images = [(who, image) for who, image, _ in per_role if image]
    return {
        "id": template.pk,
        "name": template.name,
        "description": template.description,
        "type": spec.get("type") or "interactive",
        "image": spec.get("image") or "",
        "role_images": images,
        "cluster_mode": spec.get("cluster_mode") or "single-node",
        "cluster_size": size,
        "resources": (
            [(who, slots_text(slots)) for who, _, slots in per_role]
            if uneven
            else [("", slots_text(per_role[0][2]))]
        ),
        "shared": template.is_shared or template.owner_id is None,
        "owner": template.owner.username if template.owner_id else "",
        "mine": template.owner_id == user.pk,
        "can_change": selectors.template_can_change(user=user, template=template),
        "updated_at": template.updated_at,
        "warnings": launch.template_warnings(spec, catalogue),
    }


@login_required
def template_list(request: HttpRequest) -> HttpResponse:
    """The user's own templates and the shared ones; ``?saved=<id>`` or
    ``?imported=<id>`` names the one just written."""
    templates = selectors.templates_for_user(user=request.user).select_related("owner")
    catalogue = launch.image_catalogue()
    rows = [template_row(t, user=request.user, catalogue=catalogue) for t in templates[:MAX_ROWS]]
    done = None
    for word in ("saved", "imported"):
        pk = _int_or_none(request.GET.get(word))
        hit = next((r for r in rows if r["id"] == pk), None)
        if hit is not None:
            done = {"id": pk, "verb": word.capitalize(), "name": hit["name"]}
    return render(request, "session_templates/list.html", {"rows": rows, "done": done})


def _template_form(
    request: HttpRequest, *, template: dict[str, Any] | None, copy_of: str = ""
) -> HttpResponse:
    data = {
        "template": template,
        "copyOf": copy_of,
        "canShare": request.user.is_staff,
        "images": [
            {"reference": i.reference, "name": i.display_name, "ssh": i.supports_ssh}
            for i in selectors.images_for_user(user=request.user)
        ],
        "groups": [g.name for g in selectors.resource_groups_for_user(user=request.user)],
        "folders": [f.name for f in selectors.folders_for_user(user=request.user)],
    }
    return render(
        request,
        "session_templates/form.html",
        {"template": template, "copy_of": copy_of, "data": data},
    )


def _template_or_404(request: HttpRequest, template_id: object) -> SessionTemplate:
    try:
        return selectors.get_template_for_user(user=request.user, template_id=template_id)
    except NotFound:
        raise Http404("No such template.") from None


@login_required
def template_new(request: HttpRequest) -> HttpResponse:
    """A new template, from scratch or (``?from=<id>``) a copy of one the user may read."""
    source = request.GET.get("from")
    if not source:
        return _template_form(request, template=None)
    original = _template_or_404(request, source)
    copy = {
        "name": f"{original.name}-copy"[:64],
        "description": original.description,
        "spec": original.spec,
    }
    return _template_form(request, template=copy, copy_of=original.name)


@login_required
def template_edit(request: HttpRequest, template_id: int) -> HttpResponse:
    template = _template_or_404(request, template_id)
    if not selectors.template_can_change(user=request.user, template=template):
        # A shared template is the admins' to change: offer the user a copy of it.
        return redirect(f"{reverse('template-new')}?from={template.pk}")
    return _template_form(request, template=TemplateSerializer(template).data)


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


# --- data folders: the pages are drawn from the REST API by static/js/folders.js --------


@login_required
def folder_list(request: HttpRequest) -> HttpResponse:
    """The user's folders and those shared with them: create, share, delete, SFTP."""
    return render(request, "folders/list.html")


@login_required
def folder_browse(request: HttpRequest, folder_id: int) -> HttpResponse:
    """One folder's files: a folder the user may not see does not exist (404), as in the API."""
    try:
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
    except NotFound:
        raise Http404("No such folder.") from None
    return render(request, "folders/browse.html", {"folder_id": access.folder.pk})


# --- error pages: HTML for people, the API's JSON under /api/ -------------------------


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The balancer's health check: this process answers and reaches its database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HttpResponse("ok\n", content_type="text/plain")


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """The icon, for browsers that ask /favicon.ico (pages without an icon link: the API's
    JSON, a downloaded file). Resolved per request: the static manifest may come later."""
    return redirect(static("favicon.svg"), permanent=True)


@require_GET
def metrics_page(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format; closed unless ``metrics.metrics_allowed`` says so."""
    if not metrics.metrics_allowed(request):
        if request.user.is_authenticated or request.headers.get("Authorization"):
            return HttpResponse("Forbidden: admins and the metrics token only.\n", status=403)
        response = HttpResponse("Log in as an admin or send the metrics token.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.ManagerCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


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
