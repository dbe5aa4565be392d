"""Views for the handler's tests: each notes, in ``LOG``, its thread and when its
work after the response ran (the tests' ``send`` notes what went out, in turn)."""

from __future__ import annotations

import threading
import time

from django.http import HttpResponse
from django.urls import path

from backendai_web.handler import after_response

LOG: list[tuple[str, object]] = []


def _note(what: str) -> None:
    LOG.append((what, threading.get_ident()))


def answer(request):  # noqa: ANN001, ANN201
    _note("view")
    after_response(lambda: _note("after"))
    return HttpResponse("ok")


def slow(request):  # noqa: ANN001, ANN201
    time.sleep(0.3)  # the client leaves meanwhile
    _note("view")
    after_response(lambda: _note("after"))
    return HttpResponse("late")


def failing(request):  # noqa: ANN001, ANN201
    def broken() -> None:
        raise RuntimeError("the work after failed")

    after_response(broken)
    after_response(lambda: _note("after"))
    return HttpResponse("ok")


urlpatterns = [path("answer/", answer), path("slow/", slow), path("failing/", failing)]
