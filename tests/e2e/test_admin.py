"""The admin pages an operator uses, in Chromium against a live server (no agent needed).

Every page leaves a screenshot under test-artifacts/e2e/<test>/.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def db_call():
    """``db_call(fn)``: fn() on another thread. Playwright's sync API runs an event loop on
    this one, where Django refuses to touch the database."""
    from django.db import connections

    with ThreadPoolExecutor(1) as pool:
        yield lambda fn: pool.submit(fn).result()
        pool.submit(lambda: connections.close_all()).result()  # that thread's own connection


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state()
    assert page.locator("#content").count() == 1, page.url


def test_an_admin_types_a_policy_in_units_and_sets_a_users_policy_on_their_page(
    alice, group, admin_page, live_server_url, db_call, shot
):
    from sessions_app.models import ResourcePolicy, UserResourcePolicy

    page = admin_page
    _open(page, f"{live_server_url}/admin/sessions_app/resourcepolicy/add/")
    page.fill("#id_name", "gpu-team")
    page.fill("#id_total_resource_slots_0", "16")
    page.fill("#id_total_resource_slots_1", "64g")
    page.fill("#id_total_resource_slots_2", "2")
    page.fill("#id_idle_timeout", "30m")
    page.fill("#id_max_session_lifetime", "1d")
    shot(page, "policy-typed-in-units", full_page=True)
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")

    # The page shows back what was typed, in the same units.
    assert page.input_value("#id_total_resource_slots_1") == "64 GiB"
    assert page.input_value("#id_idle_timeout") == "30 min"
    assert page.input_value("#id_max_session_lifetime") == "1 d"
    shot(page, "policy-saved", full_page=True)
    policy = db_call(lambda: ResourcePolicy.objects.get(name="gpu-team"))
    assert policy.total_resource_slots == {"cpu": "16", "mem": str(64 * 2**30), "cuda.device": "2"}
    assert policy.idle_timeout == timedelta(minutes=30)

    # A bad amount is refused with the slot's name.
    page.fill("#id_total_resource_slots_1", "lots")
    page.click("input[name=_continue]")
    page.wait_for_selector(".errornote")
    assert "Memory: 'lots' is not a size" in page.inner_text("#content")
    shot(page, "policy-bad-memory", full_page=True)

    # The user's own page sets their policy.
    _open(page, f"{live_server_url}/admin/auth/user/{alice.pk}/change/")
    page.locator("#resource_policy-group").scroll_into_view_if_needed()
    page.select_option("#id_resource_policy-0-policy", label="gpu-team")
    shot(page, "user-page-policy-chosen")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert db_call(lambda: UserResourcePolicy.objects.get(user=alice).policy) == policy
    page.locator("#resource_policy-group").scroll_into_view_if_needed()
    shot(page, "user-page-policy-saved")

    # Deleting it there goes back to the default policy, without an error page.
    page.check("#id_resource_policy-0-DELETE")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert not db_call(UserResourcePolicy.objects.filter(user=alice).exists)
    assert page.js_errors == []


@pytest.fixture
def agents(make_agent):
    make_agent(
        "gpu-node-1",
        cpu="32",
        mem=128 * 2**30,
        slots={"cuda.device": "4"},
        occupied_slots={"cpu": "24", "mem": str(40 * 2**30), "cuda.device": "4"},
    )
    make_agent("cpu-node-1", cpu="8", mem=16 * 2**30, occupied_slots={"cpu": "2.5"})
    lost = make_agent("cpu-node-2", cpu="8", mem=16 * 2**30)
    type(lost).objects.filter(pk=lost.pk).update(status="LOST")


def test_the_agents_list_shows_used_and_capacity_as_bars(agents, admin_page, live_server_url, shot):
    page = admin_page
    _open(page, f"{live_server_url}/admin/sessions_app/agent/")

    bars = page.locator("table#result_list meter")
    assert bars.count() == 7
    row = page.locator("table#result_list tr", has_text="gpu-node-1")
    assert "24 / 32 cores" in row.inner_text() and "40 / 128 GiB" in row.inner_text()
    assert "4 / 4" in row.inner_text()
    box = row.locator("meter").first.bounding_box()
    assert box is not None and box["width"] > 40  # a bar a person can see, from admin.css
    shot(page, "agents-list-with-bars")

    _open(page, f"{live_server_url}/admin/sessions_app/agent/gpu-node-1/change/")
    assert "32 cpu, 128 GiB mem, 4 cuda.device" in page.inner_text("#content")
    shot(page, "agent-page", full_page=True)
    assert page.js_errors == []


@pytest.fixture
def running_session(alice, image, group, agent):
    from sessions_app.models import Kernel, Session, Status

    session = Session.objects.create(
        owner=alice, name="training", image=image, resource_group=group, status=Status.RUNNING
    )
    Kernel.objects.create(
        id=session.pk,
        session=session,
        cluster_role="main",
        cluster_idx=1,
        local_rank=0,
        cluster_hostname="main1",
        image=image.reference,
        requested_slots={"cpu": "1"},
        agent=agent,
        status=Status.RUNNING,
    )
    session.events.create(to_status=Status.PENDING, reason="created; waiting for the scheduler")
    return session


def test_a_session_cannot_be_deleted_and_its_page_says_why(
    running_session, admin_page, live_server_url, db_call, shot
):
    from sessions_app.models import Session

    session = running_session
    page = admin_page
    _open(page, f"{live_server_url}/admin/sessions_app/session/")
    assert "never deleted here" in page.inner_text("#audit-note")
    options = page.eval_on_selector_all("select[name=action] option", "os => os.map(o => o.value)")
    assert "delete_selected" not in options
    shot(page, "sessions-list-no-delete")

    _open(page, f"{live_server_url}/admin/sessions_app/session/{session.pk}/change/")
    assert "audit history" in page.inner_text("#audit-note")
    assert page.locator("a.deletelink").count() == 0
    shot(page, "session-page-note", full_page=True)

    response = page.goto(f"{live_server_url}/admin/sessions_app/session/{session.pk}/delete/")
    assert response.status == 403
    assert db_call(Session.objects.filter(pk=session.pk).exists)


@pytest.fixture
def presets(group):
    """The defaults a fresh install has (tests with transaction=True flush them)."""
    from sessions_app.models import ResourcePreset

    for order, (name, cpu, gib) in enumerate([("small", 1, 2), ("medium", 2, 4), ("large", 4, 8)]):
        ResourcePreset.objects.get_or_create(
            name=name,
            defaults={"resource_slots": {"cpu": str(cpu), "mem": str(gib * 2**30)}, "order": order},
        )


def test_an_admin_makes_a_preset_and_a_group_pending_timeout_in_units(
    group, presets, admin_page, live_server_url, db_call, shot
):
    from sessions_app.models import ResourceGroup, ResourcePreset

    page = admin_page
    _open(page, f"{live_server_url}/admin/sessions_app/resourcepreset/")
    assert "1 cpu, 2 GiB mem" in page.inner_text("#result_list")
    shot(page, "presets-list")

    _open(page, f"{live_server_url}/admin/sessions_app/resourcepreset/add/")
    page.fill("#id_name", "gpu-small")
    page.fill("#id_description", "One GPU for a notebook")
    page.fill("#id_resource_slots_0", "4")
    page.fill("#id_resource_slots_1", "16")
    page.fill("#id_resource_slots_2", "1")
    page.select_option("#id_resource_group", label="default")
    shot(page, "preset-add", full_page=True)
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    preset = db_call(lambda: ResourcePreset.objects.get(name="gpu-small"))
    assert preset.resource_slots == {"cpu": "4", "mem": str(16 * 2**30), "cuda.device": "1"}
    shot(page, "presets-list-with-new")

    _open(page, f"{live_server_url}/admin/sessions_app/resourcegroup/{group.pk}/change/")
    page.fill("#id_pending_timeout", "1h30m")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert page.input_value("#id_pending_timeout") == "1 h 30 min"
    assert db_call(lambda: ResourceGroup.objects.get(pk=group.pk).pending_timeout) == timedelta(
        minutes=90
    )
    shot(page, "group-pending-timeout", full_page=True)
    assert page.js_errors == []
