"""The pages in a real browser against a live server and a real Docker agent.

Every step saves a screenshot to test-artifacts/e2e/<test>/<step>.png. Tests
wait on the pages' readiness flags (window.wsReady, termReady, logsReady …),
never on sleeps.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def _launch(
    page,
    *,
    image: str,
    size: int = 1,
    mode: str = "single-node",
    batch_command=None,
    cpu: str = "0.5",
    mem_gib: str = "0.25",
    name: str | None = None,
):
    page.click("#launch-open")
    page.wait_for_function("() => window.launchReady === true")
    page.select_option("#f-image", image)
    if name:
        page.fill("#f-name", name)
    if batch_command is not None:
        page.check("input[name=type][value=batch]", force=True)
        page.fill("#f-startup", batch_command)
    page.check(f'input[name=cluster_mode][value="{mode}"]', force=True)
    page.fill("#f-size", str(size))
    page.fill("#f-cpu", cpu)
    page.fill("#f-mem", mem_gib)


def _submit_and_wait(page, status: str = "RUNNING", timeout: int = 90_000) -> str:
    page.click("#launch-submit")
    page.wait_for_function(
        f"() => window.launchState && window.launchState.status === '{status}'", timeout=timeout
    )
    return page.evaluate("window.launchState.id")


def test_a_user_launches_a_three_node_cluster_and_works_in_it(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice")
    shot(page, "sessions-empty")

    _launch(page, image="bai-kernel/python:2", size=3, mode="multi-node", name="trio")
    page.click("#env-add")
    page.fill('#f-env .env-row:last-child [data-env="key"]', "GREETING")
    page.fill('#f-env .env-row:last-child [data-env="value"]', "hello")
    # The total follows the cluster size as it is typed.
    assert page.text_content("#launch-total-value") == "1.5 CPU · 768 MiB"
    shot(page, "launch-dialog-filled")

    session_id = _submit_and_wait(page)
    steps = page.eval_on_selector_all(
        "#progress-steps li:not([hidden])", "els => els.map(e => e.className)"
    )
    assert steps[0] == "done" and steps[-1] == "done"
    assert page.text_content("#launch-title") == "Running"
    shot(page, "launch-progress-running")

    # The list shows it running without a reload.
    page.click("#launch-progress [data-close]")
    row = page.locator(f'tr[data-id="{session_id}"]')
    row.locator(".badge.s-RUNNING").wait_for()
    assert "Multi Node" in row.inner_text() and "3 containers" in row.inner_text()
    shot(page, "list-running")

    # Logs of sub2: its tab opens and follows the live stream.
    row.locator('[data-action="logs"]').click()
    page.wait_for_function("() => window.logsReady === true")
    page.click('#logs-tabs button[data-host="sub2"]')
    page.wait_for_function(
        "() => window.logsReady === true && window.logsState.kernel === 'sub2' && window.logsState.live"
    )
    assert page.get_attribute('#logs-tabs button[data-host="sub2"]', "aria-selected") == "true"
    assert "following sub2 live" in page.text_content("#logs-state")
    shot(page, "logs-sub2")
    # The tabs are one stop for Tab; arrow keys move between them.
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => window.logsReady === true && window.logsState.kernel === 'sub1'")
    assert page.evaluate("document.activeElement.dataset.host") == "sub1"
    assert page.get_attribute('#logs-tabs button[data-host="sub2"]', "tabindex") == "-1"
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.getElementById('logs-modal').open")

    # The terminal: a shell in main1, and ssh to a sub kernel from there.
    page.goto(f"{live_server_url}/sessions/{session_id}/terminal/")
    page.wait_for_function("() => window.termReady === true")
    page.locator("#terminal").click()
    page.keyboard.type("echo $BACKENDAI_CLUSTER_HOST $GREETING\n")
    page.wait_for_function("() => window.termOutput.includes('main1 hello')")
    shot(page, "terminal-main1")
    page.keyboard.type("ssh sub1 hostname\n")
    page.wait_for_function("() => /[\\r\\n]sub1\\r\\n/.test(window.termOutput)", timeout=30_000)
    shot(page, "terminal-ssh-sub1")

    # A reload re-attaches to the same shell (same tab id in sessionStorage).
    page.keyboard.type("export MARK=kept-$((6*7))\n")
    page.wait_for_function("() => window.termOutput.includes('export MARK')")
    page.reload()
    page.wait_for_function("() => window.termReady === true")
    page.locator("#terminal").click()
    page.keyboard.type("echo $MARK\n")
    page.wait_for_function("() => window.termOutput.includes('kept-42')")
    shot(page, "terminal-reattached")

    page.goto(f"{live_server_url}/sessions/{session_id}/")
    page.wait_for_function("() => window.wsReady === true")
    assert page.locator("#d-kernels tr").count() == 3
    assert page.locator("#d-events li").count() >= 10
    shot(page, "detail", full_page=True)
    assert page.js_errors == []


def test_a_batch_sessions_output_appears_in_its_logs_and_its_result_on_the_page(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice")
    _launch(
        page,
        image="bai-kernel/minimal:1",
        batch_command="echo hello-from-main1; sleep 3; echo bye-from-main1",
        name="batch-echo",
    )
    assert page.is_visible("#startup-field")
    shot(page, "launch-batch")
    session_id = _submit_and_wait(page)
    page.click("#launch-progress [data-close]")

    row = page.locator(f'tr[data-id="{session_id}"]')
    row.locator('[data-action="logs"]').click()
    page.wait_for_function("() => window.logsReady === true && window.logsState.kernel === 'main1'")
    page.wait_for_function(
        "() => document.getElementById('logs-view').textContent.includes('hello-from-main1')"
    )
    shot(page, "logs-main1-live")
    # It ends by itself: the stream says so, and the list shows the result live.
    page.wait_for_function(
        "() => document.getElementById('logs-view').textContent.includes('bye-from-main1')"
    )
    page.wait_for_function("() => window.logsState.ended === true", timeout=30_000)
    shot(page, "logs-main1-ended")
    page.click("#logs-modal [data-close]")
    page.click('#filter button[data-filter="all"]')
    row.locator(".result-SUCCESS").wait_for(timeout=30_000)
    # Its age stopped at its end, and says how long it ran.
    age = row.locator("td.age")
    assert age.get_attribute("data-ended") is not None and age.get_attribute("data-age") is None
    assert "\nran " in age.inner_text(), age.inner_text()
    shot(page, "list-batch-success")

    # After the container is gone, its kept tail is still readable.
    row.locator('[data-action="logs"]').click()
    page.wait_for_function(
        "() => window.logsReady === true && window.logsState.live === false "
        "&& document.getElementById('logs-view').textContent.includes('hello-from-main1')"
    )
    shot(page, "logs-main1-kept-tail")


def test_an_empty_log_tab_says_no_output_yet_until_its_first_line(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice")
    _launch(
        page,
        image="bai-kernel/minimal:1",
        batch_command="sleep 8; echo first-line; sleep 2",
        name="slow-start",
    )
    session_id = _submit_and_wait(page)
    page.click("#launch-progress [data-close]")
    page.locator(f'tr[data-id="{session_id}"] [data-action="logs"]').click()
    page.wait_for_function("() => window.logsReady === true && window.logsState.live === true")
    assert page.inner_text("#logs-view .placeholder").strip() == "no output yet"
    shot(page, "logs-no-output-yet")

    page.wait_for_function(
        "() => document.getElementById('logs-view').textContent.includes('first-line')"
    )
    assert page.locator("#logs-view .placeholder").count() == 0
    shot(page, "logs-first-line")


def test_a_session_that_cannot_be_placed_says_why_on_the_page(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice")
    # 1.5 CPU fits the agent's 2 but not twice: the second one waits for room.
    _launch(page, image="bai-kernel/minimal:1", cpu="1.5", name="big-one")
    _submit_and_wait(page)
    page.click("#launch-progress [data-close]")
    _launch(page, image="bai-kernel/minimal:1", cpu="1.5", name="big-two")
    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.status === 'PENDING' && window.launchState.reason"
        " && window.launchState.reason !== 'created'"
    )
    waiting_id = page.evaluate("window.launchState.id")
    reason = page.text_content("#progress-steps li[data-step=PENDING] .step-reason")
    assert "cpu" in reason, reason
    shot(page, "launch-pending-with-reason")

    page.goto(f"{live_server_url}/sessions/{waiting_id}/")
    page.wait_for_function("() => window.wsReady === true")
    assert page.is_visible("#d-waiting")
    assert "cpu" in page.text_content("#d-waiting-reason")
    shot(page, "detail-why-it-waits")

    # An agent taken out of scheduling: the reason says there is no agent to use.
    from sessions_app.models import Agent

    # Playwright's sync API runs an event loop in this thread: the ORM goes to another.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(Agent.objects.filter(pk=real_agent.pk).update, schedulable=False).result()
    page.goto(live_server_url)
    page.wait_for_function("() => window.wsReady === true")
    _launch(page, image="bai-kernel/minimal:1", name="no-room")
    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.status === 'PENDING' && window.launchState.reason"
        " && window.launchState.reason !== 'created'"
    )
    shot(page, "launch-pending-unschedulable")
    row = page.locator(f'tr[data-id="{page.evaluate("window.launchState.id")}"]')
    page.click("#launch-progress [data-close]")
    assert row.locator(".reason").inner_text()
    shot(page, "list-pending-reasons")


def test_a_plain_user_cannot_reach_another_users_terminal(
    live_server_url, real_agent, images, users, login, shot
):
    alice_page = login("alice")
    _launch(alice_page, image="bai-kernel/minimal:1", name="private")
    session_id = _submit_and_wait(alice_page)

    page = login("bob")
    shot(page, "bob-sees-no-sessions")
    assert page.locator(f'tr[data-id="{session_id}"]').count() == 0
    response = page.goto(f"{live_server_url}/sessions/{session_id}/terminal/")
    assert response.status == 404
    shot(page, "bob-terminal-page-404")
    # The websocket itself refuses too, with a close code that does not tell it exists.
    page.goto(live_server_url)
    result = page.evaluate(
        """id => new Promise(resolve => {
            const ws = new WebSocket(`ws://${location.host}/ws/sessions/${id}/terminal/`);
            let message = null;
            ws.onmessage = e => { message = JSON.parse(e.data); };
            ws.onclose = e => resolve({code: e.code, message});
        })""",
        session_id,
    )
    assert result["code"] == 4404
    assert result["message"]["message"] == "No such session."
    logs = page.evaluate(
        """id => new Promise(resolve => {
            const ws = new WebSocket(`ws://${location.host}/ws/sessions/${id}/kernels/main1/logs/`);
            ws.onclose = e => resolve(e.code);
        })""",
        session_id,
    )
    assert logs == 4404
    shot(page, "bob-refused")


def test_the_apis_field_errors_appear_beside_their_fields(
    live_server_url, images, users, login, shot
):
    page = login("alice")
    _launch(page, image="bai-kernel/minimal:1", cpu="0", name="bad input!")
    page.click("#env-add")
    page.fill('#f-env .env-row:last-child [data-env="key"]', "1BAD")
    page.click("#launch-submit")
    page.locator(".field-error").first.wait_for()
    errors = dict(
        page.eval_on_selector_all(
            ".field-error", "els => els.map(e => [e.dataset.errorFor, e.textContent])"
        )
    )
    assert {"name", "resources", "env"} <= set(errors), errors
    assert page.is_visible("#launch-error")
    # Still the form, nothing launched.
    assert page.is_visible("#launch-form") and not page.is_visible("#launch-progress")
    shot(page, "launch-field-errors")
