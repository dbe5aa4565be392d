"""Apps through the proxy, end to end on a real engine: a web server the user runs in
a session launched with port 8080 is fetched through the apps origin; only its owner
gets in; the launcher's link works once; an ended session's app says so.

Personas: ``alice`` owns the session; ``bob`` may not reach it by any path.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from sessions_app import kernel_images
from sessions_app.models import Agent, AgentStatus, Image, Kernel, Status
from tests.docker.test_cluster_system import (  # noqa: F401
    PYTHON_IMAGE,
    _wait_status,
    engine,
)
from tests.live import free_port, wait_for

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


def _one_agent(live, make_agent):
    live.start_apps()
    live.start_agent(make_agent("node-a", cpu="2", mem=4 * 2**30), "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")


def _launch_running(live, token, spec):
    status, session = _api(live, token, "POST", "/api/v1/sessions/", spec)
    assert status == 201, session
    _wait_status(session["id"], Status.RUNNING, timeout=90)
    return session


def _open_app(live, token, session_id, app):
    """The owner's cookie for an app: the launcher's link traded on the apps origin."""
    status, opened = _api(live, token, "POST", f"/api/v1/sessions/{session_id}/apps/{app}/open/")
    assert status == 200, opened
    link = urlsplit(opened["url"])
    response, _ = _call(live.apps_port, "GET", f"{link.path}?{link.query}", host=link.netloc)
    assert response.status == 302
    return link.netloc, response.getheader("Set-Cookie").split(";", 1)[0]


def _server_on_8080(live, make_agent, token, startup_command):
    """One agent, a running session whose start command serves port 8080, and the owner's
    (host, cookie) for that app."""
    _one_agent(live, make_agent)
    session = _launch_running(
        live,
        token,
        {
            "image": PYTHON_IMAGE,
            "ports": [8080],
            "resources": {"cpu": 1, "mem": "512m"},
            "startup_command": startup_command,
        },
    )
    return _open_app(live, token, session["id"], "port-8080")


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
    _one_agent(live_system, make_agent)
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

    def fetched():  # RUNNING once its process runs: the server may not listen yet (502)
        response, body = _call(
            live_system.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
        )
        assert response.status in (200, 502), body
        return body if response.status == 200 else None

    assert wait_for(fetched, timeout=30, what="hello.txt") == b"hello-from-the-kernel\n"
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


# A web server that keeps a PUT body in /tmp/upload.bin (read in 1 MiB pieces,
# never whole) and serves /tmp by GET; the session's start command.
UPLOAD_SERVER = """exec python3 -c '
import functools, http.server
class H(http.server.SimpleHTTPRequestHandler):
    def do_PUT(self):
        left = int(self.headers["Content-Length"])
        with open("/tmp/upload.bin", "wb") as f:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                f.write(chunk)
                left -= len(chunk)
        self.send_response(201 if left == 0 else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()
H.protocol_version = "HTTP/1.1"
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), functools.partial(H, directory="/tmp")).serve_forever()
'"""
BULK = 100 * 2**20


def test_a_100_mb_upload_and_download_through_the_proxy_keep_their_checksum(
    engine,  # noqa: F811
    group,
    live_system,
    make_agent,
    make_token,
    alice,
    tmp_path,
):
    import hashlib
    import os

    Image.objects.update_or_create(reference=PYTHON_IMAGE, defaults={"supports_ssh": True})
    host, cookie = _server_on_8080(live_system, make_agent, make_token(alice), UPLOAD_SERVER)

    source = tmp_path / "upload.bin"
    digest = hashlib.sha256()
    with source.open("wb") as f:
        for _ in range(BULK // 2**20):
            chunk = os.urandom(2**20)
            digest.update(chunk)
            f.write(chunk)

    def upload():
        conn = http.client.HTTPConnection("127.0.0.1", live_system.apps_port, timeout=120)
        with source.open("rb") as body:
            conn.request(
                "PUT",
                "/upload.bin",
                body=body,
                headers={"Host": host, "Cookie": cookie, "Content-Length": str(BULK)},
            )
            response = conn.getresponse()
            response.read()
        conn.close()
        return response.status

    # The first request may find the server still starting (the proxy answers 502).
    assert wait_for(lambda: upload() == 201, timeout=60, what="the upload")

    conn = http.client.HTTPConnection("127.0.0.1", live_system.apps_port, timeout=120)
    conn.request("GET", "/upload.bin", headers={"Host": host, "Cookie": cookie})
    response = conn.getresponse()
    assert response.status == 200
    back, size = hashlib.sha256(), 0
    while chunk := response.read(2**20):
        back.update(chunk)
        size += len(chunk)
    conn.close()
    assert size == BULK
    assert back.hexdigest() == digest.hexdigest()


def _serve_and_fetch(live, token, spec, *, port):
    """Launch ``spec`` (its start command writes hello.txt and serves its directory on
    ``port``), then fetch hello.txt through the apps proxy as its owner."""
    session = _launch_running(live, token, spec)
    host, cookie = _open_app(live, token, session["id"], f"port-{port}")

    def fetched():
        response, body = _call(
            live.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
        )
        return body if response.status == 200 else None

    return session, wait_for(fetched, timeout=30, what="hello.txt through the proxy")


def test_the_app_of_a_multi_node_cluster_is_served_from_main1_on_its_own_agent(
    engine,  # noqa: F811
    images,  # noqa: F811
    live_system,
    make_agent,
    make_token,
    alice,
):
    live_system.start_apps()
    for name in ("node-a", "node-b"):  # one CPU each: the two kernels must spread
        agent = make_agent(name, cpu="1", mem=2 * 2**30)
        live_system.start_agent(agent, "--cpu", "1", "--mem", "2g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).count() == 2, what="two agents")
    session, body = _serve_and_fetch(
        live_system,
        make_token(alice),
        {
            "image": PYTHON_IMAGE,
            "cluster_mode": "multi-node",
            "cluster_size": 2,
            "ports": [8080],
            "resources": {"cpu": 1, "mem": "256m"},
            "startup_command": 'echo "from $BACKENDAI_CLUSTER_HOST" > hello.txt; '
            "exec python3 -m http.server 8080",
        },
        port=8080,
    )
    assert body == b"from main1\n"
    agents = set(Kernel.objects.filter(session_id=session["id"]).values_list("agent_id", flat=True))
    assert agents == {"node-a", "node-b"}


def test_apps_of_a_process_backend_kernel_are_served_from_its_sessions_network(
    images,  # noqa: F811
    live_system,
    make_agent,
    make_token,
    alice,
):
    """A port the start command serves, and an app of the image started on its first open."""
    on_demand = free_port()
    Image.objects.filter(reference=PYTHON_IMAGE).update(
        service_ports=[
            {
                "name": "files",
                "protocol": "http",
                "port": on_demand,
                "start_command": "echo started-on-demand > hello.txt; exec python3 -m "
                'http.server --directory . --bind "$BAI_APP_BIND" "$BAI_APP_PORT"',
            }
        ]
    )
    live_system.start_apps()
    live_system.start_agent(make_agent("node-p", cpu="2", mem=2**30), backend="process")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    port = free_port()
    token = make_token(alice)
    session, body = _serve_and_fetch(
        live_system,
        token,
        {
            "image": PYTHON_IMAGE,
            "ports": [port],
            "resources": {"cpu": 1, "mem": "256m"},
            # Served by a relative path: the test's work dir sits in pytest's private tmp.
            "startup_command": "echo from-a-process > hello.txt; "
            f"exec python3 -m http.server --directory . --bind 127.0.0.1 {port}",
        },
        port=port,
    )
    assert body == b"from-a-process\n"

    host, cookie = _open_app(live_system, token, session["id"], "files")
    response, body = _call(
        live_system.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
    )
    assert (response.status, body) == (200, b"started-on-demand\n")
    # Ending the session ends the app it started: nothing listens on its port any more.
    _api(live_system, token, "POST", f"/api/v1/sessions/{session['id']}/terminate/")
    _wait_status(session["id"], Status.TERMINATED)

    def closed():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", on_demand)) != 0

    wait_for(closed, timeout=10, what="the on-demand app to end with its kernel")


def _tcp_through_proxy(live, token, session_id, port, send=b""):
    """What ``/_bai/tcp`` answers for a port of a session: the first bytes its listener
    sent, b"" when the tunnel closed with none (the agent reached nothing), or the HTTP
    status of a refused websocket."""
    url = f"ws://127.0.0.1:{live.apps_port}/_bai/tcp/{session_id}/port-{port}"
    try:
        with connect(url, additional_headers={"Authorization": f"Token {token}"}) as ws:
            if send:
                ws.send(send)
            return ws.recv(timeout=10)
    except InvalidStatus as refused:
        return refused.response.status_code
    except ConnectionClosed:
        return b""


@pytest.fixture
def alice_on_the_nodes_loopback():
    """An app of alice's on the node's loopback (as one of her process kernels was before
    kernels had networks of their own): it answers every connection with her secret."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\n"
                        b"alice's secret"
                    )

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_process_backend_session_reaches_its_own_kernels_ports_alone(
    images,  # noqa: F811
    live_system,
    make_agent,
    make_token,
    bob,
    alice_on_the_nodes_loopback,
):
    """bob declares the port of alice's app and the manager's Redis and PostgreSQL ports:
    through the apps proxy each reaches his own kernel's network, where nothing listens;
    a port his kernel serves is his."""
    alice_port = alice_on_the_nodes_loopback
    live_system.start_apps()
    live_system.start_agent(make_agent("node-p", cpu="2", mem=2**30), backend="process")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    token = make_token(bob)
    own = free_port()
    session = _launch_running(
        live_system,
        token,
        {
            "image": PYTHON_IMAGE,
            "ports": [alice_port, 6379, 5432, own],
            "resources": {"cpu": 1, "mem": "256m"},
            "startup_command": "echo bobs-own > hello.txt; "
            f"exec python3 -m http.server --directory . --bind 127.0.0.1 {own}",
        },
    )
    # His own port is served (once his server listens).
    host, cookie = _open_app(live_system, token, session["id"], f"port-{own}")

    def fetched():
        response, body = _call(
            live_system.apps_port, "GET", "/hello.txt", host=host, headers={"Cookie": cookie}
        )
        return body if response.status == 200 else None

    assert wait_for(fetched, timeout=30, what="bob's own port") == b"bobs-own\n"
    # alice's app on the node's loopback, by the same number: not reached.
    host, cookie = _open_app(live_system, token, session["id"], f"port-{alice_port}")
    response, body = _call(live_system.apps_port, "GET", "/", host=host, headers={"Cookie": cookie})
    assert response.status == 502 and b"alice" not in body, (response.status, body)
    assert _tcp_through_proxy(live_system, token, session["id"], alice_port) in (b"", 403)
    # The manager's Redis and PostgreSQL, by their numbers: not reached either (Redis
    # would answer +PONG; PostgreSQL answers a startup packet with its own bytes).
    redis = _tcp_through_proxy(live_system, token, session["id"], 6379, b"PING\r\n")
    assert redis in (b"", 403), redis
    startup = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")  # SSLRequest
    postgres = _tcp_through_proxy(live_system, token, session["id"], 5432, startup)
    assert postgres in (b"", 403), postgres
    # The same path reaches what bob's kernel serves.
    raw = _tcp_through_proxy(
        live_system, token, session["id"], own, b"GET /hello.txt HTTP/1.0\r\n\r\n"
    )
    assert isinstance(raw, bytes) and raw.startswith(b"HTTP/1.0 200"), raw


# Counts the connections it accepts (GET /count) and drops one idle for a second.
COUNTING_SERVER = """exec python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 1
    accepted = 0
    def setup(self):
        H.accepted += 1
        super().setup()
    def do_GET(self):
        body = str(H.accepted).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
'"""


def test_requests_reuse_a_kept_connection_and_one_the_app_closed_is_replaced(
    engine,  # noqa: F811
    images,  # noqa: F811
    live_system,
    make_agent,
    make_token,
    alice,
):
    host, cookie = _server_on_8080(live_system, make_agent, make_token(alice), COUNTING_SERVER)

    def count():
        response, body = _call(
            live_system.apps_port, "GET", "/count", host=host, headers={"Cookie": cookie}
        )
        return int(body) if response.status == 200 else None

    first = wait_for(count, timeout=30, what="the counting server")
    # Each of these is a new browser connection; the proxy carries them all over one.
    assert [count() for _ in range(5)] == [first] * 5
    time.sleep(1.5)  # the app drops the idle connection: the next request gets a new one
    assert count() == first + 1
