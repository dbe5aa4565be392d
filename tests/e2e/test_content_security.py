"""Every page renders under the Content-Security-Policy, from the server's own
host only: no policy violation, no request to another host; and, as on every
screenshot, no serious accessibility violation (axe-core).

Persona: ``root``, an admin, sees every kind of page (his own sessions, his
profile, the admin and the API docs). No agent is needed: his session waits.
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WATCH_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || "inline"}`);
});
"""


# Every admin list an admin reaches from the index, and the forms that add.
ADMIN_LISTS = [
    "sessions_app/resourcegroup",
    "sessions_app/agent",
    "sessions_app/image",
    "sessions_app/resourcepolicy",
    "sessions_app/userresourcepolicy",
    "sessions_app/sessiontemplate",
    "sessions_app/datafolder",
    "sessions_app/kernel",
    "sessions_app/sessionevent",
    "auth/user",
    "auth/group",
    "axes/accessattempt",
]
ADMIN_FORMS = [
    "sessions_app/resourcegroup",
    "sessions_app/agent",
    "sessions_app/image",
    "sessions_app/resourcepolicy",
    "sessions_app/sessiontemplate",
    "auth/user",
]


@pytest.fixture
def root(admin, settings):
    """The admin persona, with a password the live server can check (default hashers)."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    admin.set_password("root-pass-123")
    admin.save(update_fields=["password"])
    return admin


@pytest.fixture
def waiting_session(root, image):
    from sessions_app import services

    return services.session_create(
        owner=root, spec={"image": image.reference, "name": "waits", "resources": {"cpu": "1"}}
    )


def test_every_page_renders_under_the_policy_from_its_own_host_only(
    root, waiting_session, live_server_url, browser, own_origin_guard, shot
):
    # The database is set up before the browser starts: Playwright's loop makes this thread async.
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.add_init_script(WATCH_VIOLATIONS)
    console: list[str] = []
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("console", lambda m: console.append(m.text))
    page.on("pageerror", lambda exc: console.append(f"page error: {exc}"))
    violations: list[str] = []

    def visit(path: str, step: str, ready: str | None = None) -> None:
        response = page.goto(f"{live_server_url}{path}")
        assert response is not None and response.ok, f"{path}: {response and response.status}"
        assert "default-src 'self'" in response.headers["content-security-policy"]
        if ready:
            page.wait_for_function(ready)
        shot(page, step, full_page=True)
        violations.extend(f"{path}: {v}" for v in page.evaluate("window.cspViolations"))

    visit("/login/", "login")
    for _ in range(5):  # another name, locked out from here: the lockout page is a page too
        page.fill("#id_username", "mallory")
        page.fill("#id_password", "guess")
        page.click("button[type=submit]")
        page.wait_for_load_state()
    page.wait_for_selector("#lockout")
    shot(page, "lockout")
    violations.extend(f"lockout: {v}" for v in page.evaluate("window.cspViolations"))
    page.goto(f"{live_server_url}/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server_url}/")
    page.wait_for_function("() => window.wsReady === true")

    visit("/", "sessions", "() => window.wsReady === true")
    visit("/sessions/new/", "launch-dialog", "() => window.launchReady === true")
    session = waiting_session.pk
    visit(f"/sessions/{session}/", "session-detail", "() => window.detailState !== undefined")
    visit(f"/sessions/{session}/terminal/", "terminal", "() => window.termState !== undefined")
    visit("/templates/", "templates", "() => window.templatesReady === true")
    visit("/templates/new/", "template-form", "() => window.formReady === true")
    visit("/profile/", "profile")
    page.click("#token-create")
    page.wait_for_selector("#new-token")
    shot(page, "profile-new-token")
    violations.extend(page.evaluate("window.cspViolations"))
    visit("/admin/", "admin")
    visit("/admin/sessions_app/session/", "admin-sessions")
    visit(f"/admin/sessions_app/session/{session}/change/", "admin-session")
    visit("/admin/knox/authtoken/", "admin-tokens")
    for model in ADMIN_LISTS:
        visit(f"/admin/{model}/", f"admin-{model.replace('/', '-')}")
    for model in ADMIN_FORMS:
        visit(f"/admin/{model}/add/", f"admin-{model.replace('/', '-')}-add")
    response = page.goto(f"{live_server_url}/no-such-page/")
    assert response is not None and response.status == 404
    shot(page, "not-found")
    visit(
        "/api/docs/",
        "api-docs",
        "() => document.querySelector('.swagger-ui .info .title') !== null",
    )
    operation = page.locator(".opblock-post").filter(has_text="/api/v1/auth/token/")
    operation.locator(".opblock-summary").click()
    operation.locator(".opblock-body").wait_for()
    shot(page, "api-docs-operation", full_page=True)
    violations.extend(page.evaluate("window.cspViolations"))
    context.close()

    assert violations == []
    assert [m for m in console if "Content Security Policy" in m or "page error" in m] == []
    own_origin_guard.assert_clean()
