"""Refuse oversized API bodies before anything reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit and request.path.startswith("/api/"):
            return JsonResponse(
                {
                    "message": f"The request body is {length} bytes; the limit is {limit} bytes.",
                    "extra": {"limit": limit},
                },
                status=413,
            )
        return self.get_response(request)
