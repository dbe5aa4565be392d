"""The Data page's SFTP sessions in Chromium, with no Docker: the agent's part
(placing the kernel, publishing its port and host key, ending it) is played on
the database rows, as its reports would leave them.

- "Starting an SFTP session…" gives way once the session serves;
- the panel shows the server's host key fingerprint (the API has it);
- ending your own session is news, not a red error; a session that could not
  start is an error.

Persona: ``alice``. Screenshots go to test-artifacts/e2e/<test>/, at 1366 and 390 px.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_launch_dialog import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
FINGERPRINT = "SHA256:q3Ruw8YQ0nM3zv0p9kqk1yEoUzvQe8f0x3E3v7Yt4Ls"


@pytest.fixture
def inbox(users, images, make_agent):
    from sessions_app import services
    from sessions_app.kernel_images import SFTP_IMAGE
    from sessions_app.models import Image

    make_agent("node-a", cpu="2", mem=8 * 2**30)
    Image.objects.get_or_create(reference=SFTP_IMAGE)
    return services.folder_create(owner=users["alice"], name="inbox")


def _serves(session_id):
    """The agent's report: main1 runs, its port published with this host key."""
    from django.utils import timezone

    from sessions_app.models import Kernel, Session

    Kernel.objects.filter(session_id=session_id).update(
        status="RUNNING",
        published_host="127.0.0.1",
        published_port=30022,
        host_key_fingerprint=FINGERPRINT,
    )
    Session.objects.filter(pk=session_id).update(status="RUNNING", started_at=timezone.now())


def _ended(session_id, status, reason):
    from django.utils import timezone

    from sessions_app.models import Kernel, Session

    Kernel.objects.filter(session_id=session_id).update(status=status, status_reason=reason)
    Session.objects.filter(pk=session_id).update(
        status=status, status_reason=reason, terminated_at=timezone.now()
    )


def _open_sftp(page, live_server_url):
    page.goto(f"{live_server_url}/folders/")
    page.wait_for_function("() => window.foldersReady === true")
    page.check('#folders-body tr[data-name="inbox"] input[type="checkbox"]')
    page.click("#sftp-open")
    panel = page.locator("#sftp-list .sftp-session").first
    panel.wait_for()
    assert page.inner_text("#status") == "Starting an SFTP session on 1 folder(s)…"
    return panel, panel.get_attribute("data-id")


def test_an_sftp_session_says_when_it_serves_shows_its_host_key_and_ends_without_an_error(
    inbox, live_server_url, login, shot
):
    page = login("alice", screenshot=False, viewport={"width": 1366, "height": 900})
    panel, session_id = _open_sftp(page, live_server_url)
    orm(_serves, session_id)
    panel.locator('[data-fact="port"]').wait_for()
    assert panel.locator('[data-fact="fingerprint"]').inner_text() == FINGERPRINT
    assert "host key" in panel.inner_text()
    name = page.evaluate(
        "id => document.querySelector(`.sftp-session[data-id='${id}'] h3 a`).textContent",
        session_id,
    )
    # The folder's row names the SFTP session that mounts it, without a reload.
    mounted_by = page.locator('#folders-body tr[data-name="inbox"] a[href^="/sessions/"]')
    assert mounted_by.inner_text() == name
    assert (
        page.inner_text("#status")
        == f"SFTP session {name} is ready: connect as shown under “SFTP sessions”."
    )
    assert "Starting" not in page.inner_text("main")
    panel.scroll_into_view_if_needed()
    shot(page, "sftp-ready-with-host-key-1366")

    page.set_viewport_size({"width": 390, "height": 844})
    panel.scroll_into_view_if_needed()
    for part in (
        panel,
        panel.locator('[data-action="terminate"]'),
        panel.locator('[data-fact="fingerprint"]'),
    ):
        box = part.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    # The top bar at 390 px is another change's (issue 24, item 6).
    shot(page, "sftp-ready-with-host-key-390", axe_exclude=[".topbar"])
    page.set_viewport_size({"width": 1366, "height": 900})

    panel.locator('[data-action="terminate"]').click()
    page.wait_for_function(
        "() => document.getElementById('status').textContent === 'Terminating the SFTP session.'"
    )
    orm(_ended, session_id, "TERMINATED", "terminated by alice")
    page.wait_for_selector(f'.sftp-session[data-id="{session_id}"][data-status="TERMINATED"]')
    page.wait_for_function("() => document.getElementById('status').textContent.includes(' ended')")
    assert page.is_hidden("#error")  # no red banner for an end the user asked for
    assert page.inner_text("#status") == f"SFTP session {name} ended: terminated by alice."
    shot(page, "sftp-ended-as-asked")
    assert page.js_errors == []


def test_an_sftp_session_that_could_not_start_is_an_error(inbox, live_server_url, login, shot):
    page = login("alice", screenshot=False)
    panel, session_id = _open_sftp(page, live_server_url)
    orm(_ended, session_id, "CANCELLED", "no agent has room for it")
    page.wait_for_selector("#error:not([hidden])")
    assert page.inner_text("#error").endswith("could not start: no agent has room for it")
    assert page.is_hidden("#status")
    shot(page, "sftp-could-not-start")


def _ending(session_id):
    """The agent's report while the container stops: TERMINATING, its port gone."""
    from sessions_app.models import Kernel, Session

    Kernel.objects.filter(session_id=session_id).update(status="TERMINATING")
    Session.objects.filter(pk=session_id).update(status="TERMINATING")


def test_an_ending_sftp_session_says_so_and_offers_no_terminate(
    inbox, live_server_url, login, shot
):
    page = login("alice", screenshot=False, viewport={"width": 1366, "height": 900})
    panel, session_id = _open_sftp(page, live_server_url)
    orm(_serves, session_id)
    panel.locator('[data-fact="port"]').wait_for()
    panel.locator('[data-action="terminate"]').click()
    orm(_ending, session_id)
    page.wait_for_selector(f'.sftp-session[data-id="{session_id}"][data-status="TERMINATING"]')
    panel = page.locator(f'.sftp-session[data-id="{session_id}"]')
    assert panel.locator('[data-role="ending"]').inner_text() == "Ending the SFTP session…"
    assert "Starting" not in panel.inner_text()
    assert panel.locator('[data-action="terminate"]').count() == 0
    shot(page, "sftp-ending")
    assert page.js_errors == []
