"""Layout in Chromium at a laptop's width (1366 px) and a phone's (390 px): every column
of the lists is in view (the sessions list's Terminate, the templates list's Delete,
the admin agents list's usage and heartbeat), the navigation has a menu on a phone,
and the Data page names the sessions that mount a folder. No agent is needed.

Personas: ``alice`` owns the sessions, templates and folders; the superuser ``admin``
sees the agents list. Screenshots go to test-artifacts/e2e/<test>/.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LAPTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}


def _orm(call, *args, **kwargs):
    """An ORM call off this thread, where Playwright's sync API keeps an event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()


def _out_of_view(page, selector: str) -> list[str]:
    """The cells of the table's first rows (headers included) that are not wholly inside
    the window, or that a scroll container hides: what a person cannot see without
    scrolling sideways."""
    return page.evaluate(
        """(selector) => {
          const table = document.querySelector(selector);
          const hidden = [];
          const cells = [...table.querySelectorAll("tr:first-child > *, thead th")];
          for (const cell of cells) {
            if (!cell.getClientRects().length) continue; // not drawn at this width (a hidden header)
            const box = cell.getBoundingClientRect();
            let clip = { left: 0, right: document.documentElement.clientWidth };
            for (let p = cell.parentElement; p; p = p.parentElement) {
              const style = getComputedStyle(p);
              if (style.overflowX !== "visible") {
                const b = p.getBoundingClientRect();
                clip = { left: Math.max(clip.left, b.left), right: Math.min(clip.right, b.right) };
              }
            }
            if (box.left < clip.left - 1 || box.right > clip.right + 1) {
              hidden.push((cell.innerText || cell.textContent).trim().slice(0, 30) || cell.tagName);
            }
          }
          return hidden;
        }""",
        selector,
    )


def _in_view_on_a_laptop_and_a_phone(page, shot, name: str, table: str, button: str) -> None:
    """Every column of ``table`` and the ``button`` of a row in view at 1366 px, then every
    cell of its first row at 390 px; a screenshot at each width."""
    shot(page, f"{name}-1366")
    assert _out_of_view(page, table) == []
    box = page.locator(button).bounding_box()
    assert box is not None and box["x"] + box["width"] <= LAPTOP["width"]

    page.set_viewport_size(PHONE)
    shot(page, f"{name}-390", full_page=True)
    assert _out_of_view(page, table) == []
    assert page.js_errors == []


@pytest.fixture
def sessions(users, images, group, agent):
    """alice's sessions: a running one with an app (the widest Actions cell), a pending
    cluster session, an ended one."""
    from sessions_app import kernel_images
    from sessions_app.models import Kernel, Session

    image = images["bai-kernel/python:2"]
    image.service_ports = [kernel_images.JUPYTER_APP]
    image.save(update_fields=["service_ports"])
    alice = users["alice"]
    made = {}
    for name, status, size in (
        ("notebook-with-a-long-name", "RUNNING", 1),
        ("training-cluster", "PENDING", 3),
        ("finished-job", "TERMINATED", 1),
    ):
        session = Session.objects.create(
            owner=alice,
            name=name,
            image=image,
            resource_group=group,
            status=status,
            cluster_size=size,
            cluster_mode="multi-node" if size > 1 else "single-node",
            requested_slots={"cpu": "2", "mem": str(4 * 2**30), "cuda.device": "1"},
            status_reason="waiting: no agent has 1 cuda.device free" if status == "PENDING" else "",
        )
        for rank in range(size):
            Kernel.objects.create(
                id=session.pk if rank == 0 else None,
                session=session,
                cluster_role="main" if rank == 0 else "sub",
                cluster_idx=max(rank, 1),
                local_rank=rank,
                cluster_hostname="main1" if rank == 0 else f"sub{rank}",
                image=image.reference,
                agent=None if status == "PENDING" else agent,
                status=status,
            )
        made[name] = session
    return made


def test_the_sessions_list_shows_every_column_on_a_laptop_and_a_phone(
    sessions, live_server_url, login, shot
):
    page = login("alice", viewport=LAPTOP, screenshot=False)
    page.wait_for_selector("#sessions-body tr")
    page.click('#filter [data-filter="all"]')
    terminate = 'tr:has-text("notebook-with-a-long-name") [data-action="terminate"]'
    _in_view_on_a_laptop_and_a_phone(page, shot, "sessions", "#sessions-table", terminate)


@pytest.fixture
def templates(users, images):
    from sessions_app.models import SessionTemplate

    alice = users["alice"]
    spec = {
        "image": "bai-kernel/python:2",
        "cluster_mode": "multi-node",
        "cluster_size": 3,
        "resources": {"cpu": "1", "mem": "2g"},
        "roles": {
            "main": {"image": "bai-kernel/python:2", "resources": {"cpu": "2", "mem": "4g"}},
            "sub": {"image": "bai-kernel/minimal:1", "replicas": 2},
        },
    }
    for name in ("distributed-training-with-a-long-name", "notebook"):
        SessionTemplate.objects.create(
            owner=alice,
            name=name,
            description="Two workers and a notebook, for training the big model on every GPU",
            spec=spec,
        )
    SessionTemplate.objects.create(
        owner=None, name="shared-one", is_shared=True, spec={"image": "bai-kernel/minimal:1"}
    )


def test_the_templates_list_shows_every_column_on_a_laptop_and_a_phone(
    templates, live_server_url, login, shot
):
    page = login("alice", viewport=LAPTOP, screenshot=False)
    page.goto(f"{live_server_url}/templates/")
    page.wait_for_selector("#templates-body tr")
    delete = '#templates-body tr[data-name="notebook"] [data-action="delete"]'
    _in_view_on_a_laptop_and_a_phone(page, shot, "templates", "#templates-table", delete)


def test_the_navigation_opens_as_a_menu_on_a_phone(users, live_server_url, login, shot):
    page = login("alice", viewport=PHONE, screenshot=False)
    nav = page.locator("nav.topnav")
    # Nothing of the bar is cut off or pushes the page sideways.
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    menu = page.locator("#nav-menu-toggle")
    assert menu.is_visible()
    assert not nav.locator("text=Serving").is_visible()
    shot(page, "menu-closed")

    menu.click()
    for name in ("Sessions", "Data", "Serving", "Templates", "API", "Profile"):
        link = nav.get_by_role("link", name=name, exact=True)
        assert link.is_visible(), name
        box = link.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], name
    assert menu.get_attribute("aria-expanded") == "true"
    shot(page, "menu-open")
    nav.get_by_role("link", name="Templates", exact=True).click()
    page.wait_for_url(f"{live_server_url}/templates/")
    shot(page, "templates-page-menu-closed")

    # On a laptop the links are in the bar, and there is no menu button.
    page.set_viewport_size(LAPTOP)
    assert not page.locator("#nav-menu-toggle").is_visible()
    assert nav.get_by_role("link", name="Serving", exact=True).is_visible()
    assert page.js_errors == []


def test_no_page_pushes_a_phone_screen_sideways(sessions, users, live_server_url, login, shot):
    """At 390 px the session page (its kernels table), the terminal's bar, the profile
    (its tokens table) and a folder's page (New directory, Upload files) stay within the
    screen: a wide table scrolls in its own box, and nothing in it (a screen-reader
    label) widens the page."""
    from sessions_app import services, tokens

    _orm(tokens.token_create, user=users["alice"])
    folder = _orm(services.folder_create, owner=users["alice"], name="results")
    session = sessions["notebook-with-a-long-name"]
    page = login("alice", viewport=PHONE, screenshot=False)
    for name, path in (
        ("session", f"/sessions/{session.pk}/"),
        ("terminal", f"/sessions/{session.pk}/terminal/"),
        ("profile", "/profile/"),
        ("folder", f"/folders/{folder.pk}/"),
    ):
        page.goto(f"{live_server_url}{path}")
        page.wait_for_load_state("networkidle")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        shot(page, f"{name}-390", full_page=True)
        assert width <= PHONE["width"], (name, width)


def test_the_data_page_names_each_session_that_mounts_a_folder(
    users, images, group, live_server_url, login, shot
):
    from sessions_app import services
    from sessions_app.models import Session

    def world():
        alice = users["alice"]
        folder = services.folder_create(owner=alice, name="results")
        for name in ("first-job", "second-job"):
            session = Session.objects.create(
                owner=alice, name=name, image=images["bai-kernel/python:2"], resource_group=group
            )
            session.mounts.set([folder])
        return {s.name: str(s.pk) for s in folder.sessions.all()}

    ids = _orm(world)
    page = login("alice", viewport=LAPTOP, screenshot=False)
    page.goto(f"{live_server_url}/folders/")
    page.wait_for_function("() => window.foldersReady === true")
    cell = page.locator('#folders-body tr[data-name="results"] [data-role="mounted-by"]')
    assert cell.inner_text().strip() == "first-job, second-job"
    links = cell.locator("a")
    assert [links.nth(i).inner_text() for i in range(links.count())] == ["first-job", "second-job"]
    assert links.nth(1).get_attribute("href") == f"/sessions/{ids['second-job']}/"
    shot(page, "data-1366")
    assert _out_of_view(page, "#folders-table") == []
    page.set_viewport_size(PHONE)
    shot(page, "data-390", full_page=True)
    assert _out_of_view(page, "#folders-table") == []
    assert page.js_errors == []


def test_the_page_helpers_nest_children_and_write_sizes_as_bai_common_does(
    users, live_server_url, login
):
    from bai_common import units

    page = login("alice", viewport=LAPTOP, screenshot=False)
    html = page.evaluate(
        """async () => {
          const { el } = await import("/static/js/common.js");
          return el("p", {}, ["a", [null, ["b", [false, el("i", {}, "c")]], undefined], 0]).outerHTML;
        }"""
    )
    assert html == "<p>ab<i>c</i>0</p>"

    sizes = [0, 1000, 1536, 200000, 2**30, 5 * 2**30 // 4, 24684092 * 1024, 2**30 + 1, 3 * 2**50]
    shown = page.evaluate(
        """async (sizes) => {
          const { fmtMem } = await import("/static/js/common.js");
          return sizes.map(fmtMem);
        }""",
        sizes,
    )
    assert shown == [units.format_size_shown(size) for size in sizes]


def test_the_admin_agents_list_shows_every_column_and_readable_sizes(
    make_agent, admin_page, live_server_url, shot
):
    from django.utils import timezone

    from sessions_app.models import Agent

    def world():
        # A node's memory as a machine reports it: not a whole number of GiB.
        make_agent(
            "gpu-node-with-a-long-hostname-1",
            cpu="32",
            mem=24684092 * 1024,
            slots={"cuda.device": "4"},
            occupied_slots={"cpu": "24", "mem": str(2**30), "cuda.device": "4"},
            hostname="gpu-node-with-a-long-hostname-1.cluster.example.internal",
        )
        make_agent(
            "cpu-node-1", cpu="8", mem=16 * 2**30, occupied_slots={"cpu": "2.5"}, schedulable=False
        )
        Agent.objects.update(last_heartbeat_at=timezone.now())

    _orm(world)
    page = admin_page
    page.set_viewport_size(LAPTOP)
    page.goto(f"{live_server_url}/admin/sessions_app/agent/")
    page.wait_for_selector("#result_list")
    row = page.locator("#result_list tr", has_text="gpu-node-with-a-long-hostname-1").first
    assert "1 / 23.5 GiB" in row.inner_text(), row.inner_text()
    assert "KiB" not in page.inner_text("#result_list")
    drained = page.locator("#result_list tr", has_text="cpu-node-1").first
    assert "not schedulable" in drained.inner_text()
    shot(page, "agents-1366")
    assert _out_of_view(page, "#result_list") == []

    page.goto(f"{live_server_url}/admin/sessions_app/agent/gpu-node-with-a-long-hostname-1/change/")
    assert "32 cpu, 23.5 GiB mem, 4 cuda.device" in page.inner_text("#content")
    shot(page, "agent-page")
    assert page.js_errors == []


def test_the_admin_forms_take_checkboxes_lines_and_sizes_and_nothing_is_missing(
    group, admin_page, live_server_url, shot
):
    from sessions_app.models import Image, ResourceGroup, ResourcePolicy

    page = admin_page
    page.set_viewport_size(LAPTOP)
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)

    page.goto(f"{live_server_url}/admin/sessions_app/resourcegroup/{group.pk}/change/")
    page.uncheck('input[name="allowed_session_types"][value="system"]')
    page.fill("#id_agent_selector_options", "spread = true")
    page.click("input[name=_continue]")
    page.wait_for_selector(".errornote")
    assert "option 'spread': unknown option" in page.inner_text("#content")
    shot(page, "group-options-refused", full_page=True)
    page.fill("#id_agent_selector_options", "")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    shot(page, "group-saved", full_page=True)
    types = _orm(lambda: ResourceGroup.objects.get(pk=group.pk).allowed_session_types)
    assert types == ["interactive", "batch", "inference"]

    page.goto(f"{live_server_url}/admin/sessions_app/image/add/")
    page.fill("#id_reference", "team/notebook:1")
    page.fill("#id_service_ports", "jupyter http 8888\ntensorboard http 80")
    page.click("input[name=_continue]")
    page.wait_for_selector(".errornote")
    assert "line 2: port must be a whole number from 1024 to 65535" in page.inner_text("#content")
    shot(page, "image-apps-refused", full_page=True)
    page.fill("#id_service_ports", "jupyter http 8888\ntensorboard http 6006")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    ports = _orm(lambda: Image.objects.get(reference="team/notebook:1").service_ports)
    assert [p["port"] for p in ports] == [8888, 6006]

    page.goto(f"{live_server_url}/admin/sessions_app/resourcepolicy/add/")
    page.fill("#id_name", "students")
    page.fill("#id_total_resource_slots_1", "64m")
    page.fill("#id_max_folder_bytes", "2 GiB")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert page.input_value("#id_total_resource_slots_1") == "64 MiB"
    assert page.input_value("#id_max_folder_bytes") == "2 GiB"
    memory = page.locator(".bai-slot", has=page.locator("#id_total_resource_slots_1"))
    assert "GiB" not in memory.inner_text()  # the unit is in the box, once
    shot(page, "policy-sizes", full_page=True)
    policy = _orm(lambda: ResourcePolicy.objects.get(name="students"))
    assert policy.max_folder_bytes == 2 * 2**30

    assert missing == []  # not even /favicon.ico
    assert page.js_errors == []
