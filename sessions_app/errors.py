"""One error family for the whole app, rendered by one DRF exception handler
as ``{"message": str, "extra": {...}}`` (``extra.fields`` holds per-field
messages for validation errors)."""

from __future__ import annotations

import math
import re
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.views.debug import SafeExceptionReporterFilter
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class ApplicationError(Exception):
    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra or {}


class InvalidInput(ApplicationError):
    """Bad input: ``fields`` maps a field name to its messages."""

    def __init__(self, message: str, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message, {"fields": fields or {}})
        self.fields = fields or {}


class QuotaExceeded(ApplicationError):
    status_code = status.HTTP_403_FORBIDDEN


class PendingLimitReached(QuotaExceeded):
    """The owner's limit of pending sessions: a launch that may pass once one of theirs starts."""


class Forbidden(ApplicationError):
    """Allowed to others (admins), not to this user."""

    status_code = status.HTTP_403_FORBIDDEN


class PayloadTooLarge(ApplicationError):
    """A body past a limit (an upload past the storage quota): the message gives the figures."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class Conflict(ApplicationError):
    status_code = status.HTTP_409_CONFLICT


class NotFound(ApplicationError):
    status_code = status.HTTP_404_NOT_FOUND


class AgentTimeout(ApplicationError):
    """The agent that should answer did not, in time (or went away first)."""

    status_code = status.HTTP_504_GATEWAY_TIMEOUT


class TooManyRequests(ApplicationError):
    """Refused for now: ``extra.retry_after`` (and the Retry-After header) says for how long."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, {"retry_after": retry_after})
        self.retry_after = retry_after


def field_error(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", {field: [message]})


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.update(_flatten(value, name))
    elif isinstance(detail, list):
        if all(not isinstance(v, (dict, list)) for v in detail):
            out[prefix or "non_field_errors"] = [str(v) for v in detail]
        else:
            for i, value in enumerate(detail):
                out.update(_flatten(value, f"{prefix}[{i}]"))
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def _printable(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD: an error may echo
    what the client sent (an unknown field's name), and a lone surrogate
    cannot be encoded as UTF-8 on its way out."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
        return value
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _error_response(exc, context)
    if response is not None:
        response.data = _printable(response.data)
    return response


def _error_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        headers = (
            {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooManyRequests) else None
        )
        return Response(
            {"message": exc.message, "extra": exc.extra}, status=exc.status_code, headers=headers
        )
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        fields = _flatten(exc.detail)
        first = next(iter(fields.items()), ("input", ["invalid"]))
        message = f"{first[0]}: {first[1][0]}" if first[0] != "non_field_errors" else first[1][0]
        response.data = {"message": message, "extra": {"fields": fields}}
    elif isinstance(exc, drf_exceptions.Throttled) and exc.wait is not None:
        # Retry-After says the same, in a header (DRF sets it from exc.wait).
        response.data = {"message": str(exc.detail), "extra": {"retry_after": math.ceil(exc.wait)}}
    elif isinstance(exc, drf_exceptions.UnsupportedMediaType):
        response.data = {
            "message": f"{exc.detail} The API takes JSON: send Content-Type: application/json.",
            "extra": {},
        }
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"message": str(detail), "extra": {}}
    return response


class SettingsReporterFilter(SafeExceptionReporterFilter):
    """Django's filter of what error reports show, which also hides the URLs
    that carry passwords (database, Redis, broker) and the hosts and
    locations built from them: debug pages (BAI_DEBUG=1) never show them."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|_URL$|^hosts$|^LOCATION$",
        flags=re.IGNORECASE,
    )
