"""API tokens expire, and their owner (the profile page) or an admin revokes them.

Personas (tests/conftest.py): ``alice`` owns tokens and manages them on her
profile; ``bob`` is another user and may not touch hers; ``admin`` revokes
anyone's in the admin.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from sessions_app.tokens import PREFIX_LENGTH, token_candidates, token_create, user_for_token

pytestmark = pytest.mark.django_db


def _sessions_with(key: str):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/v1/sessions/")


def test_a_token_says_when_it_expires(alice, settings):
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pass-123"}, format="json"
    )

    expires_at = dt.datetime.fromisoformat(response.json()["expires_at"])
    expected = timezone.now() + dt.timedelta(seconds=settings.BAI_TOKEN_TTL)
    assert abs((expires_at - expected).total_seconds()) < 5
    assert settings.BAI_TOKEN_TTL == 7 * 24 * 3600


def test_a_token_works_until_it_expires_then_says_it_expired(alice, settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": dt.timedelta(hours=1)}
    token, key = token_create(user=alice)

    with time_machine.travel(timezone.now() + dt.timedelta(minutes=59)):
        assert _sessions_with(key).status_code == 200
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=61)):
        response = _sessions_with(key)
        again = _sessions_with(key)

    assert response.status_code == 401
    assert response.json()["message"] == (
        f"The token expired at {token.expiry.isoformat()}; "
        "ask for a new one: POST /api/v1/auth/token/."
    )
    assert again.json() == response.json()  # still says so, not "invalid"


def test_an_expired_token_opens_no_websocket(alice):
    _, key = token_create(user=alice)
    assert user_for_token(key) == alice
    with time_machine.travel(timezone.now() + dt.timedelta(days=8)):
        assert user_for_token(key) is None


def test_a_new_token_clears_the_users_expired_ones(alice):
    token_create(user=alice)
    with time_machine.travel(timezone.now() + dt.timedelta(days=8)):
        fresh, _ = token_create(user=alice)
    assert list(AuthToken.objects.filter(user=alice)) == [fresh]


# --- the profile page ---------------------------------------------------------------------------


def test_the_profile_lists_the_users_tokens_by_prefix_only(client, alice, bob):
    _, mine = token_create(user=alice)
    _, theirs = token_create(user=bob)
    client.force_login(alice)

    page = client.get("/profile/").content.decode()

    assert mine[:PREFIX_LENGTH] in page
    assert mine not in page and mine[: PREFIX_LENGTH + 1] not in page
    assert theirs[:PREFIX_LENGTH] not in page
    assert "Revoke" in page


def test_the_profile_is_linked_from_the_navigation(client, alice):
    client.force_login(alice)
    assert 'href="/profile/"' in client.get("/").content.decode()


def test_the_profile_needs_a_login(client):
    response = client.get("/profile/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_token_revoked_on_the_profile_stops_working(client, alice):
    token, key = token_create(user=alice)
    client.force_login(alice)

    response = client.post(f"/profile/tokens/{token.pk}/revoke/")

    assert response.status_code == 302
    assert response["Location"] == f"/profile/?revoked={key[:PREFIX_LENGTH]}"
    assert (
        f"{key[:PREFIX_LENGTH]}…</code> revoked"
        in client.get(response["Location"]).content.decode()
    )
    refused = _sessions_with(key)
    assert refused.status_code == 401
    assert refused.json()["message"] == "Invalid token."


def test_another_user_cannot_revoke_a_token(client, alice, bob):
    token, key = token_create(user=alice)
    client.force_login(bob)

    assert client.post(f"/profile/tokens/{token.pk}/revoke/").status_code == 404
    assert _sessions_with(key).status_code == 200


def test_revoking_takes_a_post(client, alice):
    token, _ = token_create(user=alice)
    client.force_login(alice)
    assert client.get(f"/profile/tokens/{token.pk}/revoke/").status_code == 405
    assert AuthToken.objects.filter(pk=token.pk).exists()


def test_a_token_made_on_the_profile_is_shown_once_and_works(client, alice):
    client.force_login(alice)

    response = client.post("/profile/tokens/")

    key = response.context["new_token"]
    assert response.status_code == 200
    assert key in response.content.decode()
    assert _sessions_with(key).status_code == 200
    assert key not in client.get("/profile/").content.decode()


# --- admin --------------------------------------------------------------------------------------


def test_an_admin_revokes_anyones_tokens(client, admin, alice, bob):
    doomed, doomed_key = token_create(user=alice)
    kept, kept_key = token_create(user=bob)
    client.force_login(admin)

    listing = client.get("/admin/knox/authtoken/").content.decode()
    response = client.post(
        "/admin/knox/authtoken/",
        {"action": "revoke_tokens", "_selected_action": [doomed.pk]},
        follow=True,
    )

    assert f"{doomed_key[:PREFIX_LENGTH]}…" in listing and doomed_key not in listing
    assert "Revoked 1 token(s)." in response.content.decode()
    assert _sessions_with(doomed_key).status_code == 401
    assert _sessions_with(kept_key).status_code == 200


def test_tokens_are_not_made_in_the_admin(client, admin):
    client.force_login(admin)
    assert client.get("/admin/knox/authtoken/add/").status_code == 403


def test_a_tokens_lookup_reads_the_token_and_its_user_as_the_orm_does(alice, bob):
    """The lookup on every request's path is SQL of its own: what it reads must be
    what knox's query would (every field, converted alike), and only that key's."""
    token, key = token_create(user=alice)
    token_create(user=bob)
    prefix = key[: len(token.token_key)]

    (found,) = token_candidates(prefix)
    orm = AuthToken.objects.select_related("user").get(pk=token.pk)

    for field in AuthToken._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(orm, field.attname), field.name
    for field in type(alice)._meta.concrete_fields:
        assert getattr(found.user, field.attname) == getattr(orm.user, field.attname), field.name
    assert found.expiry.tzinfo is not None and found.user == alice
    assert token_candidates("no-such") == []
