"""API tokens: django-rest-knox's tokens (stored hashed) that expire after
``BAI_TOKEN_TTL`` seconds and that their owner (the profile page) or an admin
revokes. Clients send ``Authorization: Token <token>``, over HTTP and
websockets alike."""

from __future__ import annotations

from hmac import compare_digest
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
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
    makes a new token or revokes them."""

    def authenticate_credentials(self, token: bytes) -> tuple[Any, AuthToken]:
        key = token.decode("utf-8", errors="replace")
        digest = hash_token(key)
        candidates = AuthToken.objects.filter(
            token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH]
        ).select_related("user")
        for candidate in candidates:
            if not compare_digest(digest, candidate.digest):
                continue
            if token_is_expired(candidate):
                raise AuthenticationFailed(
                    f"The token expired at {candidate.expiry.isoformat()}; "
                    "ask for a new one: POST /api/v1/auth/token/."
                )
            return self.validate_user(candidate)
        raise AuthenticationFailed("Invalid token.")


def user_for_token(key: str) -> Any | None:
    """The active user a valid, unexpired token belongs to, else None."""
    try:
        user, _ = ExpiringTokenAuthentication().authenticate_credentials(key.encode())
    except AuthenticationFailed:
        return None
    return user
