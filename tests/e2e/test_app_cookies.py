"""Apps cannot toss cookies, in Chromium: an app's answer that sets cookies for a wider
domain (the apps parent, which every user's apps share, and the manager's host, the
parent above it: cookies ignore ports) reaches neither another app nor the manager; the
other app still opens for its owner; the app's own host-only cookie is kept.

The apps origin here is ``apps.bai.localhost``, so the manager's host would be
``bai.localhost``: Chromium refuses ``Domain=localhost`` itself (a bare top-level name;
the app tries it too), but takes ``Domain=bai.localhost`` from ``*.apps.bai.localhost``,
as it would ``Domain=example.org`` from ``*.apps.example.org``.

Persona: ``alice`` with one running session serving two apps (ports 8080 and 8081).
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

APPS_PARENT = "apps.bai.localhost"
MANAGER_HOST = "bai.localhost"


@pytest.fixture
def live_env(live_env, apps_port):
    return {**live_env, "BAI_APPS_ORIGIN": f"http://{APPS_PARENT}:{apps_port}"}


# Two apps of one session (ports 8080 and 8081), each answering with the cookies it was
# sent; ``/toss`` on either also tries to set cookies for wider domains: the apps parent
# (every user's apps), the manager's host above it, and the proxy's access cookie (the
# old shared name, and the other app's own name).
TOSSING_SERVER = """exec python3 -c '
import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cookies: " + str(self.headers.get("Cookie"))).encode()
        self.send_response(200)
        if self.path == "/toss":
            labels = self.headers["Host"].split(":")[0].split(".")
            parent, manager = ".".join(labels[1:]), ".".join(labels[2:])
            sibling = labels[0].replace("port-8080", "port-8081")
            for line in ("tossed_parent=1; Domain=" + parent + "; Path=/",
                         "tossed_manager=1; Domain=" + manager + "; Path=/",
                         "sessionid=planted; Domain=" + manager + "; Path=/",
                         "csrftoken=planted; Domain=" + manager + "; Path=/",
                         "sessionid=planted; Domain=localhost; Path=/",
                         "bai_app=tossed; Domain=" + parent + "; Path=/",
                         "bai_app_" + sibling + "=tossed; Domain=" + parent + "; Path=/",
                         "own_host_only=1; Path=/"):
                self.send_header("Set-Cookie", line)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
for port in (8080, 8081):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    threading.Thread(target=server.serve_forever).start()
'"""


def _open_app_tab(page, app: str, host: str):
    """The app's tab, opened from the session page's button, once the app answers."""
    with page.context.expect_page() as opened:
        page.locator(f'#d-apps button[data-app="{app}"]').click()
    tab = opened.value
    tab.wait_for_url(f"http://{host}:*/")
    for _ in range(60):  # the server may still be starting: the proxy answers 502
        if tab.locator("body").inner_text().startswith("cookies: "):
            return tab
        tab.wait_for_timeout(500)
        tab.reload()
    raise AssertionError(f"{app} never answered: {tab.locator('body').inner_text()[:300]}")


@pytest.fixture
def tossing_session(real_agent, users, images, apps_proxy):
    """alice's session serving ``TOSSING_SERVER`` on ports 8080 and 8081, RUNNING."""
    from sessions_app import services
    from sessions_app.models import Session

    session = services.session_create(
        owner=users["alice"],
        spec={
            "image": "bai-kernel/python:2",
            "name": "tosser",
            "resources": {"cpu": "1", "mem": "512m"},
            "ports": [8080, 8081],
            "startup_command": TOSSING_SERVER,
        },
    )
    deadline = time.monotonic() + 120
    while (status := Session.objects.get(pk=session.pk).status) != "RUNNING":
        assert time.monotonic() < deadline, f"the session is still {status}"
        time.sleep(0.2)
    return session


def test_an_app_cannot_toss_cookies_onto_another_app_or_the_manager(
    tossing_session, apps_proxy, login, live_server_url, shot
):
    session = tossing_session
    apps_port = apps_proxy.rsplit(":", 1)[1]
    tosser_host = f"{session.pk.hex}-port-8080.{APPS_PARENT}"
    other_host = f"{session.pk.hex}-port-8081.{APPS_PARENT}"

    page = login("alice", screenshot=False)
    page.goto(f"{live_server_url}/sessions/{session.pk}/")
    tosser = _open_app_tab(page, "port-8080", tosser_host)
    tosser.goto(f"http://{tosser_host}:{apps_port}/toss")
    tosser.goto(f"http://{tosser_host}:{apps_port}/")
    seen_by_tosser = tosser.locator("body").inner_text()
    assert "own_host_only=1" in seen_by_tosser  # the app's own cookie is kept
    assert "tossed" not in seen_by_tosser and "planted" not in seen_by_tosser

    # Nothing of it would go to the manager's host (any port) or to the apps parent.
    for url in (
        f"http://{MANAGER_HOST}:{live_server_url.rsplit(':', 1)[1]}/",
        f"http://{MANAGER_HOST}/",
        f"http://localhost:{live_server_url.rsplit(':', 1)[1]}/",
        f"http://{APPS_PARENT}:{apps_port}/",
    ):
        names = {c["name"]: c["value"] for c in page.context.cookies(url)}
        assert not {"tossed_parent", "tossed_manager"} & set(names), (url, names)
        assert "planted" not in names.values() and "tossed" not in names.values(), (url, names)

    # The other app still opens for its owner, and was sent none of it.
    other = _open_app_tab(page, "port-8081", other_host)
    seen_by_other = other.locator("body").inner_text()
    assert seen_by_other == "cookies: None", seen_by_other
    shot(other, "other-app-sent-no-tossed-cookie", users_document=True)
    manager_cookies = {c["name"] for c in page.context.cookies(live_server_url)}
    assert {"sessionid", "csrftoken"} <= manager_cookies
    page.reload()
    page.locator('#d-apps button[data-app="port-8081"]').wait_for()
    assert not page.js_errors
