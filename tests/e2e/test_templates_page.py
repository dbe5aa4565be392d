"""The Templates page in a real browser: make a template with a sub-role
override, list it, edit it, export it and import the export back, see an
import's error with its line, and launch from a role template, whose dialog
lists the roles and totals the kernels as the launch creates them.

Personas: ``alice`` owns her templates; ``bob`` sees a template the admins
shared, which he may launch and copy but not change. No agent is needed:
sessions launched here wait. Screenshots go to test-artifacts/e2e/<test>/.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MIB = 2**20
UNEVEN = {
    "image": "bai-kernel/minimal:1",
    "resources": {"cpu": "0.25", "mem": "256m"},
    "roles": {"main": {"resources": {"mem": "512m"}}, "sub": {"replicas": 2}},
}


def _orm(call, *args, **kwargs):
    """Run an ORM call off this thread, where Playwright's sync API keeps an event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()


def _api(page, path: str):
    """GET an API path as the page's user (the ORM is not usable on Playwright's thread)."""
    return page.evaluate(
        "async (path) => { const r = await fetch(path, {headers: {Accept: 'application/json'}});"
        " return {status: r.status, text: await r.text()}; }",
        path,
    )


def _templates(page) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(_api(page, "/api/v1/templates/")["text"])}


def _open_templates(page, live_server_url: str) -> None:
    page.click("nav.topnav >> text=Templates")
    page.wait_for_url(f"{live_server_url}/templates/")
    page.wait_for_function("() => window.templatesReady === true")


def _full_shot(shot, page, step: str) -> None:
    page.evaluate("window.scrollTo(0, 0)")  # else the sticky bar lands mid-page in the picture
    shot(page, step, full_page=True)


def _saved(page, live_server_url: str) -> None:
    page.click("#tpl-save")
    page.wait_for_url(f"{live_server_url}/templates/?saved=*")
    page.wait_for_function("() => window.templatesReady === true")


def test_a_user_makes_a_template_with_a_sub_role_edits_it_and_imports_its_export_back(
    live_server_url, images, users, login, shot, tmp_path
):
    page = login("alice", screenshot=False)
    _open_templates(page, live_server_url)
    assert page.is_visible("#templates-empty")
    shot(page, "list-empty")

    page.click("#template-new")
    page.wait_for_function("() => window.formReady === true")
    page.fill("#t-name", "trainer")
    page.fill("#t-description", "main on Python, two busybox workers")
    page.select_option("#t-image", "bai-kernel/python:2")
    page.check('input[name=cluster_mode][value="multi-node"]', force=True)
    page.fill("#t-size", "3")
    assert page.input_value("#t-replicas") == "2"  # the sub replicas follow the cluster size
    page.fill("#t-cpu", "0.5")
    page.fill("#t-mem", "256m")
    page.select_option("#t-sub-image", "bai-kernel/minimal:1")
    page.fill("#t-sub-mem", "2 gigs")
    page.click("#t-env-add")
    page.fill('#t-env .env-row:last-child [data-env="key"]', "MODE")
    page.fill('#t-env .env-row:last-child [data-env="value"]', "train")

    # The API's error about the sub role's memory appears beside the sub role's resources.
    page.click("#tpl-save")
    error = page.locator('.field-error[data-error-for="spec.roles.sub.resources"]')
    error.wait_for()
    assert "'2 gigs' is not a size" in error.inner_text()
    assert page.locator('[data-role="sub"] [data-field="roles.sub.resources"]').evaluate(
        "n => n.classList.contains('has-error')"
    )
    _full_shot(shot, page, "form-field-error")

    page.fill("#t-sub-mem", "128m")
    # main1 0.5 CPU · 256 MiB, and two subs of 0.5 CPU · 128 MiB.
    assert page.text_content("#t-total") == "1.5 CPU · 512 MiB"
    _full_shot(shot, page, "form-filled")
    _saved(page, live_server_url)

    row = page.locator("#templates-body tr", has_text="trainer")
    assert "Saved template “trainer”." in page.text_content("#done")
    cells = row.inner_text()
    assert "Multi Node" in cells and "3 containers" in cells
    assert "main1 0.5 CPU · 256 MiB" in cells and "sub1–sub2 0.5 CPU · 128 MiB" in cells
    assert "own" in cells
    shot(page, "list-one-template")
    saved = _templates(page)["trainer"]
    assert saved["spec"] == {
        "image": "bai-kernel/python:2",
        "type": "interactive",
        "cluster_mode": "multi-node",
        "cluster_size": 3,
        "resources": {"cpu": "0.5", "mem": "256m"},
        "env": {"MODE": "train"},
        "roles": {
            "sub": {"image": "bai-kernel/minimal:1", "resources": {"mem": "128m"}, "replicas": 2}
        },
    }

    # Edit: the form comes back as saved; main1 gets memory of its own.
    row.locator('[data-action="edit"]').click()
    page.wait_for_function("() => window.formReady === true")
    assert page.input_value("#t-name") == "trainer"
    assert page.input_value("#t-sub-mem") == "128m"
    assert page.input_value("#t-sub-image") == "bai-kernel/minimal:1"
    assert page.input_value("#t-replicas") == "2"
    assert page.get_attribute("#t-main-mem", "placeholder") == "256m"  # inherited, shown
    page.fill("#t-main-mem", "1g")
    page.fill("#t-description", "bigger main")
    assert page.text_content("#t-total") == "1.5 CPU · 1.25 GiB"
    _full_shot(shot, page, "form-edit")
    _saved(page, live_server_url)
    row = page.locator("#templates-body tr", has_text="trainer")
    assert "main1 0.5 CPU · 1 GiB" in row.inner_text()
    assert "bigger main" in row.inner_text()

    # Export as YAML: the file is the template.
    with page.expect_download() as download:
        row.locator('[data-action="export-yaml"]').click()
    exported = tmp_path / "trainer.yaml"
    download.value.save_as(exported)
    assert download.value.suggested_filename == "trainer.yaml"
    spec = _templates(page)["trainer"]["spec"]
    assert spec["roles"]["main"] == {"resources": {"mem": "1g"}}
    text = exported.read_text()
    assert yaml.safe_load(text) == {"name": "trainer", "description": "bigger main", "spec": spec}

    # Delete it (after a confirmation), then import the export back.
    row.locator('[data-action="delete"]').click()
    page.click('dialog[data-role="confirm"] [data-action="confirm"]')  # the product's dialog
    row.wait_for(state="detached")
    assert page.text_content("#status") == "Deleted template “trainer”."
    assert page.is_visible("#templates-empty")
    assert _templates(page) == {}

    page.click("#import-open")
    page.set_input_files("#import-file", str(exported))
    page.wait_for_function("() => window.importFileRead === 'trainer.yaml'")
    assert page.is_checked('input[name=format][value="yaml"]')
    shot(page, "import-dialog")
    page.click("#import-submit")
    page.wait_for_url(f"{live_server_url}/templates/?imported=*")
    page.wait_for_function("() => window.templatesReady === true")
    assert "Imported template “trainer”." in page.text_content("#done")
    imported = _templates(page)["trainer"]
    assert imported["spec"] == spec
    again = _api(page, f"/api/v1/templates/{imported['id']}/export/?format=yaml")["text"]
    assert again == text
    shot(page, "list-imported")
    assert page.js_errors == []


def test_an_import_with_a_misspelt_field_shows_the_field_and_selects_its_line(
    live_server_url, images, users, login, shot
):
    page = login("alice", screenshot=False)
    _open_templates(page, live_server_url)
    page.click("#import-open")
    document = (
        "name: training\n"
        "spec:\n"
        "  image: bai-kernel/minimal:1\n"
        "  roles:\n"
        "    sub:\n"
        "      replicas: 2\n"
        "      resoures:\n"
        "        mem: 1g\n"
    )
    page.fill("#import-document", document)
    page.click("#import-submit")
    page.wait_for_function("() => window.importState && window.importState.ok === false")
    item = page.locator('#import-errors li[data-field="spec.roles.sub.resoures"]')
    assert item.inner_text() == (
        "spec.roles.sub.resoures line 7: unknown field 'resoures' (did you mean 'resources'?)"
    )
    selected = page.eval_on_selector(
        "#import-document", "n => n.value.slice(n.selectionStart, n.selectionEnd)"
    )
    assert selected == "      resoures:"
    shot(page, "import-error")
    assert _templates(page) == {}


def test_launching_from_a_role_template_lists_the_roles_and_totals_the_real_kernels(
    live_server_url, images, users, login, shot
):
    from sessions_app.models import SessionTemplate

    template = _orm(
        SessionTemplate.objects.create, owner=users["alice"], name="uneven", spec=UNEVEN
    )
    page = login("alice", screenshot=False)
    _open_templates(page, live_server_url)
    page.locator("#templates-body tr", has_text="uneven").locator('[data-action="launch"]').click()
    page.wait_for_url(f"{live_server_url}/sessions/new/?template={template.pk}")
    page.wait_for_function("() => window.launchReady === true")
    page.locator("#launch-roles").wait_for()

    assert page.input_value("#f-template") == str(template.pk)
    roles = page.eval_on_selector_all(
        "#launch-roles-body tr", "rows => rows.map(r => r.innerText.split('\\t'))"
    )
    assert roles == [
        ["main1", "bai-kernel/minimal:1", "0.25 CPU · 512 MiB"],
        ["sub1–sub2", "bai-kernel/minimal:1", "0.25 CPU · 256 MiB each"],
    ]
    # 512 MiB + 2 × 256 MiB: not 3 × 256 MiB (768 MiB), not 3 × 512 MiB (1.5 GiB).
    assert page.text_content("#launch-total-value") == "0.75 CPU · 1 GiB"
    shot(page, "launch-dialog-roles")
    page.fill("#f-size", "4")
    assert page.text_content("#launch-total-value") == "1 CPU · 1.25 GiB"
    page.fill("#f-size", "3")

    # Save as template: the dialog's spec, with the template's roles.
    page.click("#save-tpl-open")
    page.fill("#save-tpl-name", "uneven")
    page.click("#save-tpl-submit")
    page.locator("#save-tpl-status.save-error").wait_for()
    assert "already exists" in page.text_content("#save-tpl-status")
    page.fill("#save-tpl-name", "uneven-again")
    page.press("#save-tpl-name", "Enter")
    page.wait_for_function("() => window.savedTemplate !== undefined")
    assert page.is_visible("#launch-form")  # Enter saved the template, it did not launch
    saved = page.evaluate("window.savedTemplate")
    assert saved["name"] == "uneven-again"
    assert saved["spec"]["roles"] == UNEVEN["roles"]
    assert saved["spec"]["resources"] == {"cpu": "0.25", "mem": "256m"}
    assert saved["spec"]["cluster_size"] == 3
    shot(page, "launch-dialog-saved-as-template")

    page.fill("#f-name", "uneven-1")
    page.click("#launch-submit")
    page.wait_for_function("() => window.launchState && window.launchState.status === 'PENDING'")
    session_id = page.evaluate("window.launchState.id")
    detail = json.loads(_api(page, f"/api/v1/sessions/{session_id}/")["text"])
    held = [int(k["requested_slots"]["mem"]) for k in detail["kernels"]]
    assert held == [512 * MIB, 256 * MIB, 256 * MIB]

    page.goto(f"{live_server_url}/sessions/{session_id}/")
    page.wait_for_function("() => window.detailState !== undefined")
    assert page.text_content("#d-total") == "0.75 CPU · 1 GiB in total"
    assert page.text_content('[data-role="main"]') == "main1 0.25 CPU · 512 MiB"
    assert page.text_content('[data-role="sub"]') == "sub1–sub2 0.25 CPU · 256 MiB each"
    shot(page, "detail-totals")
    assert page.js_errors == []


def test_a_shared_template_is_offered_for_launch_and_copy_but_not_for_change(
    live_server_url, images, users, admin, login, shot
):
    from sessions_app.models import SessionTemplate

    create = SessionTemplate.objects.create
    _orm(create, owner=admin, name="starter", is_shared=True, spec=UNEVEN)
    _orm(create, owner=users["alice"], name="alices", spec={})
    page = login("bob", screenshot=False)
    _open_templates(page, live_server_url)
    names = page.eval_on_selector_all("#templates-body tr", "rows => rows.map(r => r.dataset.name)")
    assert names == ["starter"]
    row = page.locator("#templates-body tr", has_text="starter")
    assert "shared" in row.inner_text() and "by root" in row.inner_text()
    assert row.locator('[data-action="edit"], [data-action="delete"]').count() == 0
    shot(page, "list-shared")

    row.locator('[data-action="copy"]').click()
    page.wait_for_function("() => window.formReady === true")
    assert page.input_value("#t-name") == "starter-copy"
    assert page.input_value("#t-main-mem") == "512m"
    assert page.is_hidden("#t-shared-field")  # only admins share
    _saved(page, live_server_url)
    assert sorted(_templates(page)) == ["starter", "starter-copy"]


NO_SSH_SERVER = (
    "`ssh sub1` will not work: the sub kernels' image bai-kernel/minimal:1 has no SSH server; "
    "choose an image with SSH for them if main1 must reach them"
)


def test_a_sub_image_without_ssh_is_warned_of_in_the_form_the_list_and_the_launch_dialog(
    live_server_url, images, users, make_agent, login, shot
):
    """Python has SSH, the busybox image has none: `ssh sub1` cannot work with busybox subs.
    Said, never refused: the template saves and launches."""
    _orm(make_agent, "node-a", cpu="4", mem=8 * 2**30)
    page = login("alice", screenshot=False, viewport={"width": 1366, "height": 900})
    _open_templates(page, live_server_url)
    page.click("#template-new")
    page.wait_for_function("() => window.formReady === true")
    page.fill("#t-name", "workers")
    page.select_option("#t-image", "bai-kernel/python:2")
    page.fill("#t-size", "2")
    page.fill("#t-cpu", "0.5")
    page.fill("#t-mem", "256m")
    warning = page.locator("#t-ssh-warning")
    assert warning.is_hidden()  # Python everywhere: ssh works
    page.select_option("#t-sub-image", "bai-kernel/minimal:1")
    assert warning.is_visible() and warning.inner_text() == NO_SSH_SERVER
    warning.scroll_into_view_if_needed()
    shot(page, "form-warns-1366")
    page.set_viewport_size({"width": 390, "height": 844})
    warning.scroll_into_view_if_needed()
    box = warning.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    shot(page, "form-warns-390", axe_exclude=[".topbar"])  # the top bar: issue 24 item 6
    page.set_viewport_size({"width": 1366, "height": 900})
    _saved(page, live_server_url)  # saved all the same

    row = page.locator("#templates-body tr", has_text="workers")
    assert row.locator('[data-role="warning"]').inner_text() == f"⚠ {NO_SSH_SERVER}"
    assert _templates(page)["workers"]["warnings"] == [NO_SSH_SERVER]
    shot(page, "list-warns")

    row.locator('[data-action="launch"]').click()
    page.wait_for_function("() => window.launchReady === true")
    page.wait_for_function(
        "() => window.launchFit && !window.launchFit.pending && window.launchFit.verdict === 'start_now'"
    )
    fit_warnings = page.locator("#fit-warnings")
    assert fit_warnings.is_visible() and fit_warnings.inner_text() == NO_SSH_SERVER
    fit_warnings.scroll_into_view_if_needed()
    shot(page, "launch-preview-warns")
    assert page.js_errors == []
