"""Helpers shared by the agent's tests: a frame collector, a fake manager, kernel specs."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from agent import protocol


class Frames:
    """Collects the frames a backend emits, and waits for the one a test expects."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def __call__(self, frame: dict[str, Any]) -> None:
        self.seen.append(frame)
        self._changed.set()

    async def wait_for(self, timeout: float = 10.0, **match: Any) -> dict[str, Any]:
        """The first frame (seen or to come) whose fields equal ``match``."""
        async with asyncio.timeout(timeout):
            start = 0
            while True:
                for frame in self.seen[start:]:
                    if all(frame.get(k) == v for k, v in match.items()):
                        return frame
                start = len(self.seen)
                self._changed.clear()
                await self._changed.wait()

    def text(self, term_id: str) -> str:
        return "".join(
            f["data"]
            for f in self.seen
            if f["type"] == protocol.TERM_OUTPUT and f["term_id"] == term_id
        )

    async def wait_text(self, term_id: str, needle: str, timeout: float = 10.0) -> str:
        async with asyncio.timeout(timeout):
            while needle not in self.text(term_id):
                self._changed.clear()
                await self._changed.wait()
        return self.text(term_id)


class FakeManager:
    """A websocket server that speaks the manager's side of agent/protocol.py."""

    def __init__(self, token: str = "good-token", heartbeat_interval: float = 0.2) -> None:
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self.settings: dict[str, Any] = {}  # more fields of its "registered" answer
        self.frames = Frames()
        self.connections: list[ServerConnection] = []
        self.auth_headers: list[str | None] = []
        self.server = None
        self.url = ""

    async def start(self) -> None:
        # As the manager's daphne (backendai_web.serve): room for the largest frame the
        # gateway checks, not the websockets library's 1 MiB default.
        self.server = await serve(
            self._handler, "127.0.0.1", 0, max_size=protocol.max_frame_chars()
        )
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}"

    async def _handler(self, ws: ServerConnection) -> None:
        auth = ws.request.headers.get("Authorization")
        self.auth_headers.append(auth)
        if auth != f"Token {self.token}":
            await ws.close(protocol.CLOSE_BAD_TOKEN, "unknown token")
            return
        self.connections.append(ws)
        async for raw in ws:
            msg = json.loads(raw)
            msg["_conn"] = len(self.connections)
            self.frames(msg)
            if msg["type"] == protocol.REGISTER:
                await ws.send(
                    json.dumps(
                        {
                            "type": protocol.REGISTERED,
                            "agent_id": "agent-under-test",
                            "heartbeat_interval": self.heartbeat_interval,
                            **self.settings,
                        }
                    )
                )

    async def send(self, msg: dict[str, Any]) -> None:
        await self.connections[-1].send(json.dumps(msg))

    async def drop(self) -> None:
        """Close the current connection as if the manager restarted."""
        await self.connections[-1].close(1012, "restarting")

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def _env(hostname: str, session_id: str, kernel_id: str) -> dict[str, str]:
    return {
        "BACKENDAI_CLUSTER_HOST": hostname,
        "BACKENDAI_CLUSTER_HOSTS": "main1,sub1",
        "BACKENDAI_CLUSTER_IDX": "1",
        "BACKENDAI_CLUSTER_MODE": "single-node",
        "BACKENDAI_CLUSTER_ROLE": "main" if hostname.startswith("main") else "sub",
        "BACKENDAI_CLUSTER_SIZE": "2",
        "BACKENDAI_KERNEL_ID": kernel_id,
        "BACKENDAI_SESSION_ID": session_id,
    }


def spec(
    *hosts: str, command: str | None = None, mounts: list | None = None, session_id: str = ""
) -> dict:
    session_id = session_id or uuid.uuid4().hex
    kernels = []
    for host in hosts or ("main1",):
        kernel_id = session_id if host == "main1" else uuid.uuid4().hex
        kernels.append(
            {
                "kernel_id": kernel_id,
                "hostname": host,
                "role": "main" if host == "main1" else "sub",
                "image": "native",
                "slots": {"cpu": "1", "mem": "268435456"},
                "env": _env(host, session_id, kernel_id),
                "mounts": mounts or [],
                "startup_command": command if host == "main1" else None,
                "cluster_hosts": list(hosts or ("main1",)),
            }
        )
    return {
        "type": protocol.CREATE_KERNELS,
        "session_id": session_id,
        "network": f"bai-{session_id}",
        "cluster_mode": "single-node",
        "session_type": "batch" if command else "interactive",
        "ssh": None,
        "kernels": kernels,
    }


# --- code execution -------------------------------------------------------------------

# A 1x1 PNG, as IPython.display.Image is given it in the tests.
PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
# 50 MB written in 1 MB pieces, as fast as the kernel can.
FLOOD_50MB = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)\n"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Runs:
    """Sends exec commands the way the manager does (``send``: the fake manager's socket,
    or a backend's execution hub) and collects the answers from ``frames``. Every exec
    frame it reads must pass the manager's checks (protocol.validate)."""

    def __init__(self, frames: Frames, send: Callable[[dict], Any], kernel_id: str) -> None:
        self.frames = frames
        self.send = send
        self.kernel_id = kernel_id

    async def ask(
        self,
        mode: str,
        code: str = "",
        *,
        run_id: str | None = None,
        options: dict | None = None,
        stream: bool = False,
        flush: float = 1.0,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """One request; its exec_result with the streamed records in front of its own."""
        req_id = uuid.uuid4().hex
        sent = self.send(
            {
                "type": protocol.EXEC,
                "req_id": req_id,
                "kernel_id": self.kernel_id,
                "mode": mode,
                "run_id": run_id,
                "code": code,
                "options": options or {},
                "stream": stream,
                "flush": flush,
            }
        )
        if inspect.isawaitable(sent):  # a backend's hub answers (or streams) before it returns
            async with asyncio.timeout(timeout):
                await sent
        result = await self.frames.wait_for(timeout, type=protocol.EXEC_RESULT, req_id=req_id)
        streamed = []
        for frame in self.frames.seen:
            if frame.get("req_id") == req_id:
                wire = {k: v for k, v in frame.items() if k != "_conn"}
                assert protocol.validate(wire) is None, protocol.validate(wire)
                if frame["type"] == protocol.EXEC_RECORDS:
                    streamed += frame["records"]
        return {**result, "records": streamed + result["records"]}

    async def run(self, code: str, mode: str = "query", **kwargs: Any) -> tuple[dict, list]:
        """A run followed to its end (continued while it says "continued"): the last
        answer and every record of the run."""
        answer = await self.ask(mode, code, **kwargs)
        records = list(answer["records"])
        while answer["status"] == protocol.EXEC_CONTINUED:
            answer = await self.ask(
                "continue", run_id=answer["run_id"], flush=kwargs.get("flush", 1.0)
            )
            records += answer["records"]
        return answer, records


def text(records: list[dict], kind: str = "stdout") -> str:
    return "".join(r["data"] for r in records if r["kind"] == kind)


def peak_rss_reset() -> None:
    """Start measuring this process's peak resident memory afresh (VmHWM)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def size_shown(limit: int) -> str:
    return f"{limit // 1024**2} MiB" if limit % 1024**2 == 0 else f"{limit // 1024} KiB"


class CodeExecutionOnEveryBackend:
    """What code execution does whatever the backend: a test module subclasses it as
    ``TestCodeExecution`` and provides a module-wide ``runs`` fixture (one kernel and its
    runner) and the output limit its agent was given."""

    limit = 1024 * 1024  # the agent's exec_output_limit in that module
    stream = False  # whether the 50 MB burst is streamed or fetched with continues

    async def test_state_persists_from_one_run_to_the_next(self, runs: Runs) -> None:
        first, _ = await runs.run("x = 41")  # the first run starts the runner
        answer, records = await runs.run("x + 1")
        assert (first["status"], first["exit_code"]) == ("finished", 0)
        assert (answer["status"], answer["exit_code"]) == ("finished", 0)
        assert records == [{"kind": "result", "data": "42", "mime": "text/plain"}]
        assert answer["run_id"] != first["run_id"] and len(answer["run_id"]) == 16

    async def test_a_run_waiting_for_input_gets_the_line_and_goes_on(self, runs: Runs) -> None:
        answer, records = await runs.run("name = input('Name: ')\nprint('hi', name)")
        assert (answer["status"], answer["exit_code"], text(records)) == (
            "waiting-input",
            None,
            "Name: ",
        )
        answer, records = await runs.run("Ada", mode="input", run_id=answer["run_id"])
        assert (answer["status"], answer["exit_code"], text(records)) == ("finished", 0, "hi Ada\n")

    async def test_a_run_waiting_for_input_is_interrupted_and_the_next_one_runs(
        self, runs: Runs
    ) -> None:
        answer, _ = await runs.run("name = input('Name: ')")
        assert answer["status"] == "waiting-input"
        answer, records = await runs.run("", mode="interrupt", run_id=answer["run_id"])
        assert (answer["status"], answer["exit_code"], answer["error"]) == (
            "finished",
            1,
            "KeyboardInterrupt",
        )
        assert "KeyboardInterrupt" in ANSI.sub("", text(records, "error"))
        answer, records = await runs.run("print('next')")
        assert (answer["status"], answer["exit_code"], text(records)) == ("finished", 0, "next\n")

    async def test_a_page_opened_again_attaches_to_the_run_that_is_going(self, runs: Runs) -> None:
        """A streamed continue without a run id follows the run that is going (a page
        reloaded while its run waits in input() or runs); with none going it is refused."""
        refused = await runs.ask("continue", stream=True)
        assert refused["reason"] == "no run is going in this session"
        answer, _ = await runs.run("name = input('Name: ')\nprint('hi', name)")
        attached = await runs.ask("continue", stream=True)
        assert (attached["status"], attached["run_id"]) == ("waiting-input", answer["run_id"])
        answer, records = await runs.run("Ada", mode="input", run_id=answer["run_id"])
        assert (answer["status"], text(records)) == ("finished", "hi Ada\n")

        # A run that goes: the stream that attached gets the rest, the first one ends.
        code = "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(0.5)"
        run_id = uuid.uuid4().hex[:16]
        ask = runs.ask("query", code, run_id=run_id, stream=True, timeout=30)
        first = asyncio.ensure_future(ask)
        async with asyncio.timeout(30):
            while not [f for f in runs.frames.seen if f.get("run_id") == run_id]:
                await asyncio.sleep(0.05)
        attached = await runs.ask("continue", stream=True, timeout=30)
        first = await first
        assert first["status"] == "continued" and attached["run_id"] == run_id
        assert (attached["status"], attached["exit_code"]) == ("finished", 0)
        assert text(first["records"]) + text(attached["records"]) == "0\n1\n2\n3\n"
        assert text(attached["records"]).endswith("3\n")

    async def test_a_ten_second_run_comes_in_pieces_to_its_end(self, runs: Runs) -> None:
        """Streamed as it prints, or answered about every flush while it is continued."""
        code = "import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(1)\n"
        started = time.monotonic()
        answers = [await runs.ask("query", code, stream=self.stream, flush=1.5, timeout=30)]
        while answers[-1]["status"] == "continued":
            answers.append(await runs.ask("continue", run_id=answers[-1]["run_id"], flush=1.5))
        pieces = [
            frame
            for frame in runs.frames.seen
            if frame.get("type") in (protocol.EXEC_RECORDS, protocol.EXEC_RESULT)
            and frame["run_id"] == answers[0]["run_id"]
            and frame["records"]
        ]
        assert time.monotonic() - started >= 9
        assert len(pieces) >= 5  # sent as they came, not once at the end
        assert text([r for a in answers for r in a["records"]]) == "".join(
            f"{i}\n" for i in range(10)
        )
        assert (answers[-1]["status"], answers[-1]["exit_code"]) == ("finished", 0)

    async def test_an_endless_loop_is_interrupted(self, runs: Runs) -> None:
        answer = await runs.ask("query", "while True: pass", flush=0.5)
        assert answer["status"] == "continued"
        answer, records = await runs.run("", mode="interrupt", run_id=answer["run_id"])
        assert (answer["status"], answer["exit_code"], answer["error"]) == (
            "finished",
            1,
            "KeyboardInterrupt",
        )
        assert "KeyboardInterrupt" in ANSI.sub("", text(records, "error"))

    async def test_code_holding_a_nul_ends_with_an_error_and_the_next_run_runs(
        self, runs: Runs
    ) -> None:
        """ipykernel 6 (the Docker image's) fails on such code without a reply: the run
        used to stay "continued" for ever and refuse every next run."""
        answer = await runs.ask("query", "print('a\u0000b')", flush=1.0)
        records = list(answer["records"])
        for _ in range(15):  # ends within the kernel's start and the runner's grace
            if answer["status"] != "continued":
                break
            answer = await runs.ask("continue", run_id=answer["run_id"], flush=1.0)
            records += answer["records"]
        assert (answer["status"], answer["exit_code"]) == ("finished", 1)
        said = ANSI.sub("", text(records, "error") + text(records, "notice"))
        assert "null bytes" in said, records
        answer, records = await runs.run("print('after')")
        assert (answer["status"], answer["exit_code"], text(records)) == ("finished", 0, "after\n")

    async def test_a_run_that_raises_names_its_exception(self, runs: Runs) -> None:
        answer, records = await runs.run("1 / 0")
        assert (answer["status"], answer["exit_code"], answer["error"]) == (
            "finished",
            1,
            "ZeroDivisionError",
        )
        assert "ZeroDivisionError" in ANSI.sub("", text(records, "error"))
        answer, _ = await runs.run("import sys\nsys.exit(3)")
        assert (answer["exit_code"], answer["error"]) == (3, None)

    async def test_a_png_display_comes_back_as_image_png(self, runs: Runs) -> None:
        code = f"from IPython.display import Image, display\ndisplay(Image(data={PNG_1PX!r}))\n"
        answer, records = await runs.run(code)
        displays = [r for r in records if r["kind"] == "display"]
        assert answer["exit_code"] == 0
        assert [r["mime"] for r in displays] == ["image/png"]
        assert base64.b64decode(displays[0]["data"]) == PNG_1PX

    async def test_completing_import_o_offers_os(self, runs: Runs) -> None:
        answer = await runs.ask("complete", "import o", options={"cursor_pos": 8})
        assert (answer["reason"], answer["run_id"]) == (None, "")
        assert "os" in answer["completions"]

    async def test_sys_exit_3_gives_exit_code_3(self, runs: Runs) -> None:
        answer, records = await runs.run("import sys\nsys.exit(3)")
        assert (answer["status"], answer["exit_code"]) == ("finished", 3)
        assert not [r for r in records if r["kind"] == "error"]

    async def test_a_batch_builds_then_runs_and_answers_the_exit_status(self, runs: Runs) -> None:
        build = "printf 'print(6 * 7)' > prog.py"
        options = {"build": build, "exec": "python3 prog.py; echo oops >&2; exit 5"}
        answer, records = await runs.run("", mode="batch", options=options)
        assert (answer["status"], answer["exit_code"]) == ("finished", 5)
        assert (text(records), text(records, "stderr")) == ("42\n", "oops\n")
        options = {"build": "echo compiling; exit 2", "exec": "echo never"}
        answer, records = await runs.run("", mode="batch", options=options)
        assert (answer["exit_code"], text(records)) == (2, "compiling\n")

    async def test_a_50_mb_burst_is_cut_at_the_limit_and_the_agent_stays_small(
        self, runs: Runs
    ) -> None:
        # This process holds the agent (and its manager or collector): it never grows by
        # anywhere near the 50 MB that the kernel writes.
        limit = self.limit
        peak_rss_reset()
        before = peak_rss()
        if self.stream:
            answer = await runs.ask("query", FLOOD_50MB, stream=True, timeout=120)
            records = answer["records"]
        else:
            answer, records = await runs.run(FLOOD_50MB, flush=0.5)
        assert (answer["status"], answer["exit_code"]) == ("finished", 0)
        assert len(text(records)) == limit
        assert records[-1] == {
            "kind": "notice",
            "data": f"[output cut: more than {size_shown(limit)};"
            " the rest of this run's output was dropped]",
            "mime": None,
        }
        assert peak_rss() - before < 32 * 1024**2


def assert_no_code_runner(answer: dict[str, Any]) -> None:
    assert (answer["status"], answer["exit_code"]) == ("finished", 127)
    assert answer["records"] == [
        {
            "kind": "stderr",
            "data": "this image has no code runner (it needs python3 with ipykernel)",
            "mime": None,
        }
    ]
