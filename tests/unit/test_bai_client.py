"""The ``bai`` client's argument handling, without a manager: what each command
sends for its flags, how it names sessions, and its usage errors (exit 2)
against the manager's refusals (exit 1, in the manager's words)."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from bai_client import cli, launch
from bai_client.api import ApiError, Client
from bai_client.cli import main
from bai_client.streams import Outcome, StreamError, show_record

RUNNING_ID = "11111111-1111-1111-1111-111111111111"
ENDED_ID = "22222222-2222-2222-2222-222222222222"
OLDER_ID = "33333333-3333-3333-3333-333333333333"


def _session(session_id, name, status, **extra):
    return {
        "id": session_id,
        "name": name,
        "status": status,
        "status_reason": "",
        "type": "interactive",
        "image": "bai-kernel/python:2",
        "cluster_size": 1,
        "cluster_mode": "single-node",
        "apps": [],
        **extra,
    }


class FakeManager:
    """Answers ``Client.call`` like the manager would, and records each request."""

    def __init__(self):
        self.requests = []
        # Newest first, as the manager lists them: two sessions named "train".
        self.sessions = [
            _session(ENDED_ID, "train", "TERMINATED"),
            _session(RUNNING_ID, "train", "RUNNING"),
            _session(OLDER_ID, "old", "CANCELLED"),
        ]
        self.refusal = None
        self.comes_up_as, self.reason = "RUNNING", ""

    def call(self, client, method, path, body=None, query=None):
        self.requests.append((method, path, body, query or {}))
        if self.refusal is not None:
            raise self.refusal
        if (method, path) == ("GET", "sessions/"):
            return self.sessions
        if (method, path) == ("GET", "templates/"):
            return [{"id": 7, "name": "gpu-big"}]
        if (method, path) == ("POST", "sessions/"):
            return _session(RUNNING_ID, "new", "PENDING", status_reason="waiting")
        if (method, path) == ("GET", f"sessions/{RUNNING_ID}/"):
            return _session(RUNNING_ID, "new", self.comes_up_as, status_reason=self.reason)
        if (method, path) == ("GET", f"sessions/{RUNNING_ID}/runs/"):
            return [RUN_RAISED]
        if (method, path) == ("POST", f"sessions/{RUNNING_ID}/terminate/"):
            return _session(RUNNING_ID, "new", "TERMINATING")
        raise AssertionError(f"unexpected {method} {path}")


@pytest.fixture
def manager(monkeypatch, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"manager": "http://manager.test", "token": "t0k"}))
    monkeypatch.setenv("BAI_CONFIG", str(config))
    fake = FakeManager()
    monkeypatch.setattr(launch, "WAIT_INTERVAL", 0)
    monkeypatch.setattr(Client, "call", lambda client, *a, **k: fake.call(client, *a, **k))
    return fake


def bai(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


RUN_RAISED = {
    "run_id": "9f2c4e1a0b3d5c7e",
    "mode": "query",
    "user": "alice",
    "status": "finished",
    "exit_code": 1,
    "error": "ZeroDivisionError",
    "outcome": "error: ZeroDivisionError",
    "started_at": "2026-11-27T17:00:00Z",
    "finished_at": "2026-11-27T17:00:01Z",
}


def test_sessions_runs_lists_how_each_run_ended(manager):
    result = bai("sessions", "runs", RUNNING_ID)
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()
    assert header.split() == ["STARTED", "BY", "MODE", "RUN", "ENDED", "EXIT"]
    assert "9f2c4e1a0b3d5c7e  error: ZeroDivisionError  1" in row
    assert json.loads(bai("sessions", "runs", RUNNING_ID, "--json").output) == [RUN_RAISED]


def _created_body(manager):
    return next(body for method, path, body, _ in manager.requests if method == "POST")


def test_sessions_create_sends_each_launch_flag_as_its_field_of_the_launch_body(manager):
    result = bai(
        "sessions",
        "create",
        "bai-kernel/python:2",
        "--name",
        "exp1",
        "--type",
        "batch",
        "-g",
        "gpu",
        "--cluster-size",
        "3",
        "--cluster-mode",
        "multi-node",
        "-r",
        "cpu=1",
        "-r",
        "mem=1g",
        "-e",
        "A=1",
        "-e",
        "B=x=y",
        "-m",
        "data",
        "-m",
        "models",
        "--startup-command",
        "python train.py",
        "-p",
        "8080",
        "--starts-at",
        "2030-01-01T00:00:00Z",
        "--batch-timeout",
        "3600",
        "--depends-on",
        "train",
        "--depends-on",
        OLDER_ID,
        "--template",
        "gpu-big",
        "--agent",
        "node-a",
        "--sub-image",
        "bai-kernel/worker:1",
        "--sub-resources",
        "cpu=2",
        "--sub-replicas",
        "2",
        "--main-resources",
        "mem=4g",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert _created_body(manager) == {
        "image": "bai-kernel/python:2",
        "name": "exp1",
        "type": "batch",
        "resource_group": "gpu",
        "cluster_size": 3,
        "cluster_mode": "multi-node",
        "resources": {"cpu": "1", "mem": "1g"},
        "env": {"A": "1", "B": "x=y"},
        "mounts": ["data", "models"],
        "startup_command": "python train.py",
        "ports": [8080],
        "starts_at": "2030-01-01T00:00:00Z",
        "batch_timeout": 3600.0,
        # A name is the active session of that name; an id stays as it is.
        "depends_on": [RUNNING_ID, OLDER_ID],
        "template": 7,
        "agents": ["node-a"],
        "roles": {
            "main": {"resources": {"mem": "4g"}},
            "sub": {"image": "bai-kernel/worker:1", "resources": {"cpu": "2"}, "replicas": 2},
        },
    }


def test_sessions_create_sends_only_the_fields_given_so_a_template_fills_the_rest(manager):
    result = bai("sessions", "create", "--template", "7", "--json")
    assert result.exit_code == 0, result.output
    assert _created_body(manager) == {"template": 7}
    assert json.loads(result.stdout)["id"] == RUNNING_ID


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["sessions", "create", "img", "-r", "cpu"], "'cpu' is not KEY=VALUE"),
        (["sessions", "create", "img", "-e", "=1"], "'=1' is not KEY=VALUE"),
        (["sessions", "create", "img", "--cluster-mode", "ring"], "'ring' is not one of"),
        (["sessions", "create", "img", "--cluster-size", "0"], "0 is not in the range x>=1"),
        (["sessions", "create", "img", "-p", "80"], "80 is not in the range 1024<=x<=65535"),
        (["sessions", "create"], "give an IMAGE, or a --template"),
        (["sessions", "terminate"], "Missing argument 'SESSION...'"),
        (["exec", RUNNING_ID], "give the CODE to run, or --file"),
        (["exec", RUNNING_ID, "print(1)", "--file", "/dev/null"], "(one of the two)"),
        (["run", "img"], "give the CODE to run, or --file"),
        (["logs"], "Missing argument 'SESSION'"),
    ],
)
def test_a_usage_error_exits_2_saying_what_is_wrong_and_asks_nothing_of_the_manager(
    manager, args, words
):
    result = bai(*args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr
    assert [r for r in manager.requests if r[0] == "POST"] == []


def test_the_managers_refusal_exits_1_in_its_words_with_every_field(manager):
    manager.refusal = ApiError(
        400,
        "resources: cpu: at most 3 decimal places",
        {
            "resources": ["cpu: at most 3 decimal places"],
            "mounts": ["no folder of yours named 'x'"],
        },
    )
    result = bai("sessions", "create", "img", "-r", "cpu=0.0001")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: resources: cpu: at most 3 decimal places\n  mounts: no folder of yours named 'x'\n"
    )


def test_a_session_is_named_by_id_or_by_name_the_active_one_first_else_the_newest(manager):
    client = Client("http://manager.test", "t0k")
    assert client.session_id("train") == RUNNING_ID
    assert client.session_id(ENDED_ID) == ENDED_ID
    manager.sessions[1]["status"] = "ERROR"
    assert client.session_id("train") == ENDED_ID
    with pytest.raises(ApiError, match="You have no session named 'nope'"):
        client.session_id("nope")


def test_sessions_with_no_command_lists_as_sessions_list_does(manager):
    listed = bai("sessions")
    assert listed.exit_code == 0
    assert listed.stdout == bai("sessions", "list").stdout
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "TYPE", "IMAGE", "CLUSTER", "APPS"]
    assert [row.split()[:3] for row in rows] == [
        [ENDED_ID, "train", "TERMINATED"],
        [RUNNING_ID, "train", "RUNNING"],
        [OLDER_ID, "old", "CANCELLED"],
    ]
    bai("sessions", "list", "--status", "RUNNING", "--all")
    assert manager.requests[-1] == ("GET", "sessions/", None, {"status": "RUNNING", "all": "true"})


def test_not_logged_in_says_how_to_log_in(monkeypatch, tmp_path):
    monkeypatch.setenv("BAI_CONFIG", str(tmp_path / "none.json"))
    result = bai("sessions", "list")
    assert result.exit_code == 1 and "not logged in: run `bai login" in result.stderr


def test_websocket_urls_follow_the_managers_scheme():
    assert Client("http://h:8000/").websocket_url("sessions/x/execute/") == (
        "ws://h:8000/ws/sessions/x/execute/"
    )
    assert Client("https://bai.example.org").websocket_url("/sessions/") == (
        "wss://bai.example.org/ws/sessions/"
    )


@pytest.mark.parametrize(
    ("record", "stdout", "stderr"),
    [
        ({"kind": "stdout", "data": "a"}, "a", ""),
        ({"kind": "stderr", "data": "b"}, "", "b"),
        ({"kind": "result", "data": "42", "mime": "text/plain"}, "42\n", ""),
        ({"kind": "display", "data": "iVBORw0KGgo=", "mime": "image/png"}, "", "image/png"),
        ({"kind": "error", "data": "Traceback…\nZeroDivisionError"}, "", "ZeroDivisionError\n"),
        ({"kind": "notice", "data": "[output cut]"}, "", "[output cut]\n"),
    ],
)
def test_each_kind_of_record_goes_where_a_terminal_shows_it(record, stdout, stderr):
    out, err = io.StringIO(), io.StringIO()
    show_record(record, out, err)
    assert out.getvalue() == stdout
    assert stderr in err.getvalue() and (stderr or err.getvalue() == "")


def test_a_run_past_its_time_limit_exits_124_as_gnu_timeout_does():
    assert Outcome("exec-timeout", None).exit_status == 124
    assert Outcome("finished", 3).exit_status == 3


def _terminated(manager):
    return [path for method, path, *_ in manager.requests if path.endswith("/terminate/")]


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (Outcome("finished", 0), 0),
        (Outcome("finished", 3), 3),
        (StreamError("the manager closed the connection"), 1),
        (KeyboardInterrupt(), 130),
    ],
)
def test_bai_run_ends_its_session_whatever_the_run_did_and_exits_with_its_status(
    manager, monkeypatch, outcome, status
):
    sent = []

    async def execute(url, token, *, code, options, say):
        sent.append((url, code, options))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(cli, "execute", execute)
    result = bai("run", "bai-kernel/python:2", "print(1)", "--cluster-size", "2")
    assert result.exit_code == status, result.output
    assert _created_body(manager) == {
        "image": "bai-kernel/python:2",
        "type": "interactive",
        "cluster_size": 2,
    }
    assert sent == [(f"ws://manager.test/ws/sessions/{RUNNING_ID}/execute/", "print(1)", {})]
    assert _terminated(manager) == [f"sessions/{RUNNING_ID}/terminate/"]
    assert "Session new terminated." in result.stderr


def test_bai_run_ends_a_session_that_never_came_up_and_says_why(manager, monkeypatch):
    manager.comes_up_as, manager.reason = "CANCELLED", "pending timeout"
    monkeypatch.setattr(cli, "execute", None)  # never reached
    result = bai("run", "bai-kernel/python:2", "print(1)")
    assert result.exit_code == 1
    assert "Error: session new ended CANCELLED: pending timeout" in result.stderr
    assert _terminated(manager) == [f"sessions/{RUNNING_ID}/terminate/"]


def test_bai_sessions_all_lists_every_users_sessions_with_their_owners_as_the_readme_says(
    manager,
):
    for session in manager.sessions:
        session["owner"] = "bob"
    listed = bai("sessions", "--all")
    assert listed.exit_code == 0, listed.output
    assert manager.requests[-1] == ("GET", "sessions/", None, {"all": "true"})
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["ID", "OWNER", "NAME"]
    assert [row.split()[:3] for row in rows][1] == [RUNNING_ID, "bob", "train"]
    assert bai("sessions", "list", "--all").stdout == listed.stdout
    as_json = bai("sessions", "--status", "RUNNING", "--json")
    assert json.loads(as_json.stdout) == manager.sessions
    assert manager.requests[-1] == ("GET", "sessions/", None, {"status": "RUNNING"})


class Terminal(io.StringIO):
    def isatty(self):
        return True


TRACEBACK = "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero\n"


def test_colours_reach_a_terminal_only_and_never_under_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    piped, terminal = io.StringIO(), Terminal()
    show_record({"kind": "error", "data": TRACEBACK}, io.StringIO(), piped)
    show_record({"kind": "error", "data": TRACEBACK}, io.StringIO(), terminal)
    assert piped.getvalue() == "ZeroDivisionError: division by zero\n"
    assert terminal.getvalue() == TRACEBACK
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = Terminal()
    show_record({"kind": "stdout", "data": "\x1b[1mbold\x1b[0m"}, terminal, io.StringIO())
    assert terminal.getvalue() == "bold"


def test_bai_app_prints_the_link_that_logs_into_jupyter_with_its_token(manager, monkeypatch):
    from bai_client import forward

    apps = [
        {
            "name": "jupyter",
            "protocol": "http",
            "port": 8888,
            "forward_url": "ws://x/j",
            "forward_token": "s3cr-et_",
        },
        {
            "name": "echo",
            "protocol": "tcp",
            "port": 7000,
            "forward_url": "ws://x/e",
            "forward_token": None,
        },
    ]
    manager.sessions[1]["apps"] = apps
    forwarded = []

    async def serve(host, port, url, token, log, ready):
        forwarded.append((host, port, url, token))
        ready(43210)

    monkeypatch.setattr(forward, "serve", serve)
    monkeypatch.setattr(
        FakeManager,
        "call",
        lambda self, client, method, path, body=None, query=None: (
            self.sessions if path == "sessions/" else self.sessions[1]
        ),
    )
    result = bai("app", RUNNING_ID, "jupyter")
    assert result.exit_code == 0, result.output
    assert "Open http://127.0.0.1:43210/?token=s3cr-et_" in result.stdout
    assert forwarded == [("127.0.0.1", 0, "ws://x/j", "t0k")]
    echo = bai("app", RUNNING_ID, "echo", "--bind", "127.0.0.1:7001")
    assert "Forwarding 127.0.0.1:43210 -> echo" in echo.stdout and "Open" not in echo.stdout


def test_waiting_for_a_batch_session_waits_for_its_result_not_a_moment_of_running(monkeypatch):
    monkeypatch.setattr(launch, "WAIT_INTERVAL", 0)
    seen = iter(
        [
            _session(RUNNING_ID, "job", "RUNNING", type="batch"),
            _session(
                RUNNING_ID,
                "job",
                "TERMINATED",
                type="batch",
                result="FAILED",
                exit_code=3,
                status_reason="the start command exited with status 3",
            ),
        ]
    )

    class Seen:
        def call(self, method, path):
            return next(seen)

    said: list[str] = []
    created = _session(RUNNING_ID, "job", "PENDING", type="batch")
    ended = launch.wait_until_running(Seen(), created, said.append)
    assert ended["status"] == "TERMINATED"
    assert said == [
        "job: RUNNING",
        "job: TERMINATED (the start command exited with status 3)",
    ]
    assert launch.failure(ended) == (
        "session job ended TERMINATED: the start command exited with status 3"
    )
    # An interactive session is up once it runs.
    running = _session(RUNNING_ID, "lab", "RUNNING")
    assert launch.wait_until_running(Seen(), running, said.append) is running
    assert launch.failure(running) is None


def test_the_cli_module_run_directly_is_the_cli_and_not_silent():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for module in ("bai_client", "bai_client.cli"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("Usage: bai "), (module, done.stdout)
