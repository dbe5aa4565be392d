"""The product's own confirmation dialog (static/js/dialogs.js) in Chromium, in
place of the browser's confirm(): Terminate on the sessions list and on a
session's page asks in it, Escape or Cancel keeps the session, the red button
ends it. At 1366 px and at 390 px.

Persona: ``alice``, with a session that waits (no agent needed).
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_launch_dialog import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
CONFIRM = 'dialog[data-role="confirm"]'
STATIC_JS = Path(__file__).resolve().parents[2] / "static" / "js"


@pytest.fixture
def waiting(users, images):
    from sessions_app import services

    return services.session_create(
        owner=users["alice"],
        spec={
            "image": "bai-kernel/minimal:1",
            "name": "still-waiting",
            "resources": {"cpu": "1", "mem": "256m"},
        },
    )


def _watch_browser_dialogs(page) -> list[str]:
    seen: list[str] = []

    def on_dialog(dialog):
        seen.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


def test_terminate_on_the_list_asks_in_the_products_dialog(waiting, live_server_url, login, shot):
    from sessions_app.models import Session

    page = login("alice", viewport={"width": 1366, "height": 768})
    browser_dialogs = _watch_browser_dialogs(page)
    row = page.locator(f'tr[data-id="{waiting.pk}"]')
    row.locator('[data-action="terminate"]').click()
    dialog = page.locator(CONFIRM)
    dialog.wait_for()
    assert dialog.locator("h2").inner_text() == "Terminate still-waiting?"
    assert "containers are destroyed" in dialog.inner_text()
    # The safe choice has the focus: Enter right away does not terminate.
    assert page.evaluate("() => document.activeElement.dataset.action") == "cancel"
    shot(page, "terminate-asks-1366")

    page.keyboard.press("Escape")
    dialog.wait_for(state="detached")
    assert page.evaluate("() => document.activeElement.dataset.action") == "terminate"
    row.locator('[data-action="terminate"]').click()
    page.click(f'{CONFIRM} [data-action="cancel"]')
    dialog.wait_for(state="detached")
    page.wait_for_timeout(300)
    assert orm(lambda: Session.objects.get(pk=waiting.pk).status) == "PENDING"

    row.locator('[data-action="terminate"]').click()
    page.click(f'{CONFIRM} [data-action="confirm"]')
    row.wait_for(state="detached")  # ended: out of the "Active" list
    assert orm(lambda: Session.objects.get(pk=waiting.pk).status) in ("TERMINATED", "CANCELLED")
    assert browser_dialogs == []  # never the browser's own
    assert page.js_errors == []


def test_terminate_on_a_sessions_page_asks_in_the_products_dialog_on_a_phone(
    waiting, live_server_url, login, shot
):
    page = login("alice", screenshot=False, viewport={"width": 390, "height": 844})
    browser_dialogs = _watch_browser_dialogs(page)
    page.goto(f"{live_server_url}/sessions/{waiting.pk}/")
    page.wait_for_function("() => window.wsReady === true")
    page.click("#d-terminate")
    dialog = page.locator(CONFIRM)
    dialog.wait_for()
    box = dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390  # whole on a phone
    shot(page, "terminate-asks-390")
    page.click(f'{CONFIRM} [data-action="confirm"]')
    dialog.wait_for(state="detached")
    page.wait_for_function(
        "() => ['TERMINATED', 'CANCELLED', 'TERMINATING'].includes(document.querySelector('#d-badge [data-status]')?.dataset.status)"
    )
    assert browser_dialogs == []
    assert page.js_errors == []


def test_no_page_script_uses_the_browsers_confirm_or_alert():
    """A call (with its message; "confirm()" in a comment is no call)."""
    calls = {
        path.name: re.findall(r"(?<![\w.])(?:window\.)?(confirm|alert)\((?!\))", path.read_text())
        for path in STATIC_JS.glob("*.js")
    }
    assert {name: found for name, found in calls.items() if found} == {}
