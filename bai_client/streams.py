"""The manager's websockets that ``bai`` reads: a kernel's log
(``/ws/sessions/<id>/kernels/<kernel>/logs/``) and code execution
(``/ws/sessions/<id>/execute/``), both with the API token."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from .output import write

MAX_FRAME = 16 * 2**20
# Without --follow, a live log is read until it has been quiet for LOG_QUIET
# (the container's backlog comes first, in a burst), for at most BACKLOG_WINDOW
# after its first chunk (a chatty container is never quiet) or, when nothing
# comes at all, until FIRST_CHUNK_WAIT after the stream opened.
LOG_QUIET = 0.5
BACKLOG_WINDOW = 1.0
FIRST_CHUNK_WAIT = 3.0
# exec-timeout has no exit status of its own: use GNU timeout's.
TIMEOUT_EXIT = 124


class StreamError(Exception):
    """The manager refused or ended a stream; the message is its words."""


def stream_error(exc: Exception) -> StreamError:
    """A websocket's failure in users' words."""
    if isinstance(exc, StreamError):
        return exc
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status == 404:
            return StreamError("this manager does not offer that stream (is it older than bai?)")
        return StreamError(f"the manager refused the stream (HTTP {status})")
    if isinstance(exc, ConnectionClosed):
        return StreamError("the manager closed the connection")
    return StreamError(f"cannot reach the manager: {exc}")


STREAM_FAILURES = (StreamError, WebSocketException, OSError, TimeoutError)


def _connect(url: str, token: str) -> Any:
    return connect(url, additional_headers={"Authorization": f"Token {token}"}, max_size=MAX_FRAME)


def _message(raw: str | bytes) -> dict[str, Any]:
    message = json.loads(raw)
    if message.get("type") == "error":
        raise StreamError(message.get("message") or "the manager refused the stream")
    return message


# --- logs ----------------------------------------------------------------------------------


async def read_log(
    url: str,
    token: str,
    *,
    follow: bool,
    write: Callable[[str], None],
    say: Callable[[str], None],
) -> None:
    """Write a kernel's log: the kept tail of one that ended, or what a live one
    wrote so far and, with ``follow``, what it writes until it ends."""
    clock = asyncio.get_running_loop().time
    until = None if follow else clock() + FIRST_CHUNK_WAIT
    backlog_ends = None
    async with _connect(url, token) as ws:
        while True:
            wait = None if until is None else max(0.0, until - clock())
            try:
                message = _message(await asyncio.wait_for(ws.recv(), wait))
            except (TimeoutError, ConnectionClosed):
                return
            kind = message.get("type")
            if kind == "chunk":
                write(message.get("data", ""))
                if not follow:
                    backlog_ends = backlog_ends or clock() + BACKLOG_WINDOW
                    until = min(clock() + LOG_QUIET, backlog_ends)
            elif kind == "state" and (follow or not message.get("live")):
                say(message.get("message", ""))
            elif kind == "ended":
                say(f"ended {message.get('status')}: {message.get('reason') or 'no reason given'}")
                return


# --- execution -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status: str  # "finished" or "exec-timeout"
    exit_code: int | None

    @property
    def exit_status(self) -> int:
        return TIMEOUT_EXIT if self.exit_code is None else self.exit_code


def show_record(record: dict[str, Any], out: Any = None, err: Any = None) -> None:
    """One output record as a terminal shows it: streams to their own, results
    and displays as text (an image only as a note on stderr); colours only on a
    terminal and without NO_COLOR (``output.write``)."""
    out, err = out or sys.stdout, err or sys.stderr
    kind, data, mime = record.get("kind"), record.get("data") or "", record.get("mime")
    if kind == "stdout":
        write(data, out)
    elif kind == "stderr":
        write(data, err)
    elif kind in ("result", "display") and mime and mime.startswith("image/png"):
        write(f"[{mime} output of {len(data) * 3 // 4} bytes, not shown]\n", err)
    elif kind in ("result", "display"):
        write(data if data.endswith("\n") else data + "\n", out)
    else:  # error (a traceback, coloured by the kernel), notice
        write(data if data.endswith("\n") else data + "\n", err)


class _StdinLines:
    """Lines of standard input, read by a daemon thread (a blocked read never
    holds up the event loop nor the exit); None once it ends."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.thread: threading.Thread | None = None

    async def next(self) -> str | None:
        if self.thread is None:
            loop = asyncio.get_running_loop()
            self.thread = threading.Thread(target=self._read, args=(loop,), daemon=True)
            self.thread.start()
        return await self.queue.get()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            line = sys.stdin.readline()
            loop.call_soon_threadsafe(self.queue.put_nowait, line.rstrip("\n") if line else None)
            if not line:
                return


class _Run:
    """One run over the execute websocket: output as it comes, ``input()``
    answered from standard input, the first Ctrl-C sent as an interrupt (the
    second one stops waiting)."""

    def __init__(self, ws: ClientConnection, say: Callable[[str], None]) -> None:
        self.ws = ws
        self.say = say
        self.run_id: str | None = None
        self.interrupts = 0
        self.stdin = _StdinLines()
        self.answering: asyncio.Task[None] | None = None
        self.task = asyncio.current_task()

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    def on_sigint(self) -> None:
        self.interrupts += 1
        if self.interrupts > 1 and self.task is not None:
            self.task.cancel()
            return
        self.say("Interrupting the run (Ctrl-C again to stop waiting for it)…")
        interrupt = {"type": "interrupt", **({"run_id": self.run_id} if self.run_id else {})}
        asyncio.ensure_future(self.send(interrupt))

    async def answer_input(self) -> None:
        sys.stdout.flush()
        line = await self.stdin.next()
        if line is None:
            self.say("Standard input ended while the code waits for input: interrupting it.")
            await self.send({"type": "interrupt", "run_id": self.run_id})
        else:
            await self.send({"type": "input", "run_id": self.run_id, "code": line})

    async def outcome(self) -> Outcome:
        async for raw in self.ws:
            message = _message(raw)
            self.run_id = message.get("run_id") or self.run_id
            for record in message.get("records") or []:
                show_record(record)
            if message.get("type") != "result":
                continue
            if message.get("status") == "waiting-input":
                self.answering = asyncio.ensure_future(self.answer_input())
                continue
            if self.answering is not None:
                self.answering.cancel()
            return Outcome(message.get("status", ""), message.get("exit_code"))
        raise StreamError("the manager closed the connection before the run finished")


async def execute(
    url: str,
    token: str,
    *,
    code: str,
    mode: str = "query",
    options: dict[str, Any] | None = None,
    say: Callable[[str], None],
) -> Outcome:
    """Run ``code`` in the session's main1, showing its output as it comes."""
    async with _connect(url, token) as ws:
        run = _Run(ws, say)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, run.on_sigint)
        try:
            try:
                await run.send(
                    {"type": "run", "mode": mode, "code": code, "options": options or {}}
                )
            except ConnectionClosed:
                pass  # a refusal: its reason waits to be read
            return await run.outcome()
        finally:
            loop.remove_signal_handler(signal.SIGINT)
