"""HTML pages. Thin: authorise, select, render."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from . import selectors


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    sessions = selectors.sessions_for_user(user=request.user)[:200]
    return render(request, "sessions/list.html", {"sessions": sessions})
