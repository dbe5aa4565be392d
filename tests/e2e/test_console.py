"""The code console of a session's detail page, in Chromium against a real agent:
code runs in main1's Python kernel with its state kept between runs, an input()
prompt is answered in the page, a PNG shows inline, Interrupt stops an endless
loop, and the run history lists each run.

Persona: ``alice`` with one running session of the Python image; ``bob`` gets none
of it. Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# A 2x2 red PNG, made in the kernel from its bytes (the image has no PIL).
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg=="


def _run(page, code):
    """Type ``code`` into the console, run it with Shift+Enter, wait for its end."""
    ends = page.locator("#c-output [data-kind=end]").count()
    page.locator("#c-code").fill(code)
    page.locator("#c-code").press("Shift+Enter")
    page.wait_for_function(
        f"() => document.querySelectorAll('#c-output [data-kind=end]').length > {ends}"
    )


def _console(login, live_server_url, session, user="alice"):
    page = login(user, screenshot=False)
    page.goto(f"{live_server_url}/sessions/{session.pk}/")
    page.wait_for_function("() => window.consoleReady === true")
    return page


def test_code_runs_in_the_console_with_state_input_images_and_interrupt(
    running_python, login, live_server_url, shot
):
    page = _console(login, live_server_url, running_python)
    _run(page, "x = 41")
    _run(page, "print(x + 1)")
    out = page.locator("#c-output")
    assert out.locator("[data-kind=stdout]").last.inner_text().strip() == "42"

    # input(): the page asks, the answer goes back to the same run.
    page.locator("#c-code").fill("name = input('Your name? ')\nprint('hello', name)")
    page.locator("#c-code").press("Shift+Enter")
    prompt = page.locator("#c-input")
    prompt.wait_for(state="visible")
    shot(page, "console-asks-for-input")
    prompt.locator("input").fill("alice")
    prompt.locator("input").press("Enter")
    page.wait_for_function(
        "() => document.getElementById('c-output').textContent.includes('hello alice')"
    )

    _run(
        page,
        "import base64\nfrom IPython.display import Image, display\n"
        f"display(Image(data=base64.b64decode('{PNG}')))",
    )
    image = out.locator("img.rec-image").last
    assert image.evaluate("img => img.complete && img.naturalWidth") == 2

    page.locator("#c-code").fill("while True:\n    pass")
    page.locator("#c-code").press("Shift+Enter")
    interrupt = page.locator("#c-interrupt")
    page.wait_for_function("() => !document.getElementById('c-interrupt').disabled")
    interrupt.click()
    page.wait_for_function(
        "() => document.getElementById('c-output').textContent.includes('KeyboardInterrupt')"
    )
    page.wait_for_function("() => document.getElementById('c-run').disabled === false")
    ends = out.locator("[data-kind=end]").all_inner_texts()
    assert len(ends) == len(set(ends)) == 5, ends  # one end line a run, the interrupted one too

    history = page.locator("#c-history tr")
    page.wait_for_function("() => document.querySelectorAll('#c-history tr').length >= 5")
    assert history.first.locator("td").nth(1).inner_text() == "alice"
    shot(page, "console-after-five-runs", full_page=True)
    assert not page.js_errors


def _history_outcomes(page, count):
    page.wait_for_function(
        f"() => document.querySelectorAll('#c-history tr').length >= {count}"
        " && ![...document.querySelectorAll('#c-history td.outcome')]"
        ".some((td) => td.textContent === 'running')"
    )
    return page.locator("#c-history td.outcome").all_inner_texts()


def test_a_reloaded_page_shows_the_run_waiting_for_input_and_interrupt_ends_it(
    running_python, login, live_server_url, shot
):
    """Reloading during input() used to lock the console (no answer box, Interrupt
    disabled, every run refused); Interrupt did not end a run waiting for input; and
    the history said "finished" for a run that raised."""
    from django.db import connections

    from sessions_app.models import ResourcePolicy

    def idle_timeout_of_an_hour():
        hour = timedelta(hours=1)
        if not ResourcePolicy.objects.filter(is_default=True).update(idle_timeout=hour):
            ResourcePolicy.objects.create(name="e2e-default", is_default=True, idle_timeout=hour)
        connections.close_all()

    # On another thread: Playwright's sync API runs an event loop on this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(idle_timeout_of_an_hour).result()
    page = _console(login, live_server_url, running_python)
    _run(page, "1 / 0")
    page.locator("#c-code").fill("name = input('Your name? ')\nprint('hello', name)")
    page.locator("#c-code").press("Shift+Enter")
    page.locator("#c-input").wait_for(state="visible")

    page.reload()
    page.wait_for_function("() => window.consoleReady === true")
    page.locator("#c-input").wait_for(state="visible")  # the pending run, found again
    page.wait_for_function("() => !document.getElementById('c-interrupt').disabled")
    assert "still going" in page.locator("#c-output [data-kind=pending]").inner_text()
    shot(page, "reloaded-page-shows-the-run-waiting-for-input")
    # Opening the page counted as no activity; the interrupt does, and the page shows the
    # server's new last activity and idle deadline.
    before = page.evaluate("() => window.detailState.idle_deadline")
    assert before is not None
    page.locator("#c-interrupt").click()
    page.wait_for_function(
        f"() => Date.parse(window.detailState.idle_deadline) > Date.parse({before!r})"
        " && document.querySelector('[data-deadline]').dataset.deadline"
        " === window.detailState.idle_deadline"
    )
    page.wait_for_function(
        "() => document.getElementById('c-output').textContent.includes('KeyboardInterrupt')"
    )
    page.wait_for_function("() => document.getElementById('c-run').disabled === false")
    assert page.locator("#c-input").is_hidden()
    _run(page, "print('after')")
    assert page.locator("#c-output [data-kind=stdout]").last.inner_text().strip() == "after"

    assert _history_outcomes(page, 3)[:3] == [
        "finished",
        "interrupted",
        "error: ZeroDivisionError",
    ]
    shot(page, "history-says-how-each-run-ended", full_page=True)
    page.set_viewport_size({"width": 1366, "height": 900})
    page.locator("#c-history").scroll_into_view_if_needed()
    shot(page, "history-at-1366")
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("#c-history").scroll_into_view_if_needed()
    # The top bar's narrow layout is issue 24 item 6's (another change): audited there.
    shot(page, "history-at-390", axe_exclude=[".topbar"])
    assert not page.js_errors


def test_what_a_kernel_prints_as_html_never_runs_as_the_managers_page(
    running_python, login, live_server_url, shot
):
    page = _console(login, live_server_url, running_python)
    _run(
        page,
        "from IPython.display import HTML, display\n"
        "display(HTML('<b id=bold>bold</b><img src=x onerror=\"parent.document.title=1\">'))\n"
        "print('<script>parent.document.title=2</script>')",
    )
    frame = page.locator("#c-output iframe.rec-html")
    assert frame.get_attribute("sandbox") == ""
    assert page.frame_locator("#c-output iframe.rec-html").locator("#bold").inner_text() == "bold"
    assert "<script>" in page.locator("#c-output [data-kind=stdout]").last.inner_text()
    assert page.title() != "1" and page.title() != "2"
    shot(page, "console-html-output")


def test_another_user_gets_no_console_of_alices_session(
    running_python, login, live_server_url, shot
):
    page = login("bob", screenshot=False)
    response = page.goto(f"{live_server_url}/sessions/{running_python.pk}/")
    assert response.status == 404
    shot(page, "bob-gets-not-found")
