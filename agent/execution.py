"""Code execution on the agent: one code runner per kernel, one run at a time.

The manager's ``exec`` commands (agent/protocol.py) arrive here. The first one for a
kernel starts its code runner (agent/coderunner.py, through the backend's
``spawn_runner``), which keeps one ipykernel for the kernel's life, so state persists
between runs; destroying the kernel ends it. A run's output comes from the runner as
records, already cut at the output limit; the agent keeps what the manager has not
fetched yet in the run's buffer and answers each request with at most one frame
(EXEC_FRAME_DATA bytes of record data): after ``flush`` seconds, or sooner when the run
finishes or waits for input. With ``stream`` it sends ``exec_records`` as records come
and one ``exec_result`` at the end.

The runner is a peer inside the kernel, so the agent trusts none of its output: lines
are bounded, records are checked against the protocol, and a run's buffer never holds
more than the output limit (plus a notice).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import protocol

if TYPE_CHECKING:
    from agent.backends.base import Backend, TermChannel

log = logging.getLogger(__name__)

RUNNER_SOURCE = Path(__file__).with_name("coderunner.py").read_text()
RUNNER_LINE_MAX = 8 * 1024 * 1024  # a records line holds at most one 1 MiB record, escaped
RUNNER_INPUT_MAX = 4 * 1024 * 1024  # commands queued for a runner that does not read them
RUNNER_START_TIMEOUT = 90.0
COMPLETE_TIMEOUT = 5.0
RECORD_MERGE_MAX = 64 * 1024  # adjacent stdout (stderr) records are joined up to this size
PENDING_RECORDS_MAX = 4 * protocol.EXEC_RECORDS_MAX
NOTICE_ROOM = 4 * 1024  # the runner's and the agent's notices, beyond the limit
NO_RUNNER = "this image has no code runner (it needs python3 with ipykernel)"
RUNNER_STOPPED = "[the code runner stopped; the next run starts a new one, without earlier state]"
AGENT_CUT = "[output cut: more than the output limit; the rest of this run's output was dropped]"

RUNNING = "running"  # answered as "continued"
_TEXT_KINDS = frozenset({"stdout", "stderr"})
_SPLIT_KINDS = frozenset({"stdout", "stderr", "error", "notice"})  # text that may be cut


_background: set[asyncio.Task[Any]] = set()


def _in_background(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


class Run:
    """One run (a query or a batch) and the output the manager has not fetched yet."""

    def __init__(self, run_id: str, limit: int) -> None:
        self.run_id = run_id
        self.limit = limit
        self.status = RUNNING
        self.exit_code: int | None = None
        self.error: str | None = None  # the exception a query that ended raised
        self.pending: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self.pending_size = 0
        self.used = 0
        self.cut = False
        self.changed = asyncio.Event()
        self.attached = 0  # how many streams attached to it: each ends the earlier streams

    @property
    def live(self) -> bool:
        return self.status == RUNNING

    def add(self, record: dict[str, Any]) -> None:
        """Keep one record, within the limit (the runner cut already: this is the guard)."""
        size = utf8_size(record["data"])
        if self.used + size > self.limit + NOTICE_ROOM or len(self.pending) >= PENDING_RECORDS_MAX:
            if not self.cut:
                self.cut = True
                self.pending.append(({"kind": "notice", "data": AGENT_CUT, "mime": None}, 0))
                self.changed.set()
            return
        self.used += size
        self.pending_size += size
        last = self.pending[-1] if self.pending else None
        if (
            last is not None
            and record["kind"] in _TEXT_KINDS
            and last[0]["kind"] == record["kind"]
            and last[1] + size <= RECORD_MERGE_MAX
        ):
            self.pending[-1] = (
                {**last[0], "data": last[0]["data"] + record["data"]},
                last[1] + size,
            )
        else:
            self.pending.append((record, size))
        self.changed.set()

    def end(self, status: str, exit_code: int | None, error: str | None = None) -> None:
        self.status = status
        self.exit_code = exit_code
        self.error = error
        self.changed.set()

    def take(self, budget: int = protocol.EXEC_FRAME_DATA) -> list[dict[str, Any]]:
        """The next records, at most ``budget`` bytes of data: text is cut to fill it
        (between characters), a result or display moves whole to the next frame."""
        taken: list[dict[str, Any]] = []
        while self.pending and len(taken) < protocol.EXEC_RECORDS_MAX:
            record, size = self.pending[0]
            if size > budget:
                if taken and (record["kind"] not in _SPLIT_KINDS or budget < 4):
                    break  # a picture is never cut: it goes whole into the next frame
                head = record["data"].encode("utf-8", "replace")[:budget].decode("utf-8", "ignore")
                rest = record["data"][len(head) :]
                self.pending[0] = ({**record, "data": rest}, size - utf8_size(head))
                self.pending_size -= utf8_size(head)
                taken.append({**record, "data": head})
                break
            self.pending.popleft()
            self.pending_size -= size
            budget -= size
            taken.append(record)
        return taken

    def answer_status(self) -> tuple[str, int | None]:
        """What an answer says now: "continued" while output or the run goes on."""
        if self.pending or self.live:
            return protocol.EXEC_CONTINUED, None
        return self.status, self.exit_code if self.status == protocol.EXEC_FINISHED else None

    def answer_error(self) -> str | None:
        """The exception the run ended on, once an answer says it ended."""
        return None if self.pending or self.live else self.error

    async def wait(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Until ``ready()`` or the deadline (loop time)."""
        loop = asyncio.get_running_loop()
        while not ready():
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


class Lines:
    """Splits a byte stream into lines of at most ``limit`` bytes; longer ones are dropped."""

    def __init__(self, limit: int = RUNNER_LINE_MAX) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.skipping = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.buf += data
        while (end := self.buf.find(b"\n")) >= 0:
            line = bytes(self.buf[:end])
            del self.buf[: end + 1]
            if self.skipping:
                self.skipping = False
                continue
            yield line
        if len(self.buf) > self.limit:
            log.warning("the code runner wrote a line over %d bytes: dropped", self.limit)
            self.buf.clear()
            self.skipping = True


class KernelRunner:
    """The code runner of one kernel: its channel, its state, its current (or last) run."""

    def __init__(self, backend: Backend, kernel_id: str) -> None:
        self.backend = backend
        self.kernel_id = kernel_id
        self.channel: TermChannel | None = None
        self.lines = Lines()
        self.state = "starting"  # then "ready", "unavailable" or "stopped"
        self.known = asyncio.Event()  # set once the state is no longer "starting"
        self.run: Run | None = None
        self.queued: dict[str, Any] | None = None  # a run to send once ready
        self.completions: dict[int, asyncio.Future[list[str]]] = {}
        self.ids = itertools.count(1)
        self.warned = False

    async def start(self) -> None:
        """Start the runner and learn whether it can run code; never raises."""
        try:
            self.channel = await self.backend.spawn_runner(
                self.kernel_id, RUNNER_SOURCE, self._on_data, self._on_eof
            )
            await asyncio.wait_for(self.known.wait(), RUNNER_START_TIMEOUT)
        except TimeoutError:
            self._unavailable("it did not start in time")
        except Exception as exc:  # noqa: BLE001 - a runner that cannot start runs nothing
            self._unavailable(str(exc))

    def _unavailable(self, reason: str) -> None:
        if self.state == "starting":
            log.info("kernel %s has no code runner: %s", self.kernel_id, reason)
            self.state = "unavailable"
            self.known.set()
        if self.run is not None and self.run.live:
            self.run.add({"kind": "stderr", "data": NO_RUNNER, "mime": None})
            self.run.end(protocol.EXEC_FINISHED, 127)
        self.queued = None
        if self.channel is not None:
            _in_background(self.close())

    def _send(self, message: dict[str, Any]) -> None:
        channel = self.channel
        if channel is None:
            return
        if len(getattr(channel, "out", b"")) > RUNNER_INPUT_MAX:  # it stopped reading
            self._warn("the code runner does not read its input: a command was dropped")
            return
        channel.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")

    def _warn(self, what: str) -> None:
        """Log a runner's misbehaviour once: it is the kernel's to repeat at will."""
        if not self.warned:
            self.warned = True
            log.warning("kernel %s: %s (further ones are not logged)", self.kernel_id, what)

    # --- what the runner says -----------------------------------------------------

    def _on_data(self, data: bytes) -> None:
        for line in self.lines.feed(data):
            try:
                message = json.loads(line)
                self._on_message(message)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self._warn(f"a bad line from the code runner ({exc!r})"[:300])

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        run = self.run
        mine = run is not None and message.get("run_id") == run.run_id
        if kind == "records" and mine:
            records = message["records"]
            if not isinstance(records, list):
                raise TypeError("records that are not a list")
            for record in records:
                self._keep(run, record)
        elif kind == "waiting" and mine and run.live:
            run.end(protocol.EXEC_WAITING_INPUT, None)
        elif kind == "done" and mine:
            status = message["status"]
            if status not in (protocol.EXEC_FINISHED, protocol.EXEC_TIMEOUT):
                raise ValueError(f"status {status!r}")
            code = message.get("exit_code")
            code = code if isinstance(code, int) and not isinstance(code, bool) else None
            if code is not None and not protocol.EXIT_CODE_MIN <= code <= protocol.EXIT_CODE_MAX:
                code = 1
            error = message.get("error")
            if not isinstance(error, str) or protocol.ERROR_NAME_RULE(error):
                error = None
            run.end(status, code if status == protocol.EXEC_FINISHED else None, error)
        elif kind == "completions":
            future = self.completions.pop(message["id"], None)
            matches = message["matches"]
            if future is not None and not future.done() and isinstance(matches, list):
                future.set_result([m for m in matches if isinstance(m, str)])
        elif kind == "ready" and self.state == "starting":
            self.state = "ready"
            self.known.set()
            if self.queued is not None:
                self._send(self.queued)
                self.queued = None
        elif kind == "unavailable":
            self._unavailable(str(message.get("reason")))
        elif kind == "log":
            log.info(
                "kernel %s code runner: %s", self.kernel_id, str(message.get("message"))[:2000]
            )

    def _keep(self, run: Run, record: Any) -> None:
        refusal = protocol.record_refusal(protocol.EXEC_RECORD, record)
        if refusal:
            self._warn(f"dropped a record from the code runner: {refusal}")
            return
        run.add(record)

    def _on_eof(self) -> None:
        if self.state == "starting":
            self._unavailable("it ended before it said hello")
            return
        self._stopped()
        _in_background(self.close())

    def _stopped(self) -> None:
        """The runner is gone: its live run ends (with a notice), completions get nothing."""
        self.state = "stopped"
        self.known.set()
        run = self.run
        if run is not None and run.status in (RUNNING, protocol.EXEC_WAITING_INPUT):
            run.add({"kind": "notice", "data": RUNNER_STOPPED, "mime": None})
            run.end(protocol.EXEC_FINISHED, 1)
        for future in self.completions.values():
            if not future.done():
                future.set_result([])
        self.completions.clear()

    # --- what the agent asks --------------------------------------------------------

    def begin(
        self, mode: str, run_id: str | None, code: str, options: dict[str, Any], limit: int
    ) -> Run:
        """A new run (the caller checked that none is going)."""
        run = self.run = Run(run_id or uuid.uuid4().hex[:16], limit)
        command = {"op": "run", "mode": mode, "run_id": run.run_id, "code": code}
        command.update(options=options, limit=limit)
        if self.state == "ready":
            self._send(command)
        elif self.state == "starting":
            self.queued = command
        else:
            self._unavailable("")
        return run

    def give_input(self, run: Run, line: str) -> None:
        run.status = RUNNING
        self._send({"op": "input", "data": line})

    def interrupt(self, run: Run) -> None:
        if run is self.run and self.queued is not None:
            self.queued = None  # never started: nothing to interrupt
            run.add({"kind": "error", "data": "KeyboardInterrupt\n", "mime": None})
            run.end(protocol.EXEC_FINISHED, 1, "KeyboardInterrupt")
        elif run.status == protocol.EXEC_WAITING_INPUT:
            # input() raises KeyboardInterrupt: the run goes on to its end, which the
            # answer to this interrupt waits for.
            run.status = RUNNING
            self._send({"op": "interrupt"})
        elif run.live:
            self._send({"op": "interrupt"})

    async def complete(self, code: str, cursor_pos: int) -> list[str]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.known.wait(), COMPLETE_TIMEOUT)
        if self.state != "ready":
            return []
        request_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.completions[request_id] = future
        self._send({"op": "complete", "id": request_id, "code": code, "cursor_pos": cursor_pos})
        try:
            return await asyncio.wait_for(future, COMPLETE_TIMEOUT)
        except TimeoutError:
            return []
        finally:
            self.completions.pop(request_id, None)

    async def close(self) -> None:
        if self.state != "unavailable":
            self._stopped()
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.close()


class Refused(Exception):
    """A request the agent will not carry out; the text is for the user."""


class Execution:
    """The agent's side of code execution: runners by kernel id, requests in, answers out."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.runners: dict[str, KernelRunner] = {}
        self.starting: dict[str, asyncio.Task[None]] = {}
        # Waits while the daemon's outbox is full (streams pace themselves on it).
        self.room: Callable[[], Awaitable[Any]] | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    def handle(self, msg: dict[str, Any]) -> None:
        """Serve one ``exec`` command in its own task (it may wait up to ``flush``)."""
        task = asyncio.get_running_loop().create_task(self.serve(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self, msg: dict[str, Any]) -> None:
        refusal = protocol.validate_command(msg)
        if refusal:
            log.warning("refusing an exec command: %s", refusal)
            self._refuse_bad(msg, refusal)
            return
        mode = msg["mode"]
        try:
            if _attaches(msg):
                self._going(msg["kernel_id"])  # a page that opens starts no runner
            runner = self._runner(msg["kernel_id"])
            if runner.state == "unavailable":
                self._answer_no_runner(msg)
            elif mode == "complete":
                await self._complete(msg, runner)
            else:
                run = self._act(msg, runner)
                await self._deliver(msg, run)
        except Refused as exc:
            self._result(msg, msg.get("run_id") or "", protocol.EXEC_FINISHED, reason=str(exc))
        except Exception:
            log.exception("exec %s on kernel %s failed", msg["req_id"], msg["kernel_id"])
            reason = "the agent could not carry out this request (see its log)"
            self._result(msg, msg.get("run_id") or "", protocol.EXEC_FINISHED, reason=reason)

    def _runner(self, kernel_id: str) -> KernelRunner:
        """The kernel's runner, started on first use (or after the last one stopped)."""
        from agent.backends.base import KernelError

        try:
            self.backend.running_kernel(kernel_id)
        except KernelError as exc:
            raise Refused(str(exc)) from None
        runner = self.runners.get(kernel_id)
        if runner is None or runner.state == "stopped":
            runner = self.runners[kernel_id] = KernelRunner(self.backend, kernel_id)
            task = asyncio.get_running_loop().create_task(runner.start())
            self.starting[kernel_id] = task
            task.add_done_callback(lambda _t: self.starting.pop(kernel_id, None))
        return runner

    def _going(self, kernel_id: str) -> Run:
        """The kernel's run that is going (running or waiting for input), else Refused."""
        runner = self.runners.get(kernel_id)
        run = runner.run if runner is not None else None
        if run is None or run.status not in (RUNNING, protocol.EXEC_WAITING_INPUT):
            raise Refused("no run is going in this session")
        return run

    def _act(self, msg: dict[str, Any], runner: KernelRunner) -> Run:
        """Start, continue, feed or interrupt a run; Refused in users' words."""
        mode, run_id, current = msg["mode"], msg.get("run_id"), runner.run
        if mode in ("query", "batch"):
            if current is not None and current.status in (RUNNING, protocol.EXEC_WAITING_INPUT):
                raise Refused(
                    f"another run ({current.run_id}) is still going in this session;"
                    " continue or interrupt it first"
                )
            options = msg.get("options") or {}
            limit = self.backend.config.exec_output_limit
            return runner.begin(mode, run_id, msg.get("code") or "", options, limit)
        if current is None or (run_id is not None and run_id != current.run_id):
            raise Refused(
                f"no run {run_id} in this session" if run_id else "no run in this session"
            )
        if mode == "input":
            if current.status != protocol.EXEC_WAITING_INPUT:
                raise Refused(f"run {current.run_id} is not waiting for input")
            runner.give_input(current, msg.get("code") or "")
        elif mode == "interrupt":
            runner.interrupt(current)
        return current

    async def _complete(self, msg: dict[str, Any], runner: KernelRunner) -> None:
        code = msg.get("code") or ""
        cursor = min(int((msg.get("options") or {}).get("cursor_pos", len(code))), len(code))
        busy = runner.run is not None and runner.run.status in (
            RUNNING,
            protocol.EXEC_WAITING_INPUT,
        )
        matches = [] if busy else await runner.complete(code, cursor)
        matches = [m[: protocol.EXEC_COMPLETION_MAX] for m in matches][
            : protocol.EXEC_COMPLETIONS_MAX
        ]
        self._result(msg, "", protocol.EXEC_FINISHED, completions=matches)

    async def _deliver(self, msg: dict[str, Any], run: Run) -> None:
        """Answer with the run's output: one result within ``flush``, or a stream."""
        if msg.get("stream"):
            await self._stream(msg, run)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(msg.get("flush") or protocol.EXEC_FLUSH_DEFAULT)
        if msg["mode"] == "continue":
            await run.wait(lambda: bool(run.pending) or not run.live, deadline)
        else:
            await run.wait(lambda: not run.live or _frame_full(run), deadline)
        records = run.take()
        status, exit_code = run.answer_status()
        error = run.answer_error()
        self._result(msg, run.run_id, status, exit_code=exit_code, records=records, error=error)

    async def _stream(self, msg: dict[str, Any], run: Run) -> None:
        """exec_records as records come, then one exec_result when the run stops or waits.
        A stream that attaches (``_attaches``: a page opened again) ends the streams of
        the run before it, with "continued": the run's output goes to the newest."""
        if _attaches(msg):
            run.attached += 1
            run.changed.set()
        attached = run.attached
        while True:
            await run.wait(
                lambda: bool(run.pending) or not run.live or run.attached != attached, None
            )
            if run.attached != attached:
                self._result(msg, run.run_id, protocol.EXEC_CONTINUED)
                return
            while run.pending and run.attached == attached:
                if self.room is not None:
                    await self.room()
                records = run.take()
                self.backend.emit(
                    {
                        "type": protocol.EXEC_RECORDS,
                        "req_id": msg["req_id"],
                        "run_id": run.run_id,
                        "records": records,
                    }
                )
            if run.attached != attached:
                continue  # answered "continued" above
            if not run.live:
                break
        status, exit_code = run.answer_status()
        self._result(msg, run.run_id, status, exit_code=exit_code, error=run.answer_error())

    # --- answers ----------------------------------------------------------------------

    def _result(
        self,
        msg: dict[str, Any],
        run_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        records: list[dict[str, Any]] | None = None,
        completions: list[str] | None = None,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        self.backend.emit(
            {
                "type": protocol.EXEC_RESULT,
                "req_id": msg["req_id"],
                "run_id": run_id,
                "status": status,
                "exit_code": exit_code,
                "records": records or [],
                "completions": completions,
                "reason": reason,
                "error": error,
            }
        )

    def _answer_no_runner(self, msg: dict[str, Any]) -> None:
        record = {"kind": "stderr", "data": NO_RUNNER, "mime": None}
        run_id = msg.get("run_id") or uuid.uuid4().hex[:16]
        completions = [] if msg["mode"] == "complete" else None
        self._result(
            msg,
            run_id,
            protocol.EXEC_FINISHED,
            exit_code=127,
            records=[record],
            completions=completions,
        )

    def _refuse_bad(self, msg: Any, refusal: str) -> None:
        """A command out of bounds: a result when its req_id can carry one, else an error."""
        fields = protocol.MANAGER_MESSAGES[protocol.EXEC]
        if isinstance(msg, dict) and fields["req_id"].rule(msg.get("req_id")) is None:
            answer = {"req_id": msg["req_id"]}
            self._result(answer, "", protocol.EXEC_FINISHED, reason=f"a bad request ({refusal})")
        else:
            self.backend.emit({"type": protocol.ERROR, "message": f"refused: {refusal}"})

    # --- the end of kernels -------------------------------------------------------------

    async def close_kernel(self, kernel_id: str) -> None:
        task = self.starting.pop(kernel_id, None)
        if task is not None:
            task.cancel()
        runner = self.runners.pop(kernel_id, None)
        if runner is not None:
            await runner.close()

    async def close_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for kernel_id in list(self.runners):
            await self.close_kernel(kernel_id)


def _attaches(msg: dict[str, Any]) -> bool:
    """A streamed continue that names no run: follow the run that is going, if one is."""
    return msg["mode"] == "continue" and msg.get("run_id") is None and bool(msg.get("stream"))


def _frame_full(run: Run) -> bool:
    return run.pending_size >= protocol.EXEC_FRAME_DATA
