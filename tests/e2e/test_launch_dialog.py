"""The launch dialog in Chromium: presets, the "Will it fit?" panel, batch start
time and time limit, the dependency picker, per-field errors, and a title that
follows the launched session to its end.

Most tests need no Docker: a registered agent row (``make_agent``) is all the
preview reads. A launched session is placed on it by the inline scheduling pass
and goes no further, which is enough for the dialog. The batch outcome tests run
a real agent. Screenshots go to test-artifacts/e2e/<test>/.

Personas: ``alice`` launches; ``bob`` owns sessions alice must never be offered.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
GIB = 2**30


def orm(fn, *args, **kwargs):
    """Run ``fn`` in another thread: Playwright's sync API keeps an event loop in
    this one, where the ORM refuses to run."""

    def run():
        from django.db import connections

        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the thread ends; its connection must not linger

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _open(page, image="bai-kernel/minimal:1"):
    page.click("#launch-open")
    page.wait_for_function("() => window.launchReady === true")
    page.select_option("#f-image", image)


def _fit(page, verdict: str) -> str:
    """Wait until the preview of what the dialog shows now says ``verdict``; its words."""
    try:
        page.wait_for_function(
            "v => window.launchFit && !window.launchFit.pending && window.launchFit.verdict === v",
            arg=verdict,
            timeout=60_000,  # the suite's load can slow a preview; a wrong verdict fails below
        )
    except PlaywrightTimeout:
        seen = page.evaluate("() => JSON.stringify(window.launchFit || null)")
        pytest.fail(f"the preview never said {verdict!r}; it shows {seen}")
    return page.inner_text("#fit-verdict")


def _errors(page) -> dict[str, list[str]]:
    """The dialog's field of each error shown → its messages."""
    pairs = page.eval_on_selector_all(
        "#launch-form .field-error", "els => els.map(e => [e.dataset.fieldError, e.textContent])"
    )
    out: dict[str, list[str]] = {}
    for field, message in pairs:
        out.setdefault(field, []).append(message)
    return out


def _hold(owner, image, agent, *, cpu: str, name: str, status: str = "RUNNING"):
    """A session of ``owner`` whose one kernel holds ``cpu`` on ``agent``."""
    from sessions_app.models import Kernel, Session

    session = Session.objects.create(
        owner=owner,
        name=name,
        image=image,
        resource_group=agent.resource_group,
        status=status,
    )
    Kernel.objects.create(
        id=session.pk,
        session=session,
        cluster_role="main",
        cluster_idx=1,
        local_rank=0,
        cluster_hostname="main1",
        image=image.reference,
        requested_slots={"cpu": cpu, "mem": str(GIB // 4)},
        agent=agent,
        status=status,
    )
    return session


def _typed_in_picker(page, text: str):
    """Open the dialog with a small session, type ``text`` into the dependency picker; the picker."""
    _open(page)
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "0.25")
    picker = page.locator("#f-deps-input")
    picker.click()
    picker.type(text)
    return picker


def _batch_sessions(node, image, rows) -> dict:
    """Batch sessions (name, owner, status, result) on ``node``'s group, made off the browser's
    thread; by name."""
    from sessions_app.models import Session

    def make():
        return {
            name: Session.objects.create(
                owner=owner,
                name=name,
                image=image,
                resource_group=node.resource_group,
                status=status,
                result=result,
                session_type="batch",
            )
            for name, owner, status, result in rows
        }

    return orm(make)


@pytest.fixture
def node(make_agent, group):
    """One agent with 2 cpu and 8 GiB, alive to the scheduler (no daemon behind it)."""
    return make_agent("node-a", cpu="2", mem=8 * GIB)


@pytest.fixture
def presets(group):
    """Two presets for every group, and one the ``gpu`` group keeps to itself."""
    from sessions_app.models import ResourceGroup, ResourcePreset

    ResourcePreset.objects.all().delete()
    gpu = ResourceGroup.objects.create(name="gpu")
    ResourcePreset.objects.create(
        name="tiny", description="Quick checks", resource_slots={"cpu": "0.5", "mem": str(GIB // 2)}
    )
    ResourcePreset.objects.create(
        name="small", resource_slots={"cpu": "1", "mem": str(2 * GIB)}, order=1
    )
    ResourcePreset.objects.create(
        name="gpu-big", resource_slots={"cpu": "4", "mem": str(8 * GIB)}, resource_group=gpu
    )


def test_a_preset_fills_the_resources_and_an_edit_makes_them_custom(
    live_server_url, images, users, presets, node, login, shot
):
    page = login("alice", screenshot=False)
    _open(page)
    page.locator("#presets").wait_for()
    names = page.eval_on_selector_all(
        "#preset-list .preset b", "els => els.map(e => e.textContent)"
    )
    assert names == ["tiny", "small", "Custom"]  # not the gpu group's own

    page.click('.preset[data-preset="small"]')
    assert page.input_value("#f-cpu") == "1"
    assert page.input_value("#f-mem") == "2"
    assert page.input_value("#f-gpu") == "0"
    assert page.get_attribute('.preset[data-preset="small"]', "aria-pressed") == "true"
    assert page.text_content("#launch-total-value") == "1 CPU · 2 GiB"
    _fit(page, "start_now")
    shot(page, "preset-small-chosen")

    page.fill("#f-cpu", "1.5")
    assert page.get_attribute('.preset[data-preset="small"]', "aria-pressed") == "false"
    assert page.get_attribute('.preset[data-preset=""]', "aria-pressed") == "true"
    shot(page, "edited-so-custom")
    assert page.js_errors == []


def test_the_fit_panel_says_starts_now_will_wait_and_can_never_start(
    live_server_url, images, users, node, login, shot
):
    page = login("alice", screenshot=False)
    _open(page)
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "0.25")
    words = _fit(page, "start_now")
    assert words.startswith("Starts now"), words
    assert page.is_enabled("#launch-submit")
    group = page.inner_text("#fit-group")
    assert "2 free" in group and "at most 2 on one agent" in group, group
    assert "no limit" in page.inner_text('#fit-quota [data-slot="cpu"]')
    assert "10 left" in page.inner_text('#fit-quota [data-slot="sessions"]')
    page.locator("#launch-fit").scroll_into_view_if_needed()
    shot(page, "starts-now")

    # bob's session takes the whole agent: alice's would wait for room.
    orm(_hold, users["bob"], images["bai-kernel/minimal:1"], node, cpu="2", name="bobs-big")
    page.fill("#f-cpu", "1")
    words = _fit(page, "wait")
    assert words.startswith("Will wait: needs 1 cpu per container; largest free"), words
    assert page.is_enabled("#launch-submit")
    assert "Will wait" in page.inner_text("#fit-chip")
    assert "0 free" in page.inner_text('#fit-group [data-slot="cpu"]')
    shot(page, "will-wait-agent-full")

    # Larger than any agent: never, and Launch says no.
    page.fill("#f-cpu", "4")
    words = _fit(page, "never")
    assert words.startswith("Can never start: needs 4 cpu per container; no agent"), words
    assert "(the largest agent has 2 cpu)" in words
    assert page.is_disabled("#launch-submit")
    assert page.get_attribute("#launch-submit", "aria-describedby") == "fit-verdict"
    errors = _errors(page)
    assert list(errors) == ["resources.cpu"], errors
    assert page.get_attribute("#f-cpu", "aria-invalid") == "true"
    assert page.get_attribute("#f-mem", "aria-invalid") is None
    shot(page, "can-never-start")

    # Back to a size that fits some day: Launch comes back.
    page.fill("#f-cpu", "1")
    _fit(page, "wait")
    assert page.is_enabled("#launch-submit")
    assert _errors(page) == {}
    assert page.js_errors == []


def test_a_memory_quota_error_shows_under_memory_and_a_cpu_one_under_cpu(
    live_server_url, images, users, node, login, shot
):
    from sessions_app.models import ResourcePolicy, UserResourcePolicy

    def quota():
        policy = ResourcePolicy.objects.create(
            name="alice-small", total_resource_slots={"cpu": "1", "mem": str(GIB)}
        )
        UserResourcePolicy.objects.create(user=users["alice"], policy=policy)

    orm(quota)
    page = login("alice", screenshot=False)
    _open(page)
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "2")
    words = _fit(page, "never")
    assert "quota: total mem would be 2 GiB of 1 GiB allowed" in words, words
    errors = _errors(page)
    assert list(errors) == ["resources.mem"], errors
    assert "quota: total mem" in errors["resources.mem"][0]
    assert page.get_attribute("#f-mem", "aria-invalid") == "true"
    assert page.get_attribute("#f-cpu", "aria-invalid") is None
    assert page.is_disabled("#launch-submit")
    assert "1 GiB left" in page.inner_text('#fit-quota [data-slot="mem"]')
    page.locator('[data-field="resources.mem"] .field-error').scroll_into_view_if_needed()
    shot(page, "memory-quota-under-memory")

    page.fill("#f-mem", "0.5")
    page.fill("#f-cpu", "2")
    _fit(page, "never")
    errors = _errors(page)
    assert list(errors) == ["resources.cpu"], errors
    assert "quota: total cpu" in errors["resources.cpu"][0]
    shot(page, "cpu-quota-under-cpu")
    assert page.js_errors == []


def test_the_pending_limit_says_a_launch_now_would_be_refused(
    live_server_url, images, users, node, login, shot
):
    from sessions_app.models import ResourcePolicy, Session, UserResourcePolicy

    def one_pending_allowed_and_taken():
        policy = ResourcePolicy.objects.create(name="alice-one-pending", max_pending_sessions=1)
        UserResourcePolicy.objects.create(user=users["alice"], policy=policy)
        Session.objects.create(
            owner=users["alice"],
            name="already-waiting",
            image=images["bai-kernel/minimal:1"],
            resource_group=node.resource_group,
            status="PENDING",
        )

    orm(one_pending_allowed_and_taken)
    page = login("alice", screenshot=False)
    _open(page)
    words = _fit(page, "refused")
    assert words.startswith("Cannot launch now: quota: at most 1 pending sessions"), words
    assert "Cannot launch now" in page.inner_text("#fit-chip")
    page.locator("#launch-fit").scroll_into_view_if_needed()
    shot(page, "pending-limit")


def test_a_bad_value_is_marked_on_its_own_field_once_the_user_leaves_it(
    live_server_url, images, users, node, login, shot
):
    page = login("alice", screenshot=False)
    _open(page)
    page.fill("#f-name", "bad name!")
    words = _fit(page, "invalid")
    # Said in the panel, not yet under the field the user is still typing in.
    assert "Name: use up to 64 letters" in words, words
    assert _errors(page) == {}
    shot(page, "typing-no-nagging")

    page.press("#f-name", "Tab")
    page.locator('[data-field="name"] .field-error').wait_for()
    assert list(_errors(page)) == ["name"]
    assert page.get_attribute("#f-name", "aria-invalid") == "true"
    for other in ("#f-cpu", "#f-mem", "#f-gpu", "#f-size"):
        assert page.get_attribute(other, "aria-invalid") is None, other
    shot(page, "name-marked-alone")

    page.fill("#f-name", "good-name")
    _fit(page, "start_now")
    assert _errors(page) == {}
    assert page.js_errors == []


def test_a_batch_with_a_start_time_and_a_time_limit_waits_for_its_start(
    live_server_url, images, users, node, login, shot
):
    page = login("alice", screenshot=False)
    # Seoul (UTC+9): the start time must leave with the user's own offset.
    page.context.new_cdp_session(page).send(
        "Emulation.setTimezoneOverride", {"timezoneId": "Asia/Seoul"}
    )
    _open(page)
    assert not page.is_visible("#f-starts-at")
    page.check("input[name=type][value=batch]", force=True)
    assert page.is_visible("#f-starts-at") and page.is_visible("#f-batch-timeout")
    assert "UTC+09:00" in page.text_content("#f-starts-at-hint")
    page.fill("#f-name", "later")
    page.fill("#f-startup", "echo later")
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "0.25")
    # Two minutes ahead, to the minute, as the user's wall clock shows it.
    local = page.evaluate(
        """() => {
            const d = new Date(Date.now() + 120000);
            const p = n => String(n).padStart(2, '0');
            return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
        }"""
    )
    page.fill("#f-starts-at", local)
    page.fill("#f-batch-timeout", "1h30m")
    assert page.text_content("#f-batch-timeout-hint").startswith("= 1 h 30 min")
    shot(page, "batch-fields")
    words = _fit(page, "wait")
    assert words.startswith("Will wait: starts at "), words
    page.locator("#launch-fit").scroll_into_view_if_needed()
    shot(page, "batch-will-wait-for-its-start")

    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.status === 'PENDING'"
        " && (window.launchState.reason || '').startsWith('starts at')"
    )
    assert page.text_content("#launch-title").startswith("Waiting: starts at ")
    shot(page, "launched-waiting-for-start")

    from sessions_app.models import Session

    session = orm(Session.objects.get, name="later")
    expected = datetime.fromisoformat(local).replace(tzinfo=UTC) - timedelta(hours=9)
    assert session.starts_at == expected
    assert session.batch_timeout == timedelta(hours=1, minutes=30)
    assert page.js_errors == []


def test_a_batch_time_limit_the_dialog_cannot_read_is_marked_and_not_sent(
    live_server_url, images, users, node, login, shot
):
    page = login("alice", screenshot=False)
    _open(page)
    page.check("input[name=type][value=batch]", force=True)
    page.fill("#f-startup", "true")
    page.fill("#f-batch-timeout", "soon")
    page.click("#launch-submit")
    error = page.locator('[data-field="batch_timeout"] .field-error')
    error.wait_for()
    assert "is not a duration" in error.inner_text()
    assert list(_errors(page)) == ["batch_timeout"]
    assert page.is_visible("#launch-form")
    assert page.evaluate("window.launchState") is None  # nothing was launched
    shot(page, "bad-time-limit")


def test_the_dependency_picker_finds_a_session_by_part_of_its_name(
    live_server_url, images, users, node, login, shot
):
    from sessions_app.models import Session

    alice, bob = users["alice"], users["bob"]
    made = _batch_sessions(
        node,
        images["bai-kernel/minimal:1"],
        [
            ("train-resnet", alice, "RUNNING", "UNDEFINED"),
            ("prep-data", alice, "PENDING", "UNDEFINED"),
            ("failed-run", alice, "TERMINATED", "FAILED"),
            ("train-bob", bob, "RUNNING", "UNDEFINED"),
        ],
    )
    page = login("alice", screenshot=False)
    picker = _typed_in_picker(page, "rain")
    options = page.eval_on_selector_all(
        "#deps-options [role=option]",
        "els => els.map(e => e.querySelector('.opt-name').textContent)",
    )
    assert options == ["train-resnet"]  # not bob's
    assert picker.get_attribute("aria-expanded") == "true"
    shot(page, "typed-part-of-a-name")

    picker.press("ArrowDown")
    assert picker.get_attribute("aria-activedescendant") == f"dep-opt-{made['train-resnet'].pk}"
    picker.press("Enter")
    chips = page.eval_on_selector_all(
        "#deps-chips .chip span", "els => els.map(e => e.textContent)"
    )
    assert chips == ["train-resnet"]
    assert page.is_visible("#launch-form")  # Enter added it; it did not launch
    words = _fit(page, "wait")
    assert "waiting for dependencies: train-resnet" in words, words

    picker.type("PREP")
    picker.press("Enter")  # the one match
    picker.type("x")
    picker.press("Escape")  # closes the list, not the dialog
    assert page.is_visible("#launch-modal") and page.is_hidden("#deps-options")
    picker.fill("")
    # What is left to choose: the one that ended, with how it ended.
    assert page.inner_text("#deps-options").split("\n") == [
        "failed-run",
        "ended: FAILED · the new session would be cancelled",
    ]
    _fit(page, "wait")
    shot(page, "two-chosen")
    picker.press("Backspace")
    chips = page.eval_on_selector_all(
        "#deps-chips .chip span", "els => els.map(e => e.textContent)"
    )
    assert chips == ["train-resnet"]
    assert "Removed prep-data" in page.text_content("#deps-status")
    assert page.is_visible('#deps-options [role=option]:has-text("prep-data")')  # offered again

    # Escape closes the open list first, then the dialog; the choice is kept.
    picker.press("Escape")
    assert page.is_visible("#launch-modal") and page.is_hidden("#deps-options")
    picker.press("Escape")
    page.locator("#launch-modal").wait_for(state="hidden")
    page.click("#launch-open")
    chips = page.eval_on_selector_all(
        "#deps-chips .chip span", "els => els.map(e => e.textContent)"
    )
    assert chips == ["train-resnet"]

    page.fill("#f-name", "after-resnet")
    _fit(page, "wait")
    page.click("#launch-submit")
    page.wait_for_function("() => window.launchState && window.launchState.status === 'PENDING'")
    page.wait_for_function(
        "() => document.getElementById('launch-title').textContent.startsWith('Waiting for dependencies')"
    )
    shot(page, "launched-waiting-for-its-dependency")
    launched = orm(lambda: list(Session.objects.get(name="after-resnet").depends_on.all()))
    assert launched == [made["train-resnet"]]
    assert page.js_errors == []


def _launch_posts(page) -> list[str]:
    """The launch requests (POST /api/v1/sessions/) the page sends from now on."""
    sent: list[str] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.url)
            if r.method == "POST" and r.url.endswith("/api/v1/sessions/")
            else None
        ),
    )
    return sent


def _chips(page) -> list[str]:
    return page.eval_on_selector_all(
        "#deps-chips .chip", "els => els.map(e => e.textContent.replace('✕', '').trim())"
    )


def test_the_picker_offers_ended_sessions_with_their_result_and_refuses_text_left_in_it(
    live_server_url, images, users, node, login, shot
):
    from sessions_app.models import Session

    alice = users["alice"]
    made = _batch_sessions(
        node,
        images["bai-kernel/minimal:1"],
        [
            ("train-1", alice, "TERMINATED", "SUCCESS"),
            ("train-2", alice, "TERMINATED", "FAILED"),
            ("prep", alice, "RUNNING", "UNDEFINED"),
        ],
    )
    page = login("alice", screenshot=False, viewport={"width": 1366, "height": 900})
    posts = _launch_posts(page)
    picker = _typed_in_picker(page, "train")
    offered = page.eval_on_selector_all(
        "#deps-options [role=option]",
        "els => els.map(e => [e.querySelector('.opt-name').textContent, e.querySelector('.opt-meta').textContent])",
    )
    assert offered == [
        ["train-2", "ended: FAILED · the new session would be cancelled"],
        ["train-1", "ended: SUCCESS · satisfied"],
    ]
    shot(page, "ended-sessions-offered-with-their-result")

    # Text that names no session: Launch is refused and says why; nothing goes out.
    picker.fill("trian")
    page.click("#launch-submit")
    error = page.locator('[data-field="depends_on"] .field-error')
    error.wait_for()
    assert (
        error.inner_text()
        == "no session of yours matches “trian”: clear the text or type part of another name"
    )
    assert page.evaluate("() => document.activeElement.id") == "f-deps-input"
    assert page.is_visible("#launch-form") and posts == []
    error.scroll_into_view_if_needed()
    shot(page, "text-left-in-the-picker-is-refused")

    # Picked: the refusal goes; a succeeded dependency is satisfied and starts now.
    picker.fill("train-1")
    picker.press("Enter")
    assert _chips(page) == ["train-1 — ended: SUCCESS"]
    assert page.locator('[data-field="depends_on"] .field-error').count() == 0
    assert "Added train-1, which ended: SUCCESS: satisfied." in page.text_content("#deps-status")
    _fit(page, "start_now")

    # A failed one: the dialog says the session would be cancelled, and Launch is off.
    picker.type("train-2")
    picker.press("Enter")
    assert _chips(page) == ["train-1 — ended: SUCCESS", "train-2 — ended: FAILED"]
    words = _fit(page, "never")
    assert "dependency train-2 ended FAILED" in words, words
    assert "a session that depends on it is cancelled" in page.text_content("#deps-status")
    assert page.is_disabled("#launch-submit")
    shot(page, "a-failed-dependency-would-cancel-it")
    picker.press("Backspace")
    _fit(page, "start_now")

    # A match typed but not added: refused too, until it is cleared.
    picker.type("pre")
    page.click("#launch-submit")
    error.wait_for()
    assert (
        error.inner_text()
        == "“pre” is not added yet: pick it in the list (Enter adds it) or clear the text"
    )
    assert posts == []
    picker.fill("")
    assert page.locator('[data-field="depends_on"] .field-error').count() == 0
    page.fill("#f-name", "after-train-1")
    _fit(page, "start_now")
    page.click("#launch-submit")
    page.wait_for_function("() => window.launchState && window.launchState.id")
    launched = orm(lambda: list(Session.objects.get(name="after-train-1").depends_on.all()))
    assert launched == [made["train-1"]]
    assert len(posts) == 1
    assert page.js_errors == []


def test_the_picker_with_ended_sessions_on_a_phone(
    live_server_url, images, users, node, login, shot
):
    rows = [("train-2", users["alice"], "TERMINATED", "FAILED")]
    _batch_sessions(node, images["bai-kernel/minimal:1"], rows)
    page = login("alice", screenshot=False, viewport={"width": 390, "height": 844})
    picker = _typed_in_picker(page, "train")
    _fit(page, "start_now")
    option = page.locator("#deps-options [role=option]").first
    option.scroll_into_view_if_needed()
    box = option.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    shot(page, "ended-session-offered-390")
    picker.press("Enter")
    _fit(page, "never")
    page.locator("#deps-picker").scroll_into_view_if_needed()
    shot(page, "failed-dependency-chosen-390")


def test_a_batch_session_is_not_previewed_before_its_command_is_typed(
    live_server_url, images, users, node, login, shot
):
    page = login("alice", screenshot=False)
    previews: list[int] = []
    page.on(
        "response",
        lambda r: (
            previews.append(r.status) if r.url.endswith("/api/v1/sessions/preview/") else None
        ),
    )
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    _open(page)
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "0.25")
    _fit(page, "start_now")
    asked = len(previews)
    page.check("input[name=type][value=batch]", force=True)
    words = _fit(page, "invalid")
    assert words == "Cannot check yet: Start command: a batch session needs a start command", words
    page.wait_for_timeout(800)  # past the preview's debounce: still nothing asked
    assert previews[asked:] == []
    shot(page, "batch-without-a-command")
    page.click("#launch-submit")  # refused here, under its field, not by a 400
    page.locator('[data-field="startup_command"] .field-error').wait_for()
    assert page.evaluate("window.launchState") is None
    page.fill("#f-startup", "echo hi")
    _fit(page, "start_now")
    assert previews[asked:] and set(previews[asked:]) == {200}
    assert console_errors == [] and page.js_errors == []


@pytest.mark.docker
def test_a_successful_batch_ends_green_and_a_failed_one_says_its_exit_code(
    live_server_url, real_agent, images, users, login, shot
):
    page = login("alice", screenshot=False)
    _open(page)
    page.check("input[name=type][value=batch]", force=True)
    page.fill("#f-name", "ok-batch")
    page.fill("#f-startup", "echo done")
    page.fill("#f-cpu", "0.5")
    page.fill("#f-mem", "0.25")
    _fit(page, "start_now")
    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.outcome === 'success'", timeout=90_000
    )
    assert page.text_content("#launch-title") == "Batch finished: SUCCESS"
    titles = page.evaluate("window.launchState.titles")
    assert titles[0] == "Starting ok-batch…" and titles[-1] == "Batch finished: SUCCESS", titles
    assert "alert-ok" in page.get_attribute("#progress-final", "class")
    steps = page.eval_on_selector_all("#progress-steps li", "els => els.map(e => e.className)")
    assert steps[-1] == "done" and "failed" not in steps, steps
    shot(page, "batch-success-green")

    page.click("#launch-progress [data-close]")
    _open(page)
    assert page.text_content("#launch-title") == "Launch a session"
    page.fill("#f-name", "bad-batch")
    page.fill("#f-startup", "exit 3")
    _fit(page, "start_now")
    page.click("#launch-submit")
    page.wait_for_function(
        "() => window.launchState && window.launchState.outcome === 'failed'", timeout=90_000
    )
    assert page.text_content("#launch-title") == "Batch failed (exit code 3)"
    assert "alert-error" in page.get_attribute("#progress-final", "class")
    shot(page, "batch-failed-exit-code")
    assert page.js_errors == []


def test_the_dialog_reads_durations_and_places_messages_as_the_server_writes_them(
    live_server_url, users, login
):
    from bai_common.units import parse_duration

    page = login("alice", screenshot=False)
    texts = ["90", "30m", "2h", "1h30m", "1 d 2 h", "1.5h", "45 min", "2hours"]
    seconds = page.evaluate(
        """async texts => {
            const { parseDuration } = await import('/static/js/common.js');
            return texts.map(t => parseDuration(t));
        }""",
        texts,
    )
    assert seconds == [parse_duration(t).total_seconds() for t in texts]
    refused = ["", "soon", "30m2h", "1m1m", "-5m", "5 parsecs"]
    thrown = page.evaluate(
        """async texts => {
            const { parseDuration } = await import('/static/js/common.js');
            return texts.map(t => { try { parseDuration(t); return false; } catch { return true; } });
        }""",
        refused,
    )
    assert thrown == [True] * len(refused)
    for text in refused:
        with pytest.raises(ValueError):
            parse_duration(text)

    # The slot a resources message is about, in the launch's and the scheduler's words.
    slots = page.evaluate(
        """async messages => {
            const { slotOf } = await import('/static/js/launch.js');
            return messages.map(slotOf);
        }""",
        [
            "mem: the smallest kernel needs at least 16 MiB mem per container",
            "cpu: at most 3 decimal places",
            "quota: total mem would be 2 GiB of 1 GiB allowed (1 GiB over)",
            "needs 16 cpu per container; no agent in resource group default has that much",
            "needs 4 GiB mem per container; largest free on an agent: 2 GiB",
            'must be an object like {"cpu": 1, "mem": "1g"}',
        ],
    )
    assert slots == ["mem", "cpu", "mem", "cpu", "mem", None]
