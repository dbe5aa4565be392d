"""Refuse oversized or too deeply nested bodies before anything reads them."""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from io import BytesIO
from itertools import accumulate

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from backendai_web.serve import code_run_limit

# The one endpoint whose bodies may be larger than BAI_MAX_BODY_BYTES: code of up
# to BAI_EXEC_MAX_CODE bytes (``backendai_web.serve.code_run_limit``).
_EXECUTE_PATH = re.compile(r"/api/v1/sessions/[^/]+/execute/")
# A file upload: its body is streamed to disk, never read into memory, and bounded
# by the view (the owner's storage quota, ``api.MAX_UPLOAD_BYTES``).
_UPLOAD_PATH = re.compile(r"/api/v1/folders/[0-9]+/files/content/")


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit and _EXECUTE_PATH.fullmatch(request.path):
            limit = max(limit, code_run_limit())
            if length <= limit:
                _read_body(request)
        if request.method == "PUT" and _UPLOAD_PATH.fullmatch(request.path):
            return self.get_response(request)
        if limit is not None and length > limit and request.path.startswith("/api/"):
            return JsonResponse(
                {
                    "message": f"The request body is {length} bytes; the limit is {limit} bytes.",
                    "extra": {"limit": limit},
                },
                status=413,
            )
        return self.get_response(request)


def _read_body(request: HttpRequest) -> None:
    """Read a body that this path allows but Django's own check of ``request.body``
    (against the site's general limit) would refuse, as ``request.body`` does."""
    body = request.read()
    request._body = body  # type: ignore[attr-defined]
    request._stream = BytesIO(body)  # type: ignore[attr-defined]


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Opening brackets become +1, closing ones -1 (as signed bytes); the rest goes.
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_nesting_depth(body: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, brackets inside
    strings not counted. Linear in the size and never recursive: Python's own
    parser recurses once per level and a body 100,000 levels deep crashes it."""
    steps = _JSON_STRING.sub(b"", body).translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(accumulate(array("b", steps)), default=0)


class JsonDepthLimitMiddleware:
    """A JSON body nested deeper than ``BAI_MAX_JSON_DEPTH`` gets 400 before
    any view parses it (the body is already bounded by the size limit)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.BAI_MAX_JSON_DEPTH
        uploading = request.method == "PUT" and _UPLOAD_PATH.fullmatch(request.path)
        if (
            request.content_type.endswith("json")
            and request.method not in ("GET", "HEAD")
            and not uploading
        ):
            body = request.body
            # Fewer brackets than the limit cannot nest deeper: the common case costs two counts.
            if body.count(b"[") + body.count(b"{") > limit and json_nesting_depth(body) > limit:
                return JsonResponse(
                    {
                        "message": f"The JSON body is nested deeper than {limit} levels.",
                        "extra": {"limit": limit},
                    },
                    status=400,
                )
        return self.get_response(request)


class NulQueryMiddleware:
    """A NUL anywhere in the query string gets 400 before any view reads it: no
    database stores one in text (PostgreSQL refuses it), and no path on disk
    holds one. Bodies are checked field by field by their serializers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return _nul_refused(request, key.replace("\x00", "\\x00"))
        return self.get_response(request)


def _nul_refused(request: HttpRequest, name: str) -> HttpResponse:
    problem = "must not contain a NUL character"
    message = f"{name}: a query parameter {problem}"
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"message": message, "extra": {"fields": {name: [problem]}}}, status=400
        )
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
