"""The Serving pages. They are drawn from the REST API by static/js/serving.js
and static/js/endpoint.js; an endpoint the user may not see is not found here either."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from sessions_app.errors import NotFound

from . import selectors


@login_required
def endpoint_list(request: HttpRequest) -> HttpResponse:
    return render(request, "serving/list.html")


@login_required
def endpoint_detail(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    try:
        endpoint = selectors.get_endpoint_for_user(user=request.user, endpoint_id=endpoint_id)
    except NotFound:
        raise Http404("No such endpoint.") from None
    return render(
        request,
        "serving/detail.html",
        {"endpoint_id": str(endpoint.pk), "apps_origin": settings.BAI_APPS_ORIGIN},
    )


urlpatterns = [
    path("", endpoint_list, name="serving-list"),
    path("<uuid:endpoint_id>/", endpoint_detail, name="serving-detail"),
]
