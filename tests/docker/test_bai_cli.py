"""The ``bai`` client (run as a user would, ``python -m bai_client``) against a
live manager, apps proxy and docker agent: ``bai login`` keeps a token in a 0600
config file; ``bai sessions create|list|show|terminate`` by id or name, with
cluster options and ``--wait``; ``bai logs`` and ``--follow``; ``bai app``
forwards a local TCP port to an echo server in the kernel, through the proxy's
raw-TCP websocket. Only the session's owner sees, follows or forwards anything.

Personas: ``alice`` owns the session; ``bob`` may not forward its port.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from sessions_app.models import Agent, AgentStatus, Session
from tests.docker.test_cluster_system import (  # noqa: F401
    MINIMAL_IMAGE,
    PYTHON_IMAGE,
    _wait_status,
    engine,
)
from tests.live import ROOT, free_port, interrupt_after, start_bai, stop_process, wait_for

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


def login(config, url, username, password=None, check=True):
    """``bai login`` as ``username``, its password on standard input."""
    password = PASSWORDS[username] if password is None else password
    return bai(
        config,
        "login",
        "--manager",
        url,
        "--username",
        username,
        "--password-stdin",
        input=password + "\n",
        check=check,
    )


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
    out = login(config, live_system.url, "alice")
    assert "Logged in as alice" in out.stdout
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    kept = json.loads(config.read_text())
    assert kept["manager"] == live_system.url and kept["token"]
    wrong = login(tmp_path / "x.json", live_system.url, "alice", "not-the-password", check=False)
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
    forward = start_bai(
        config, "app", str(session.pk), f"port-{ECHO_PORT}", "--bind", f"127.0.0.1:{port}"
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
    login(bob_config, live_system.url, "bob")
    refused = bai(bob_config, "app", str(session.pk), f"port-{ECHO_PORT}", check=False)
    assert refused.returncode != 0 and "No such session" in refused.stderr
    # Nor by dialling the proxy's raw-TCP websocket with his token, bypassing the client.
    url = f"ws://127.0.0.1:{live_system.apps_port}/_bai/tcp/{session.pk}/port-{ECHO_PORT}"
    bob_token = json.loads(bob_config.read_text())["token"]
    with pytest.raises(InvalidStatus) as refused_ws:
        with connect(url, additional_headers={"Authorization": f"Token {bob_token}"}) as ws:
            ws.recv(timeout=10)
    assert refused_ws.value.response.status_code == 403


def test_bai_app_jupyter_prints_a_link_that_logs_into_jupyter(
    engine,  # noqa: F811
    group,
    live_system,
    make_agent,
    alice,
    bob,
    with_passwords,
    tmp_path,
):
    """Jupyter keeps its token (anything else on the node that reaches its port must not
    get in); through ``bai app`` nobody presents it, so the printed link carries it."""
    import http.cookiejar
    import urllib.request

    from sessions_app import kernel_images, services
    from sessions_app.models import Image

    live_system.start_apps()
    node = make_agent("node-a", cpu="2", mem=4 * 2**30)
    live_system.start_agent(node, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    Image.objects.update_or_create(
        reference=PYTHON_IMAGE,
        defaults={"supports_ssh": True, "service_ports": [kernel_images.JUPYTER_APP]},
    )
    session = services.session_create(
        owner=alice, spec={"image": PYTHON_IMAGE, "resources": {"cpu": 1, "mem": "1g"}}
    )
    _wait_status(str(session.pk), "RUNNING")
    config = tmp_path / "alice" / "config.json"
    login(config, live_system.url, "alice")

    port = free_port()
    forward = start_bai(config, "app", str(session.pk), "jupyter", "--bind", f"127.0.0.1:{port}")
    try:
        assert forward.stdout.readline().startswith(f"Forwarding 127.0.0.1:{port} -> jupyter")
        link = forward.stdout.readline().strip()
        assert re.fullmatch(rf"Open http://127\.0\.0\.1:{port}/\?token=[\w-]+", link), link
        url = link.removeprefix("Open ")

        def landed(address):
            """Where a browser lands from ``address`` (cookies kept), or None while Jupyter starts."""
            opener = urllib.request.build_opener(
                urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
            )
            try:
                with opener.open(address, timeout=20) as answer:
                    return answer.status, answer.geturl()
            except OSError:
                return None

        status, where = wait_for(lambda: landed(url), timeout=90, what="Jupyter through bai app")
        assert status == 200 and "/tree" in where and "/login" not in where  # logged in
        _, without = landed(f"http://127.0.0.1:{port}/")
        assert "/login" in without  # without the token: Jupyter's own login
    finally:
        forward.send_signal(signal.SIGINT)
        forward.wait(10)


# --- sessions, logs ------------------------------------------------------------------------

TICKER = 'echo "$GREETING from $BACKENDAI_CLUSTER_HOST"; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done'


@pytest.fixture
def node(live_system, make_agent, images):  # noqa: F811
    """One docker agent with 2 cpu and 4 GiB."""
    agent = make_agent("node-a", cpu="2", mem=4 * 2**30)
    live_system.start_agent(agent, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    return agent


@pytest.fixture
def alice_config(live_system, with_passwords, tmp_path):
    config = tmp_path / "alice" / "config.json"
    login(config, live_system.url, "alice")
    return config


def create(config, *flags, check=True):
    """``bai sessions create`` of the minimal image."""
    return bai(config, "sessions", "create", MINIMAL_IMAGE, *flags, check=check)


def _ticks(line):
    return int(line.split()[1]) if line.startswith("tick ") else None


def test_bai_sessions_create_waits_lists_shows_logs_follows_and_terminates_by_name(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
    tmp_path,
):
    created = bai(
        alice_config,
        "sessions",
        "create",
        MINIMAL_IMAGE,
        "--name",
        "ticker",
        "-r",
        "cpu=1",
        "-r",
        "mem=64m",
        "-e",
        "GREETING=hello",
        "--startup-command",
        TICKER,
        "--wait",
    )
    # Each change of status on stderr, the session as a table on stdout.
    assert re.match(r"Session ticker \([0-9a-f-]{36}\) created: ", created.stderr)
    assert "\nticker: RUNNING" in created.stderr
    assert "status:" in created.stdout and "RUNNING" in created.stdout
    assert "main1" in created.stdout and "1 cpu, 64 MiB mem per kernel" in created.stdout

    listed = bai(alice_config, "sessions").stdout
    assert listed.splitlines()[0].split()[:3] == ["ID", "NAME", "STATUS"]
    row = next(line for line in listed.splitlines() if " ticker " in line)
    assert "RUNNING" in row and MINIMAL_IMAGE in row
    rows = json.loads(bai(alice_config, "sessions", "list", "--json").stdout)
    assert [(r["name"], r["status"]) for r in rows] == [("ticker", "RUNNING")]
    shown = json.loads(bai(alice_config, "sessions", "show", "ticker", "--json").stdout)
    assert shown["id"] == rows[0]["id"] and shown["env"] == {"GREETING": "hello"}
    assert [k["cluster_hostname"] for k in shown["kernels"]] == ["main1"]

    # What the live container wrote so far, and then no more: the command returns.
    so_far = bai(alice_config, "logs", "ticker")
    assert "hello from main1" in so_far.stdout and "tick 1\n" in so_far.stdout

    follow = start_bai(alice_config, "logs", "ticker", "--follow")
    try:
        assert follow.stdout.readline() == "hello from main1\n"
        first = last = None
        while last is None or last < first + 10:  # two seconds of new ticks, live
            tick = _ticks(follow.stdout.readline())
            first = first if first is not None or tick is None else tick
            last = tick if tick is not None else last
        ended = bai(alice_config, "sessions", "terminate", "ticker")
        assert re.fullmatch(r"ticker \([0-9a-f-]{36}\): TERMINAT(ING|ED)\n", ended.stdout)
        follow.wait(30)
    finally:
        stop_process(follow)
    # The follower stops by itself when the kernel ends, saying how.
    assert follow.returncode == 0
    assert "ended TERMINATED" in follow.stderr.read()

    # The kept tail once it has ended; the ended session is still found by its name.
    kept = wait_for(
        lambda: (out := bai(alice_config, "logs", "ticker")).stdout and out,
        what="the kept log tail",
    )
    assert "hello from main1" in kept.stdout and "kept tail" in kept.stderr
    after = bai(alice_config, "sessions", "show", "ticker").stdout
    assert re.search(r"^status: +TERMINATED$", after, re.M)
    assert re.search(r"^reason: +main1: terminated by its owner$", after, re.M)

    missing = bai(alice_config, "sessions", "show", "nosuch", check=False)
    assert missing.returncode == 1 and "You have no session named 'nosuch'" in missing.stderr

    # bob sees nothing of alice's session, by REST nor by the logs websocket.
    bob_config = tmp_path / "bob" / "config.json"
    login(bob_config, live_system.url, "bob")
    for command in (["sessions", "show"], ["logs"], ["sessions", "terminate"]):
        refused = bai(bob_config, *command, shown["id"], check=False)
        assert refused.returncode == 1 and "No such session" in refused.stderr, command


def test_bai_sessions_create_starts_a_multi_node_cluster_and_reads_each_kernels_log(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
):
    created = bai(
        alice_config,
        "sessions",
        "create",
        MINIMAL_IMAGE,
        "--cluster-size",
        "3",
        "--cluster-mode",
        "multi-node",
        "-r",
        "cpu=0.5",
        "-r",
        "mem=64m",
        "-e",
        "GREETING=hi",
        "--startup-command",
        TICKER,
        "--wait",
        "--json",
    )
    session = json.loads(created.stdout)
    assert session["status"] == "RUNNING"
    assert (session["cluster_size"], session["cluster_mode"]) == (3, "multi-node")
    assert [k["cluster_hostname"] for k in session["kernels"]] == ["main1", "sub1", "sub2"]
    assert {k["requested_slots"]["cpu"] for k in session["kernels"]} == {"0.5"}
    assert all(k["status"] == "RUNNING" for k in session["kernels"])

    # The start command runs in main1 alone: sub1's log is its own.
    assert "hi from main1" in bai(alice_config, "logs", session["id"]).stdout
    sub = bai(alice_config, "logs", session["id"], "--kernel", "sub1")
    assert "hi from" not in sub.stdout
    nosuch = bai(alice_config, "logs", session["id"], "--kernel", "sub9", check=False)
    assert nosuch.returncode == 1 and "No such kernel in this session" in nosuch.stderr

    ended = json.loads(bai(alice_config, "sessions", "terminate", session["id"], "--json").stdout)
    assert [e["id"] for e in ended] == [session["id"]]
    assert ended[0]["status"] in ("TERMINATING", "TERMINATED")
    _wait_status(session["id"], "TERMINATED")
    kept = bai(alice_config, "logs", session["id"], "-k", "sub2")
    assert "sub2 has ended" in kept.stderr


def test_bai_sessions_create_says_why_a_session_did_not_come_up_in_the_servers_words(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
):
    batch = ["--type", "batch", "-r", "mem=64m", "--wait"]
    failed = create(
        alice_config, *batch, "-n", "failing", "--startup-command", "exit 3", check=False
    )
    assert failed.returncode == 1
    assert "Error: session failing ended TERMINATED:" in failed.stderr
    failing = json.loads(bai(alice_config, "sessions", "show", "failing", "--json").stdout)
    assert (failing["result"], failing["exit_code"]) == ("FAILED", 3)

    # A session depending on it (named by name) never runs.
    dependent = create(
        alice_config, *batch, "--startup-command", "true", "--depends-on", "failing", check=False
    )
    assert dependent.returncode == 1
    assert "ended CANCELLED: dependency failing ended FAILED" in dependent.stderr

    # The manager's refusal, in its words, every field of it.
    refused = create(alice_config, "-r", "cpu=0.0001", "-m", "nosuch", check=False)
    assert refused.returncode == 1, refused.stderr
    assert "resources: cpu: at most 3 decimal places" in refused.stderr
    assert "mounts: " in refused.stderr and "nosuch" in refused.stderr
    usage = create(alice_config, "-r", "cpu", check=False)
    assert usage.returncode == 2 and "'cpu' is not KEY=VALUE" in usage.stderr


# --- exec, run -----------------------------------------------------------------------------

COUNTDOWN = """
import time
for i in range(3):
    print("count", i, flush=True)
    time.sleep(1)
"""


def test_bai_exec_streams_output_answers_input_and_exits_with_the_codes_status(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
):
    python = ["sessions", "create", PYTHON_IMAGE, "-r", "cpu=1", "-r", "mem=1g", "--wait"]
    bai(alice_config, *python, "--name", "py")

    # Output as it comes: the first line is here while the code still runs.
    counting = start_bai(alice_config, "exec", "py", COUNTDOWN)
    try:
        assert counting.stdout.readline() == "count 0\n"
        assert counting.poll() is None
        out, err = counting.communicate(timeout=60)
    finally:
        stop_process(counting)
    assert (counting.returncode, out) == (0, "count 1\ncount 2\n"), err

    # State persists between runs of one session; exit statuses are the code's.
    assert bai(alice_config, "exec", "py", "x = 41").returncode == 0
    assert bai(alice_config, "exec", "py", "print(x + 1)").stdout == "42\n"
    failed = bai(alice_config, "exec", "py", "1/0", check=False)
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    exited = bai(alice_config, "exec", "py", "import sys; sys.exit(3)", check=False)
    assert exited.returncode == 3

    # input() is answered from bai's standard input.
    asked = bai(alice_config, "exec", "py", "print('hi', input('Name? '))", input="Ada\n")
    assert "hi Ada" in asked.stdout

    # Ctrl-C interrupts the code: it ends with KeyboardInterrupt, exit status 1.
    looping = start_bai(
        alice_config,
        "exec",
        "py",
        "import time\nprint('go', flush=True)\nwhile True: time.sleep(0.1)",
    )
    err = interrupt_after(looping, "go\n")
    assert looping.returncode == 1 and "KeyboardInterrupt" in err

    # An image without a code runner says so.
    bai(alice_config, "sessions", "create", MINIMAL_IMAGE, "-r", "mem=64m", "-n", "tiny", "--wait")
    tiny = bai(alice_config, "exec", "tiny", "print(1)", check=False)
    assert tiny.returncode == 127 and "no code runner" in tiny.stderr


@pytest.mark.parametrize(
    ("script", "status"), [("print('all good')", 0), ("import sys; print('bye'); sys.exit(3)", 3)]
)
def test_bai_run_runs_a_file_in_a_fresh_session_ends_it_and_exits_with_the_scripts_status(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
    tmp_path,
    script,
    status,
):
    path = tmp_path / "script.py"
    path.write_text(f"import os\nprint(os.environ['BACKENDAI_CLUSTER_HOSTS'])\n{script}\n")
    cluster = ["--cluster-size", "3", "--cluster-mode", "multi-node"]
    ran = bai(
        alice_config,
        "run",
        PYTHON_IMAGE,
        "--file",
        str(path),
        *cluster,
        "-r",
        "cpu=0.5",
        "-r",
        "mem=512m",
        check=False,
    )
    assert ran.returncode == status, ran.stderr
    assert ran.stdout.startswith("main1,sub1,sub2\n")
    assert "RUNNING" in ran.stderr and "terminated." in ran.stderr
    (session,) = Session.objects.all()
    assert session.cluster_size == 3
    _wait_status(str(session.pk), "TERMINATED")


def test_bai_run_ends_its_session_on_ctrl_c(
    engine,  # noqa: F811
    node,
    live_system,
    alice_config,
):
    running = start_bai(
        alice_config,
        "run",
        PYTHON_IMAGE,
        "print('up', flush=True)\nimport time\ntime.sleep(600)",
        "-r",
        "mem=1g",
    )
    err = interrupt_after(running, "up\n")
    assert running.returncode == 1 and "KeyboardInterrupt" in err and "terminated." in err
    (session,) = Session.objects.all()
    _wait_status(str(session.pk), "TERMINATED")
