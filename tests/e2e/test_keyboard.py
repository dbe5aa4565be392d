"""A session launched with the keyboard alone (Tab, Shift+Tab, Enter, arrow
keys, Escape and typing), against a real agent: the launch dialog keeps focus
inside while open, shows where focus is, and gives it back when it closes.

Persona: ``alice``, a plain user with an empty sessions list.
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

IN_DIALOG = "() => document.getElementById('launch-modal').contains(document.activeElement)"


def _focused(page, selector: str) -> bool:
    return page.evaluate(f"() => document.activeElement.matches({json.dumps(selector)})")


def _tab_to(page, selector: str, *, in_dialog: bool = True, limit: int = 40) -> None:
    """Press Tab until ``selector`` has focus; inside the dialog, focus never leaves it."""
    for _ in range(limit):
        if _focused(page, selector):
            return
        page.keyboard.press("Tab")
        if in_dialog:
            assert page.evaluate(IN_DIALOG), page.evaluate("document.activeElement.outerHTML")
    raise AssertionError(f"Tab never reached {selector}")


def _arrow_to(page, selector: str, value: str) -> None:
    """Arrow keys on a focused select until it holds ``value``."""
    for key in ["ArrowDown"] * 8 + ["ArrowUp"] * 16:
        if page.eval_on_selector(selector, "el => el.value") == value:
            return
        page.keyboard.press(key)
    raise AssertionError(f"{selector} never reached {value}")


def _ring(page) -> str:
    return page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")


def test_a_user_launches_a_session_with_the_keyboard_alone(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice")

    # The first Tab offers to skip the navigation.
    page.keyboard.press("Tab")
    assert _focused(page, ".skip-link")
    _tab_to(page, "#launch-open", in_dialog=False)
    assert _ring(page) != "none"
    shot(page, "launch-button-focused")

    page.keyboard.press("Enter")
    page.wait_for_function("() => window.launchReady === true")
    assert page.evaluate(IN_DIALOG)

    _tab_to(page, "#f-name")
    page.keyboard.type("by-keys")
    _tab_to(page, "#f-image")
    _arrow_to(page, "#f-image", "bai-kernel/minimal:1")
    # The session type is a radio group: arrows move the choice.
    _tab_to(page, "input[name=type]:checked")
    page.keyboard.press("ArrowRight")
    assert page.is_checked("input[name=type][value=batch]") and page.is_visible("#startup-field")
    page.keyboard.press("ArrowLeft")
    assert page.is_checked("input[name=type][value=interactive]")
    assert not page.is_visible("#startup-field")
    # Tabbing into a field selects what it holds: typing replaces it.
    _tab_to(page, "#f-cpu")
    page.keyboard.type("0.5")
    _tab_to(page, "#f-mem")
    page.keyboard.type("0.25")
    assert page.input_value("#f-cpu") == "0.5" and page.input_value("#f-mem") == "0.25"
    assert page.text_content("#launch-total-value") == "0.5 CPU · 256 MiB"

    # Focus stays in the dialog: past the last control it comes back to the first.
    _tab_to(page, "#launch-submit")
    page.keyboard.press("Tab")
    assert _focused(page, "#launch-modal [data-close]")
    page.keyboard.press("Shift+Tab")
    assert _focused(page, "#launch-submit")
    assert _ring(page) != "none"
    shot(page, "launch-submit-focused")

    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => window.launchState && window.launchState.status === 'RUNNING'", timeout=90_000
    )
    # The form (and the button that had focus) made way for the progress: focus followed.
    assert _focused(page, "#launch-title")
    shot(page, "launch-progress-running")

    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.getElementById('launch-modal').open")
    assert _focused(page, "#launch-open")  # back where the user was
    row = page.locator("tr", has_text="by-keys")
    row.locator(".badge.s-RUNNING").wait_for()
    shot(page, "list-after-launch")
