"""The sessions list keeps the newest state of a session it learns about twice:
once from the live pushes (which may arrive first) and once from the launch's
own response (the oldest state there is)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tests.e2e.test_pages import _launch


def test_a_waiting_reason_pushed_before_the_launch_answer_is_kept_in_the_list(
    live_server_url, real_agent, images, users, login, shot
):
    from sessions_app.models import Agent

    # No agent to place on: the first pass says so, and pushes it.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(Agent.objects.filter(pk=real_agent.pk).update, schedulable=False).result()
    page = login("alice")

    def answer_late(route):
        response = route.fetch()
        time.sleep(2)  # the pass has run and pushed its reason by now
        route.fulfill(response=response)

    page.route(
        "**/api/v1/sessions/",
        lambda route: answer_late(route) if route.request.method == "POST" else route.fallback(),
    )
    _launch(page, image="bai-kernel/minimal:1", name="late-answer")
    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.reason"
        " && window.launchState.reason.includes('no agent')"
    )
    session_id = page.evaluate("() => window.launchState.id")
    page.click("#launch-progress [data-close]")
    row = page.locator(f'tr[data-id="{session_id}"]')
    page.wait_for_function(
        '(id) => { const r = document.querySelector(`tr[data-id="${id}"] .reason`);'
        " return r && r.textContent.includes('no agent'); }",
        arg=session_id,
        timeout=10_000,
    )
    assert "no agent" in row.locator(".reason").inner_text()
    shot(page, "list-keeps-pushed-reason")
