"""What the sessions list and the detail page say about time and waiting, with
no agent: sessions wait (or are ended before they ever run).

Persona: ``alice``, a plain user, under the default resource policy, which
here has an idle timeout of 2 min and a lifetime limit of 1 h.
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def limited_policy(group):
    from sessions_app.models import ResourcePolicy

    policy = ResourcePolicy.objects.get(is_default=True)
    policy.idle_timeout = timedelta(minutes=2)
    policy.max_session_lifetime = timedelta(hours=1)
    policy.save()
    return policy


def _create(owner, **spec):
    from sessions_app import services

    spec.setdefault("image", "bai-kernel/minimal:1")
    spec.setdefault("resources", {"cpu": "1", "mem": "256m"})
    return services.session_create(owner=owner, spec=spec)


# The sessions are made by fixtures that come before ``login``: once the browser
# has started, Playwright's event loop makes this thread async and the ORM refuses it.


@pytest.fixture
def pipeline(users, images, limited_policy):
    """prepare-data (batch, 30 s batch timeout) and notebook, which waits for it."""
    first = _create(
        users["alice"], name="prepare-data", type="batch", startup_command="true", batch_timeout=30
    )
    notebook = _create(users["alice"], name="notebook", depends_on=[str(first.pk)])
    return first, notebook


@pytest.fixture
def one_ended_one_waiting(users, images):
    from sessions_app import services

    waiting = _create(users["alice"], name="still-waiting")
    gone = _create(users["alice"], name="given-up")
    services.session_terminate(session=gone, reason="not needed after all")
    return gone, waiting


def test_a_waiting_session_shows_the_limits_that_will_apply_and_names_what_it_waits_for(
    pipeline, live_server_url, login, shot
):
    first, notebook = pipeline
    page = login("alice")

    row = page.locator(f'tr[data-id="{notebook.pk}"]')
    reason = row.locator(".reason").inner_text()
    assert reason == "waiting for dependencies: prepare-data", reason
    shot(page, "list-waiting-for-a-dependency-by-name")

    page.goto(f"{live_server_url}/sessions/{notebook.pk}/")
    page.wait_for_function("() => window.wsReady === true")
    assert page.inner_text("#d-waiting-reason") == "waiting for dependencies: prepare-data"
    depends = page.locator("#d-facts dd a", has_text="prepare-data")
    assert depends.get_attribute("href") == f"/sessions/{first.pk}/"
    assert str(first.pk)[:8] not in page.inner_text("#d-facts")
    times = page.inner_text("#d-time")
    assert "Idle timeout\n2 min\nwithout activity, once it runs" in times, times
    assert "Lifetime limit\n1 h\nfrom its start" in times, times
    assert "none" not in times and "unlimited" not in times
    assert "Batch timeout" not in times  # an interactive session has none
    shot(page, "detail-limits-that-will-apply", full_page=True)

    page.goto(f"{live_server_url}/sessions/{first.pk}/")
    page.wait_for_function("() => window.wsReady === true")
    times = page.inner_text("#d-time")
    assert "Batch timeout\n30 s\nfrom its start command" in times, times
    assert "Idle timeout" not in times  # a batch session is never idle
    shot(page, "detail-batch-limits-that-will-apply")


def test_age_stops_counting_when_a_session_ends(
    one_ended_one_waiting, live_server_url, login, shot
):
    gone, waiting = one_ended_one_waiting
    page = login("alice")
    page.click('#filter button[data-filter="all"]')

    ended_age = page.locator(f'tr[data-id="{gone.pk}"] td.age')
    live_age = page.locator(f'tr[data-id="{waiting.pk}"] td.age')
    assert ended_age.get_attribute("data-ended") is not None
    assert ended_age.inner_text() == "0s\nnever ran"
    before = live_age.inner_text()
    # The list's clock ticks every 5 s: wait for it to move the live session's age.
    page.wait_for_function(
        "([id, before]) => document.querySelector(`tr[data-id='${id}'] td.age`).textContent !== before",
        arg=[str(waiting.pk), before],
        timeout=15_000,
    )
    assert ended_age.inner_text() == "0s\nnever ran"
    shot(page, "list-ended-age-stopped")

    page.goto(f"{live_server_url}/sessions/{gone.pk}/")
    page.wait_for_function("() => window.wsReady === true")
    times = page.inner_text("#d-time")
    assert "Age\n0s\nended before it ran" in times, times
    assert "Ended" in times
    assert "Lifetime limit" not in times  # limits are for sessions that may still run
    shot(page, "detail-ended-age")
