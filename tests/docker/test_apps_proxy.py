"""Apps through the proxy, end to end on a real engine: a web server the user runs in
a session launched with port 8080 is fetched through the apps origin; only its owner
gets in; the launcher's link works once; an ended session's app says so.

Personas: ``alice`` owns the session; ``bob`` may not reach it by any path.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from sessions_app import kernel_images
from sessions_app.models import Agent, AgentStatus, Image, Status
from tests.docker.test_cluster_system import PYTHON_IMAGE, _wait_status, engine  # noqa: F401
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def _call(port, method, path, *, host="127.0.0.1", headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


def _api(live, token, method, path, body=None):
    response, data = _call(
        live.port,
        method,
        path,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        body=json.dumps(body) if body is not None else None,
    )
    return response.status, json.loads(data or b"{}")


def test_a_web_server_in_a_session_is_reached_through_the_apps_origin_by_its_owner_alone(
    engine,  # noqa: F811
    group,
    live_system,
    make_agent,
    make_token,
    alice,
    bob,
):
    Image.objects.update_or_create(
        reference=PYTHON_IMAGE,
        defaults={"supports_ssh": True, "service_ports": [kernel_images.JUPYTER_APP]},
    )
    live_system.start_apps()
    node = make_agent("node-a", cpu="2", mem=4 * 2**30)
    live_system.start_agent(node, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    alice_token, bob_token = make_token(alice), make_token(bob)
    status, session = _api(
        live_system,
        alice_token,
        "POST",
        "/api/v1/sessions/",
        {
            "image": PYTHON_IMAGE,
            "ports": [8080],
            "resources": {"cpu": 1, "mem": "512m"},
            "startup_command": "echo hello-from-the-kernel > hello.txt; "
            "exec python3 -m http.server 8080",
        },
    )
    assert status == 201, session
    assert [a["name"] for a in session["apps"]] == ["jupyter", "port-8080"]
    _wait_status(session["id"], Status.RUNNING)

    open_path = f"/api/v1/sessions/{session['id']}/apps/port-8080/open/"
    assert _api(live_system, bob_token, "POST", open_path)[0] == 404
    status, opened = _api(live_system, alice_token, "POST", open_path)
    assert status == 200, opened
    link = urlsplit(opened["url"])
    host = link.netloc
    assert link.port == live_system.apps_port and host.startswith(session["id"].replace("-", ""))

    # Nobody gets in without the app's cookie, whatever the path.
    response, _ = _call(live_system.apps_port, "GET", "/hello.txt", host=host)
    assert response.status == 403
    response, _ = _call(live_system.apps_port, "GET", f"{link.path}?{link.query}", host=host)
    assert response.status == 302
    cookie = response.getheader("Set-Cookie")
    assert "HttpOnly" in cookie and "Domain" not in cookie
    cookie = cookie.split(";", 1)[0]
    # The link worked once: bob (or anyone) reusing it gets nothing.
    reused, _ = _call(live_system.apps_port, "GET", f"{link.path}?{link.query}", host=host)
    assert reused.status == 403

    response, body = _call(
        live_system.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
    )
    assert response.status == 200, body
    assert body == b"hello-from-the-kernel\n"
    # The cookie opens this app only: not another session's or another app's host.
    other = host.replace("port-8080", "jupyter", 1)
    response, _ = _call(live_system.apps_port, "GET", "/", host=other, headers={"Cookie": cookie})
    assert response.status == 403

    status, _ = _api(
        live_system, alice_token, "POST", f"/api/v1/sessions/{session['id']}/terminate/"
    )
    assert status == 200
    _wait_status(session["id"], {Status.TERMINATED, Status.TERMINATING})

    def ended():
        response, body = _call(
            live_system.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
        )
        return body if response.status == 410 else None

    assert b"This session has ended" in wait_for(ended, timeout=15, what="the ended page")
