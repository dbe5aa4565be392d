"""The checks every e2e test runs (``checks.py``) catch what they are for: a
request to another host, and a serious accessibility violation.

Persona: ``alice`` (a plain user) on her own empty sessions list.
"""

from __future__ import annotations

import pytest

from tests.e2e.checks import assert_accessible

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_request_to_another_host_is_caught_and_the_own_origin_is_not(
    users, login, own_origin_guard
):
    page = login("alice")
    page.goto(page.url)  # pages, scripts, styles and websockets of our own
    page.wait_for_function("() => window.wsReady === true")
    assert own_origin_guard.foreign == []

    # Our pages' policy would stop these before they leave, so they come from a
    # page without one, in the same watched context. Port 9 on another loopback
    # address: nothing answers, nothing leaves the machine.
    probe = page.context.new_page()
    probe.set_content(
        "<img src='http://127.0.0.2:9/pixel.png'>"
        "<script>new WebSocket('ws://127.0.0.2:9/socket')</script>"
    )
    probe.wait_for_function("() => document.images[0].complete")
    with pytest.raises(AssertionError, match="outside the project's own origin") as caught:
        own_origin_guard.assert_clean()
    assert "http://127.0.0.2:9/pixel.png" in str(caught.value)
    assert "ws://127.0.0.2:9/socket" in str(caught.value)
    # Seen and asserted on: the check after the test has nothing more to report.
    own_origin_guard.foreign.clear()


def test_the_accessibility_check_fails_on_a_serious_violation(users, login, shot):
    page = login("alice")
    assert_accessible(page)
    page.evaluate(
        "() => document.querySelector('.page-actions')"
        ".append(Object.assign(document.createElement('button'), {id: 'nameless'}))"
    )
    with pytest.raises(AssertionError, match="critical button-name") as caught:
        shot(page, "a-button-without-a-name")
    assert "#nameless" in str(caught.value)
