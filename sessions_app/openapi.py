"""The API's OpenAPI document: every status code an operation can answer is
listed, each error with the one shape the exception handler renders
(``errors.exception_handler``: ``{"message", "extra"}``).

The codes every view shares follow from how the view is built, so a new view
is documented without a word: 401 when it authenticates, 403 when it has a
permission to check, 404 when its path names an object, 400 when it reads a
body or query parameters, 413 and 415 when it reads a body, 429 when it is
throttled. Codes of a view's own (409 for a name in use, 403 for a quota) are
listed on the view with ``errors(...)``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny

DESCRIPTIONS = {
    400: "Invalid input: `message` names the first bad field, `extra.fields` all of them.",
    401: "Not logged in, or a wrong token.",
    403: "Not allowed to this user (an admin's operation, a quota, a shared object).",
    404: "No such object, or not one this user may see.",
    409: "In conflict with the current state (a name in use, an object in use or ended).",
    413: "The request body is larger than the server accepts.",
    415: "The request body is not in a format the API reads (use JSON).",
    429: "Too many requests: wait and try again.",
    504: "The session's agent did not answer in time.",
}
BODY_METHODS = ("POST", "PUT", "PATCH")


class ErrorSerializer(serializers.Serializer):
    """Every error the API answers."""

    message = serializers.CharField(help_text="What went wrong, in a sentence.")
    extra = serializers.DictField(
        help_text="Details: `fields` maps each bad field to its messages.",
    )

    class Meta:
        ref_name = "Error"


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error responses for ``extend_schema(responses=...)``."""
    return {
        code: OpenApiResponse(ErrorSerializer, description=DESCRIPTIONS[code]) for code in codes
    }


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's schema, with the error codes each operation can answer.

    Bodies are documented as JSON only: that is the API. (DRF's form parsers
    stay for its browsable pages; daphne itself answers a malformed multipart
    body with a bare 400 before any view runs.) An input that refuses unknown
    fields (``refuses_unknown_fields``) is documented as closed.
    """

    def map_parsers(self) -> list[str]:
        media_types: list[str] = super().map_parsers()
        return [m for m in media_types if m == "application/json"] or media_types

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        for code, response in errors(*self._error_codes()).items():
            responses.setdefault(
                str(code), self._get_response_for_code(response, str(code), direction=direction)
            )
        return dict(sorted(responses.items()))

    def _error_codes(self) -> list[int]:
        view = self.view
        codes = []
        reads_body = self.method in BODY_METHODS
        reads_query = any(p.get("in") == "query" for p in self._get_parameters())
        if reads_body or reads_query:
            codes.append(400)
        if view.get_authenticators():
            codes.append(401)  # a wrong token is refused, even where no login is needed
        if any(not isinstance(p, AllowAny) for p in view.get_permissions()):
            codes += [401, 403]
        if "{" in self.path:
            codes.append(404)
        if reads_body:
            codes += [413, 415]
        if view.get_throttles():
            codes.append(429)
        return sorted(set(codes))
