"""Failed logins meet resistance: the login pages lock a user name out for one
client address (django-axes), the token endpoint refuses with 429 (a DRF
throttle); both say when to try again, and other clients are not affected.

Personas (tests/conftest.py): ``alice`` is the user under attack; the attacker
is a client at 127.0.0.1, alice's own browser is at 10.0.0.2; ``admin`` may
unlock her.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from axes.models import AccessAttempt
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

ATTACKER = "127.0.0.1"
ALICE_AT_HOME = "10.0.0.2"
RIGHT = {"username": "alice", "password": "alice-pass-123"}
WRONG = {"username": "alice", "password": "not-her-password"}


@pytest.fixture(autouse=True)
def _limits(settings):
    """The documented defaults, whatever the environment says."""
    settings.BAI_LOGIN_FAILURE_LIMIT = settings.AXES_FAILURE_LIMIT = 5
    settings.BAI_LOGIN_COOLOFF = 300
    settings.AXES_COOLOFF_TIME = dt.timedelta(seconds=300)


# --- the login pages (django-axes) --------------------------------------------------------------


def _log_in(path: str, credentials: dict, address: str = ATTACKER):
    return Client(REMOTE_ADDR=address).post(path, credentials)


def test_fifty_wrong_passwords_on_the_login_page_lock_that_name_out(alice):
    statuses = [_log_in("/login/", WRONG).status_code for _ in range(50)]

    # The first four get the form back with its error; the fifth failure locks.
    assert statuses[:4] == [200] * 4
    assert set(statuses[4:]) == {429}
    assert _log_in("/login/", RIGHT).status_code == 429


def test_the_lockout_page_says_when_it_ends(alice):
    for _ in range(5):
        response = _log_in("/login/", WRONG)

    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins" in page and "Try again at" in page
    assert 295 <= int(response["Retry-After"]) <= 300
    attempt = AccessAttempt.objects.get(username="alice")
    resets_at = (attempt.attempt_time + dt.timedelta(seconds=300)).isoformat()
    assert f'data-resets-at="{resets_at}"' in page


def test_the_right_password_from_another_client_still_logs_in(alice):
    for _ in range(10):
        _log_in("/login/", WRONG)

    response = _log_in("/login/", RIGHT, address=ALICE_AT_HOME)

    assert response.status_code == 302
    assert response["Location"] == "/"


def test_the_lockout_ends_after_the_cool_off(alice):
    for _ in range(5):
        _log_in("/login/", WRONG)

    with time_machine.travel(timezone.now() + dt.timedelta(seconds=301)):
        assert _log_in("/login/", RIGHT).status_code == 302


def test_the_admin_login_is_guarded_the_same_way(admin):
    wrong = {"username": "root", "password": "wrong", "next": "/admin/"}
    statuses = [_log_in("/admin/login/", wrong).status_code for _ in range(6)]
    assert statuses[-2:] == [429, 429]


def test_an_admin_unlocks_a_locked_out_user_in_the_admin(alice, admin):
    for _ in range(5):
        _log_in("/login/", WRONG)
    attempt = AccessAttempt.objects.get(username="alice")
    staff = Client(REMOTE_ADDR=ALICE_AT_HOME)
    staff.force_login(admin)

    response = staff.post(
        "/admin/axes/accessattempt/",
        {"action": "delete_selected", "_selected_action": [attempt.pk], "post": "yes"},
    )

    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()
    assert _log_in("/login/", RIGHT).status_code == 302


# --- the token endpoint (a DRF throttle) --------------------------------------------------------


def _token(credentials: dict, address: str = ATTACKER):
    return APIClient(REMOTE_ADDR=address).post("/api/v1/auth/token/", credentials, format="json")


def test_fifty_wrong_passwords_on_the_token_endpoint_get_429_with_a_reset_time(alice):
    responses = [_token(WRONG) for _ in range(50)]

    assert [r.status_code for r in responses[:5]] == [400] * 5
    assert {r.status_code for r in responses[5:]} == {429}
    last = responses[-1]
    body = last.json()
    wait = body["extra"]["retry_after"]
    assert 295 <= wait <= 300
    assert body["message"] == f"Too many failed logins: try again in {wait} s."
    assert last["Retry-After"] == str(wait)


def test_while_refused_even_the_right_password_gets_429(alice):
    for _ in range(5):
        _token(WRONG)
    assert _token(RIGHT).status_code == 429


def test_the_right_password_from_another_client_still_gets_a_token(alice):
    for _ in range(50):
        _token(WRONG)

    response = _token(RIGHT, address=ALICE_AT_HOME)

    assert response.status_code == 200
    assert response.json()["token"]


def test_the_token_endpoint_accepts_again_after_the_cool_off(alice):
    for _ in range(5):
        _token(WRONG)

    with time_machine.travel(timezone.now() + dt.timedelta(seconds=301)):
        assert _token(RIGHT).status_code == 200


def test_a_right_password_clears_the_count_of_earlier_failures(alice):
    for _ in range(4):
        _token(WRONG)
    assert _token(RIGHT).status_code == 200
    assert [_token(WRONG).status_code for _ in range(4)] == [400] * 4


def test_one_address_guessing_many_user_names_is_refused_for_all(alice):
    for n in range(50):
        assert _token({"username": f"user{n}", "password": "guess"}).status_code == 400

    assert _token(RIGHT).status_code == 429
    assert _token(RIGHT, address=ALICE_AT_HOME).status_code == 200


def test_token_failures_are_left_to_the_throttle_not_counted_by_axes(alice):
    for _ in range(5):
        _token(WRONG)
    assert not AccessAttempt.objects.exists()
    assert _log_in("/login/", RIGHT).status_code == 302
