"""The Serving pages. They are drawn from the REST API by static/js/serving.js
and static/js/endpoint.js; whether the user may see an endpoint is the API's to say."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path


@login_required
def endpoint_list(request: HttpRequest) -> HttpResponse:
    return render(request, "serving/list.html")


@login_required
def endpoint_detail(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    return render(
        request,
        "serving/detail.html",
        {"endpoint_id": endpoint_id, "apps_origin": settings.BAI_APPS_ORIGIN},
    )


urlpatterns = [
    path("", endpoint_list, name="serving-list"),
    path("<uuid:endpoint_id>/", endpoint_detail, name="serving-detail"),
]
