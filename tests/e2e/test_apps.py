"""The app launcher in Chromium against a real agent and the apps proxy: a
running session's list row and detail page offer one button per app of main1;
"Jupyter" opens the notebook server in a new tab on the apps origin, where a
new notebook runs a cell over Jupyter's kernel websocket (through the proxy).

Persona: ``alice`` with one running session of the Python image.
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# Jupyter's own pages are third-party markup served on the apps origin, not the
# manager's; the checks leave their whole body out (the manager's pages stay checked).
JUPYTER_PAGE = ["body"]


def test_jupyter_opens_from_the_session_list_and_runs_a_cell_through_the_proxy(
    running_python, login, live_server_url, shot
):
    page = login("alice", screenshot=False)
    app_requests = []
    page.context.on(
        "request", lambda r: app_requests.append(r) if ".apps.localhost:" in r.url else None
    )
    row = page.locator(f'tr[data-id="{running_python.pk}"]')
    jupyter = row.locator('button[data-app="jupyter"]')
    jupyter.wait_for()
    assert row.locator('button[data-app="port-8080"]').inner_text() == "port 8080"
    shot(page, "list-with-app-buttons")

    with page.context.expect_page() as opened:
        jupyter.click()
    tab = opened.value
    tab.set_default_timeout(60_000)
    tab.wait_for_url(f"http://{running_python.pk.hex}-jupyter.apps.localhost:*/tree*")
    tab.locator("#new-dropdown-button").click()
    shot(tab, "jupyter-tree", axe_exclude=JUPYTER_PAGE)
    with tab.context.expect_page() as notebook_opened:
        tab.locator("#kernel-python3 a").click()
    notebook = notebook_opened.value
    notebook.set_default_timeout(60_000)
    notebook.locator("#kernel_indicator_icon.kernel_idle_icon").wait_for(state="attached")
    notebook.locator(".CodeMirror").first.click()
    notebook.keyboard.type("print(6*7)")
    notebook.keyboard.press("Shift+Enter")
    output = notebook.locator(".output_area pre").first
    output.wait_for()
    assert output.inner_text().strip() == "42"
    shot(notebook, "notebook-output-42", axe_exclude=JUPYTER_PAGE)
    assert not page.js_errors

    # The browser holds the manager's cookies (its host:port) and sent none to the apps origin.
    manager_cookies = page.context.cookies(live_server_url)
    assert {c["name"] for c in manager_cookies} >= {"sessionid", "csrftoken"}
    assert len(app_requests) > 10
    for request in app_requests:
        sent = request.all_headers().get("cookie", "")
        for c in manager_cookies:
            assert c["value"] not in sent, f"{c['name']} went to {request.url}"


def test_a_web_server_started_in_the_terminal_opens_from_its_port_button(
    running_python, login, live_server_url, shot
):
    page = login("alice", screenshot=False)
    page.goto(f"{live_server_url}/sessions/{running_python.pk}/terminal/")
    page.wait_for_function("() => window.termReady === true")
    page.locator("#terminal").click()
    page.keyboard.type(
        "mkdir -p site && echo served-from-the-terminal > site/note.txt "
        "&& python3 -m http.server --directory site 8080\n"
    )
    page.wait_for_function("() => window.termOutput.includes('Serving HTTP')")
    shot(page, "terminal-serving-8080")

    page.goto(f"{live_server_url}/sessions/{running_python.pk}/")
    with page.context.expect_page() as opened:
        page.locator('#d-apps button[data-app="port-8080"]').click()
    tab = opened.value
    tab.wait_for_url(f"http://{running_python.pk.hex}-port-8080.apps.localhost:*/")
    tab.get_by_role("link", name="note.txt").click()
    tab.wait_for_url("**/note.txt")
    assert tab.locator("body").inner_text().strip() == "served-from-the-terminal"
    shot(tab, "file-through-the-proxy", users_document=True)


def test_the_detail_page_offers_the_apps_and_says_why_an_app_did_not_open(
    running_python, login, live_server_url, shot
):
    from sessions_app.models import Session

    page = login("alice", screenshot=False)
    page.goto(f"{live_server_url}/sessions/{running_python.pk}/")
    buttons = page.locator("#d-apps button")
    buttons.first.wait_for()
    assert buttons.all_inner_texts() == ["Jupyter", "port 8080"]
    shot(page, "detail-with-app-buttons")

    # The session ends behind the page's back: the launcher answers 409, no tab stays open.
    # (In a thread: Playwright's loop makes this one async, where the ORM refuses to run.)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(
            lambda: Session.objects.filter(pk=running_python.pk).update(status="TERMINATED")
        ).result()
    pages_before = len(page.context.pages)
    page.locator('#d-apps button[data-app="jupyter"]').click()
    status = page.locator("#app-launch-status")
    status.wait_for()
    page.wait_for_function(
        "() => document.getElementById('app-launch-status').textContent.includes('Could not open')"
    )
    assert "Could not open Jupyter" in status.inner_text()
    assert len(page.context.pages) == pages_before
    shot(page, "detail-app-error")
