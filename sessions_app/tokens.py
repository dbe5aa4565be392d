"""API tokens: django-rest-knox's tokens (stored hashed) that expire after
``BAI_TOKEN_TTL`` seconds and that their owner (the profile page) or an admin
revokes. Clients send ``Authorization: Token <token>``, over HTTP and
websockets alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from hmac import compare_digest
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import Field, QuerySet
from django.utils import timezone
from knox.auth import TokenAuthentication
from knox.crypto import hash_token
from knox.models import AuthToken
from knox.settings import CONSTANTS
from rest_framework.exceptions import AuthenticationFailed

# How much of a token the pages show: enough to tell tokens apart, useless to guess one.
PREFIX_LENGTH = 8


def token_create(*, user: AbstractBaseUser) -> tuple[AuthToken, str]:
    """A new token for ``user`` and its plain text, which exists only now.

    The user's expired tokens are dropped on the way: they can never be used again.
    """
    AuthToken.objects.filter(user=user, expiry__lte=timezone.now()).delete()
    return AuthToken.objects.create(user=user)


def tokens_for_user(*, user: AbstractBaseUser) -> QuerySet[AuthToken]:
    return AuthToken.objects.filter(user=user).order_by("-created")


def token_revoke(*, user: AbstractBaseUser, token_id: str) -> bool:
    """Revoke one of ``user``'s tokens (``token_id`` is its digest); False if it has no such token."""
    deleted, _ = AuthToken.objects.filter(user=user, digest=token_id).delete()
    return deleted > 0


def token_prefix(token: AuthToken) -> str:
    return token.token_key[:PREFIX_LENGTH]


def token_is_expired(token: AuthToken, now: Any = None) -> bool:
    return token.expiry is not None and token.expiry <= (now or timezone.now())


class ExpiringTokenAuthentication(TokenAuthentication):
    """knox's check of ``Authorization: Token <token>``, except that an expired
    token is refused as expired (knox deletes it and calls it invalid, which
    leaves a client guessing). Expired tokens stay listed until their owner
    makes a new token or revokes them.

    ``candidates`` reads the tokens of a key (``token_candidates``); a view may
    give one that reads more in the same query (code runs read their session's
    main1 with it: ``execution.MainFactsReader``)."""

    def __init__(self, candidates: Callable[[str], list[AuthToken]] | None = None) -> None:
        super().__init__()
        self.candidates = candidates or token_candidates

    def authenticate_credentials(self, token: bytes) -> tuple[Any, AuthToken]:
        key = token.decode("utf-8", errors="replace")
        digest = hash_token(key)
        for candidate in self.candidates(key[: CONSTANTS.TOKEN_KEY_LENGTH]):
            if not compare_digest(digest, candidate.digest):
                continue
            if token_is_expired(candidate):
                raise AuthenticationFailed(
                    f"The token expired at {candidate.expiry.isoformat()}; "
                    "ask for a new one: POST /api/v1/auth/token/."
                )
            return self.validate_user(candidate)
        raise AuthenticationFailed("Invalid token.")


def token_candidates(token_key: str) -> list[AuthToken]:
    """The tokens whose key (a token's first characters) is ``token_key``, each
    with its user: knox's ``AuthToken.objects.filter(token_key=...)
    .select_related("user")``, in SQL written once per database
    (``candidates_query``), its columns read with the ORM's own converters. It is
    on every API request's path, where building and compiling the query with
    the ORM took longer than the database took to answer it."""
    query = candidates_query(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(query.select, [token_key])
        return [query.read(row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class CandidatesQuery:
    """The pieces of the candidates' SQL (``t`` the token, ``u`` its user), so a
    query that reads more beside the token (``selectors``) is built on them."""

    columns: str
    source: str
    where: str  # one parameter: the token key
    token_fields: tuple[Field, ...]
    user_fields: tuple[Field, ...]

    @functools.cached_property
    def select(self) -> str:
        return f"SELECT {self.columns} FROM {self.source} WHERE {self.where}"

    @property
    def width(self) -> int:
        return len(self.token_fields) + len(self.user_fields)

    def read(self, row: tuple[Any, ...]) -> AuthToken:
        """The token of a row's first ``width`` columns, its user set."""
        split = len(self.token_fields)
        token = AuthToken.from_db(
            connection.alias,
            [f.attname for f in self.token_fields],
            _read(self.token_fields, row[:split]),
        )
        token.user = get_user_model().from_db(
            connection.alias,
            [f.attname for f in self.user_fields],
            _read(self.user_fields, row[split : self.width]),
        )
        return token


@functools.cache
def candidates_query(vendor: str) -> CandidatesQuery:
    q = connection.ops.quote_name
    token_fields = tuple(AuthToken._meta.concrete_fields)
    user_model = get_user_model()
    user_fields = tuple(user_model._meta.concrete_fields)
    columns = [f"t.{q(f.column)}" for f in token_fields] + [f"u.{q(f.column)}" for f in user_fields]
    user_fk = AuthToken._meta.get_field("user")
    return CandidatesQuery(
        columns=", ".join(columns),
        source=(
            f"{q(AuthToken._meta.db_table)} t INNER JOIN {q(user_model._meta.db_table)} u "
            f"ON t.{q(user_fk.column)} = u.{q(user_fk.target_field.column)}"
        ),
        where=f"t.{q(AuthToken._meta.get_field('token_key').column)} = %s",
        token_fields=token_fields,
        user_fields=user_fields,
    )


def _read(fields: tuple[Field, ...], values: tuple[Any, ...]) -> list[Any]:
    """Column values as the ORM reads them (e.g. an aware ``datetime`` from SQLite's text)."""
    out = []
    for field, value in zip(fields, values, strict=True):
        for converter, column in _converters(connection.vendor, field):
            value = converter(value, column, connection)
        out.append(value)
    return out


@functools.cache
def _converters(vendor: str, field: Field) -> list[tuple[Any, Any]]:
    column = field.get_col(field.model._meta.db_table)
    found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
    return [(converter, column) for converter in found]


def user_for_token(key: str) -> Any | None:
    """The active user a valid, unexpired token belongs to, else None."""
    try:
        user, _ = ExpiringTokenAuthentication().authenticate_credentials(key.encode())
    except AuthenticationFailed:
        return None
    return user
