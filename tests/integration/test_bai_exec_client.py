"""``bai exec`` against a stand-in for the manager's execute websocket, which
speaks the contract (``/ws/sessions/{id}/execute/``, exec-contract.md): the
real client in a subprocess streams output as it comes, answers ``input()``
from its standard input, turns Ctrl-C into an interrupt and exits with the
run's status. (tests/docker/test_bai_cli.py runs it against the real one.)"""

from __future__ import annotations

import json
import signal
import threading

import pytest
from websockets.sync.server import serve

from tests.live import interrupt_after, start_bai, stop_process, wait_for

SESSION = "0f0f0f0f-0000-4000-8000-000000000001"
TOKEN = "t0k3n"


def _records(*pairs):
    return [{"kind": kind, "data": data, "mime": None} for kind, data in pairs]


class FakeExecute:
    """One script per code: what a run of that code answers."""

    def __init__(self):
        self.received = []
        self.first_shown = threading.Event()

    def handler(self, ws):
        if ws.request.path != f"/ws/sessions/{SESSION}/execute/":
            ws.close(4404)
            return
        if ws.request.headers.get("Authorization") != f"Token {TOKEN}":
            ws.send(json.dumps({"type": "error", "message": "Log in to run code."}))
            return
        run = self.recv(ws)
        getattr(self, f"run_{run['code'].strip()}")(ws)

    def recv(self, ws):
        message = json.loads(ws.recv(timeout=20))
        self.received.append(message)
        return message

    def send(self, ws, **message):
        ws.send(json.dumps({"run_id": "r1", **message}))

    def run_stream(self, ws):
        self.send(ws, type="records", records=_records(("stdout", "first\n")))
        # The rest comes only once the user has seen the first line.
        assert self.first_shown.wait(20)
        self.send(
            ws, type="records", records=_records(("stdout", "second\n"), ("stderr", "warn\n"))
        )
        self.send(ws, type="result", status="finished", exit_code=3)

    def run_ask(self, ws):
        self.send(ws, type="records", records=_records(("stdout", "Name? ")))
        self.send(ws, type="result", status="waiting-input", exit_code=None)
        answer = self.recv(ws)
        if answer["type"] == "input":
            self.send(ws, type="records", records=_records(("stdout", f"hello {answer['code']}\n")))
            self.send(ws, type="result", status="finished", exit_code=0)
        else:
            self.interrupted(ws)

    def run_loop(self, ws):
        self.send(ws, type="records", records=_records(("stdout", "looping\n")))
        assert self.recv(ws)["type"] == "interrupt"
        self.interrupted(ws)

    def run_stuck(self, ws):
        self.send(ws, type="records", records=_records(("stdout", "stuck\n")))
        assert self.recv(ws)["type"] == "interrupt"
        ws.recv(timeout=20)  # no answer, until the client hangs up

    def interrupted(self, ws):
        self.send(ws, type="records", records=_records(("error", "KeyboardInterrupt")))
        self.send(ws, type="result", status="finished", exit_code=1)

    def run_slow(self, ws):
        self.send(ws, type="result", status="exec-timeout", exit_code=None)

    def run_batch(self, ws):
        message = "this is a batch session; code runs in interactive sessions only"
        ws.send(json.dumps({"type": "error", "message": message}))


@pytest.fixture
def fake():
    fake = FakeExecute()
    with serve(fake.handler, "127.0.0.1", 0) as server:
        fake.port = server.socket.getsockname()[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield fake
        server.shutdown()


@pytest.fixture
def config(fake, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"manager": f"http://127.0.0.1:{fake.port}", "token": TOKEN}))
    return path


def bai_exec(config, *args):
    return start_bai(config, "exec", SESSION, *args)


def test_bai_exec_streams_output_as_it_comes_and_exits_with_the_runs_status(fake, config):
    proc = bai_exec(config, "stream")
    try:
        assert proc.stdout.readline() == "first\n"  # before the run has finished
        fake.first_shown.set()
        out, err = proc.communicate(timeout=20)
    finally:
        stop_process(proc)
    assert (proc.returncode, out, err) == (3, "second\n", "warn\n")
    assert fake.received == [{"type": "run", "mode": "query", "code": "stream", "options": {}}]


def test_bai_exec_answers_input_from_standard_input(fake, config, tmp_path):
    code = tmp_path / "ask.py"
    code.write_text("ask\n")
    proc = bai_exec(config, "--file", str(code), "--timeout", "30")
    out, err = proc.communicate("Ada\n", timeout=20)
    assert (proc.returncode, out) == (0, "Name? hello Ada\n"), err
    run, answer = fake.received
    assert run["options"] == {"timeout": 30.0} and run["code"] == "ask\n"
    assert answer == {"type": "input", "run_id": "r1", "code": "Ada"}


def test_bai_exec_interrupts_the_code_when_input_ends_before_it_is_answered(fake, config):
    proc = bai_exec(config, "ask")
    out, err = proc.communicate("", timeout=20)
    assert proc.returncode == 1 and "KeyboardInterrupt" in err
    assert fake.received[1] == {"type": "interrupt", "run_id": "r1"}


def test_ctrl_c_sends_an_interrupt_and_bai_exec_exits_with_the_interrupted_runs_status(
    fake, config
):
    proc = bai_exec(config, "loop")
    err = interrupt_after(proc, "looping\n", timeout=20)
    assert proc.returncode == 1
    assert "Interrupting the run" in err and "KeyboardInterrupt" in err
    assert fake.received[1] == {"type": "interrupt", "run_id": "r1"}


def test_a_second_ctrl_c_stops_waiting_for_a_run_that_does_not_stop(fake, config):
    proc = bai_exec(config, "stuck")
    try:
        assert proc.stdout.readline() == "stuck\n"
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: len(fake.received) == 2, what="the interrupt")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        stop_process(proc)
    assert proc.returncode == 130 and "Stopped waiting for the run." in err


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        ("slow", 124, "went past its time limit"),
        ("batch", 1, "Error: this is a batch session; code runs in interactive sessions only"),
    ],
)
def test_bai_exec_says_why_a_run_did_not_finish(fake, config, code, status, words):
    proc = bai_exec(config, code)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == status and words in err


def test_bai_exec_with_a_token_the_manager_refuses_says_so(fake, config):
    config.write_text(json.dumps({"manager": f"http://127.0.0.1:{fake.port}", "token": "bad"}))
    proc = bai_exec(config, "stream")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "Error: Log in to run code." in err
