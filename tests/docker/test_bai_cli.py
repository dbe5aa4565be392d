"""The ``bai`` client against a live manager, apps proxy and agent: ``bai login``
keeps a token in a 0600 config file, ``bai sessions`` lists, and ``bai app``
forwards a local TCP port to an echo server in the kernel, through the proxy's
raw-TCP websocket. Only the session's owner gets a forward.

Personas: ``alice`` owns the session; ``bob`` may not forward its port.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from sessions_app.models import Agent, AgentStatus
from tests.docker.test_cluster_system import PYTHON_IMAGE, _wait_status, engine  # noqa: F401
from tests.live import ROOT, free_port, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

PASSWORDS = {"alice": "alice-cli-pass-1", "bob": "bob-cli-pass-1"}
ECHO_PORT = 9000
# A threaded TCP echo server, the session's start command.
ECHO_SERVER = f"""exec python3 -c '
import socketserver
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", {ECHO_PORT}), Echo).serve_forever()
'"""


def bai(config, *args, input=None, check=True):
    """Run the ``bai`` command (the console script's module) as a user would."""
    result = subprocess.run(
        [sys.executable, "-m", "bai_client", *args],
        cwd=ROOT,
        env={**os.environ, "BAI_CONFIG": str(config)},
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _recv_exactly(sock, n):
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(65536, n - got))
        assert chunk, f"the forward closed after {got} of {n} bytes"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@pytest.fixture
def with_passwords(alice, bob, settings):
    """alice and bob with passwords the live server can check (its hashers are the defaults)."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    for user in (alice, bob):
        user.set_password(PASSWORDS[user.username])
        user.save(update_fields=["password"])


def test_bai_app_forwards_a_local_port_to_an_echo_server_in_the_kernel_for_its_owner_alone(
    engine,  # noqa: F811
    group,
    live_system,
    make_agent,
    make_token,
    alice,
    bob,
    with_passwords,
    tmp_path,
):
    live_system.start_apps()
    node = make_agent("node-a", cpu="2", mem=4 * 2**30)
    live_system.start_agent(node, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")

    config = tmp_path / "alice" / "config.json"
    out = bai(
        config,
        "login",
        "--manager",
        live_system.url,
        "--username",
        "alice",
        "--password-stdin",
        input=PASSWORDS["alice"] + "\n",
    )
    assert "Logged in as alice" in out.stdout
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    kept = json.loads(config.read_text())
    assert kept["manager"] == live_system.url and kept["token"]
    wrong = bai(
        tmp_path / "x.json",
        "login",
        "--manager",
        live_system.url,
        "--username",
        "alice",
        "--password-stdin",
        input="not-the-password\n",
        check=False,
    )
    assert wrong.returncode != 0 and "Wrong username or password" in wrong.stderr

    from sessions_app import services
    from sessions_app.models import Image

    Image.objects.update_or_create(reference=PYTHON_IMAGE, defaults={"supports_ssh": True})
    session = services.session_create(
        owner=alice,
        spec={
            "image": PYTHON_IMAGE,
            "ports": [ECHO_PORT],
            "resources": {"cpu": 1, "mem": "512m"},
            "startup_command": ECHO_SERVER,
        },
    )
    _wait_status(str(session.pk), "RUNNING")
    listed = bai(config, "sessions").stdout
    assert str(session.pk) in listed and f"port-{ECHO_PORT}" in listed

    port = free_port()
    forward = subprocess.Popen(
        [sys.executable, "-m", "bai_client", "app", str(session.pk), f"port-{ECHO_PORT}"]
        + ["--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**os.environ, "BAI_CONFIG": str(config), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "Forwarding" in forward.stdout.readline()

        def echoed():
            # The server may still be starting in the kernel: a refused try closes at once.
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    sock.sendall(b"ping\n")
                    return sock.recv(16) == b"ping\n"
            except OSError:
                return False

        wait_for(echoed, timeout=30, what="the echo through bai app")
        # Bulk bytes both ways at once, on two connections side by side.
        payload = os.urandom(4 * 2**20)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=30) as one,
            socket.create_connection(("127.0.0.1", port), timeout=30) as two,
        ):
            one.sendall(b"first")
            two.sendall(payload)
            back = _recv_exactly(two, len(payload))
            assert one.recv(16) == b"first"
        assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
    finally:
        forward.send_signal(signal.SIGINT)
        forward.wait(10)
    assert forward.returncode == 0
    assert "Stopped" in forward.stderr.read()

    # bob, logged in with his own token, cannot forward alice's port.
    bob_config = tmp_path / "bob" / "config.json"
    bai(
        bob_config,
        "login",
        "--manager",
        live_system.url,
        "--username",
        "bob",
        "--password-stdin",
        input=PASSWORDS["bob"] + "\n",
    )
    refused = bai(bob_config, "app", str(session.pk), f"port-{ECHO_PORT}", check=False)
    assert refused.returncode != 0 and "No such session" in refused.stderr
    # Nor by dialling the proxy's raw-TCP websocket with his token, bypassing the client.
    url = f"ws://127.0.0.1:{live_system.apps_port}/_bai/tcp/{session.pk}/port-{ECHO_PORT}"
    bob_token = json.loads(bob_config.read_text())["token"]
    with pytest.raises(InvalidStatus) as refused_ws:
        with connect(url, additional_headers={"Authorization": f"Token {bob_token}"}) as ws:
            ws.recv(timeout=10)
    assert refused_ws.value.response.status_code == 403
