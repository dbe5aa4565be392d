"""Browser websockets: live session status, kernel logs, the web terminal.

Every consumer checks login and ownership once, in ``connect()``, through the
one selector (``get_session_for_user``: admins may attach to any session, other
users' sessions are simply not found). A refusal accepts the socket first and
sends ``{"type": "error", "code", "message"}`` before closing with that code,
so the page can say why (a close during the handshake reaches the browser as a
bare 1006). Close codes:

- 4400 bad input: a malformed parameter, or a frame that is not a JSON object
  (too big, nested too deep, holding a lone surrogate, binary); the stream
  cannot trust what follows it. A well-formed message the stream does not
  understand is answered with an error and the stream stays open.
- 4401 not logged in
- 4404 no such session or kernel, or not yours (ids do not leak)
- 4409 the session is not running yet (the page retries)
- 4410 the session has ended
- 4429 too many terminals: the user already holds ``BAI_MAX_TERMINALS_PER_USER``
  (the message says the limit and how many are open; ``sessions_app.terminals``)

The terminal's hot path (input → agent, output → browser) touches no database:
the agent's group and the terminal id are fixed at connect time, and once the
agent gateway has answered, the consumer and the gateway address each other's
channels directly (no group, and no Redis when both are in one process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings

from agent import protocol
from backendai_web.serve import code_run_limit
from backendai_web.websockets import LoopDispatch, OpenSockets
from bai_common.jsonlimits import lone_surrogate, nesting_beyond

from . import execution, selectors, terminals
from .errors import Conflict, InvalidInput, NotFound
from .loop import db, touch_later
from .models import TERMINAL, AgentStatus, Kernel, RunMode, Session, Status

logger = logging.getLogger(__name__)

CLOSE_BAD_INPUT = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_NOT_READY = 4409
# Seconds a terminal waits for the agent's gateway to take its open before asking again.
TERM_OPEN_RETRY = 2.0
CLOSE_GONE = 4410
CLOSE_TOO_MANY = 4429

# Activity (idle timeout): a code run touches its session this often while it
# goes, and input (keystrokes, runs, answers) at most this often.
TOUCH_EVERY = 30.0
TOUCH_INPUT_THROTTLE = 5.0
MAX_TERM_SIZE = 1000
# A session that is ending has no shell to offer any more.
ENDING = TERMINAL | {Status.TERMINATING}
# Browser frames: every message is a flat JSON object; a stream that only
# takes pings reads small ones.
MAX_FRAME_DEPTH = 4
MAX_CONTROL_FRAME = 4096


def _user(scope: dict[str, Any]) -> Any:
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return None
    return user


class _Refusing:
    """Accept, explain, close: the browser sees both the code and the reason."""

    async def refuse(self, code: int, message: str) -> None:
        if not getattr(self, "_accepted", False):
            await self.accept()  # type: ignore[attr-defined]
        await self.send(text_data=json.dumps({"type": "error", "code": code, "message": message}))  # type: ignore[attr-defined]
        await self.close(code=code)  # type: ignore[attr-defined]

    async def accept(self, subprotocol: str | None = None) -> None:
        self._accepted = True
        await super().accept(subprotocol)  # type: ignore[misc]


class BadFrame(Exception):
    """A frame that is not a message: the socket closes with 4400 and this reason."""


def _parse(text_data: str | None, max_chars: int = MAX_CONTROL_FRAME) -> dict[str, Any]:
    """A browser frame as a message, at bounded cost, or BadFrame saying why."""
    if text_data is None:
        raise BadFrame("send JSON text frames, not binary ones")
    if len(text_data) > max_chars:
        raise BadFrame(f"a frame of {len(text_data)} characters; the limit is {max_chars}")
    if nesting_beyond(text_data, MAX_FRAME_DEPTH) is not None:
        raise BadFrame(f"a message nested deeper than {MAX_FRAME_DEPTH} levels")
    try:
        message = json.loads(text_data)
    except ValueError as exc:
        raise BadFrame(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise BadFrame("a message must be a JSON object")
    if lone_surrogate(message):
        raise BadFrame("a message must be valid Unicode (it holds a lone surrogate)")
    return message


def _ping_answer(text_data: str | None) -> dict[str, Any]:
    """The answer to a frame of a stream that asks nothing of the browser: keep-alive
    pings are answered, anything else is told so (BadFrame when unreadable)."""
    if _parse(text_data).get("type") == "ping":
        return {"type": "pong"}
    return {"type": "error", "message": "only ping is understood here"}


class SessionsConsumer(LoopDispatch, OpenSockets, _Refusing, AsyncJsonWebsocketConsumer):
    """Pushes ``{"type": "sessions.changed", "sessions": [{id, kernel, status, reason}]}``
    for the user's own sessions (``live.session_changed``)."""

    socket_kind = "sessions"

    group: str | None = None

    async def connect(self) -> None:
        user = _user(self.scope)
        if user is None:
            await self.refuse(CLOSE_UNAUTHENTICATED, "Log in to follow your sessions.")
            return
        self.group = protocol.user_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            answer = _ping_answer(text_data)
        except BadFrame as exc:
            await self.refuse(CLOSE_BAD_INPUT, str(exc))
            return
        await self.send_json(answer)

    async def sessions_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "sessions.changed", "sessions": event["sessions"]})


# --- shared checks ---------------------------------------------------------


def _load_session(user: Any, session_id: str) -> Session:
    return selectors.get_session_for_user(user=user, session_id=session_id)


def _load_kernel(user: Any, session_id: str, kernel_ref: str) -> Kernel:
    kernel = selectors.get_kernel_for_user(user=user, session_id=session_id, kernel_ref=kernel_ref)
    kernel.session  # noqa: B018 - load it here, not on the event loop
    return kernel


class _Toucher:
    """Counts what the owner does through a stream as activity on its session (idle
    timeout): terminal keystrokes, code runs and their input (docs/sessions.md, "Time limits").
    An open stream alone is not activity, as an open page is not."""

    session_id: str | None = None
    _busy_task: asyncio.Task[None] | None = None
    _last_touch: float = -TOUCH_INPUT_THROTTLE
    _touch_owner: bool = False

    def touch_for(self, *, session_id: str, owner_acts: bool) -> None:
        # An admin looking in is not the owner's activity.
        self._touch_owner = owner_acts
        self.session_id = session_id

    def touch_soon(self) -> asyncio.Future[bool] | None:
        """On input: at most once per TOUCH_INPUT_THROTTLE, off the hot path. The
        future (None: not touched now) is done once the activity is written."""
        if self._touch_owner and time.monotonic() - self._last_touch >= TOUCH_INPUT_THROTTLE:
            self._last_touch = time.monotonic()
            return touch_later(self.session_id)  # type: ignore[arg-type]
        return None

    def touch_while(self, busy: bool) -> None:
        """While ``busy`` (a code run goes), touch every TOUCH_EVERY: a run is activity
        from its start to its end, as a busy kernel is in Jupyter."""
        if busy and self._touch_owner and self._busy_task is None:
            self._busy_task = asyncio.create_task(self._touch_loop())
        elif not busy:
            self.stop_touching()

    async def _touch_loop(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_EVERY)
            self._last_touch = time.monotonic()
            touch_later(self.session_id)  # type: ignore[arg-type]

    def stop_touching(self) -> None:
        if self._busy_task is not None:
            self._busy_task.cancel()
            self._busy_task = None


# --- logs ------------------------------------------------------------------


class KernelLogsConsumer(LoopDispatch, OpenSockets, _Refusing, AsyncWebsocketConsumer):
    """``/ws/sessions/<session_id>/kernels/<hostname-or-id>/logs/``.

    To the browser: ``{"type": "state", "live": bool, "kernel", "status", "message"}``
    first; then ``{"type": "chunk", "data"}`` as the container writes; for an ended
    kernel (or one without a live agent) the kept tail as one chunk and then
    ``{"type": "ended", "status", "reason"}``. The browser sends nothing but pings.
    """

    socket_kind = "logs"

    stream_id: str | None = None
    agent_group: str | None = None
    owner_group: str | None = None
    kernel_hostname: str = ""

    async def connect(self) -> None:
        user = _user(self.scope)
        if user is None:
            await self.refuse(CLOSE_UNAUTHENTICATED, "Log in to read logs.")
            return
        kwargs = self.scope["url_route"]["kwargs"]
        try:
            kernel = await db(_load_kernel)(user, kwargs["session_id"], kwargs["kernel_ref"])
        except NotFound as exc:
            await self.refuse(CLOSE_NOT_FOUND, exc.message)
            return
        session = kernel.session
        self.session_id = str(session.pk)
        self.kernel_hostname = kernel.cluster_hostname
        agent_alive = (
            kernel.agent_id is not None
            and await db(lambda: kernel.agent.status == AgentStatus.ALIVE)()
        )
        await self.accept()
        if kernel.status in TERMINAL or not agent_alive or kernel.status == Status.PENDING:
            await self._send_kept(kernel)
            await self.close()
            return
        self.stream_id = uuid.uuid4().hex
        self.agent_group = protocol.agent_group(kernel.agent_id)
        self.kernel_id = str(kernel.pk)
        await self.channel_layer.group_add(
            protocol.log_stream_group(self.stream_id), self.channel_name
        )
        # The owner's status pushes tell this stream when its kernel ends.
        self.owner_group = protocol.user_group(session.owner_id)
        await self.channel_layer.group_add(self.owner_group, self.channel_name)
        await self._send_json(
            {
                "type": "state",
                "live": True,
                "kernel": kernel.cluster_hostname,
                "status": kernel.status,
                "message": f"following {kernel.cluster_hostname} live",
            }
        )
        await self.channel_layer.group_send(
            self.agent_group,
            protocol.gw_agent_command(
                {
                    "type": protocol.LOGS_FOLLOW,
                    "kernel_id": self.kernel_id,
                    "stream_id": self.stream_id,
                    "tail": settings.BAI_LOG_TAIL_BYTES,
                }
            ),
        )
        logger.info("logs of kernel %s followed by user %s", kernel.pk, user.pk)

    async def _send_kept(self, kernel: Kernel) -> None:
        if kernel.status == Status.PENDING or kernel.agent_id is None and not kernel.is_terminal:
            message = f"{kernel.cluster_hostname} has not started yet ({kernel.status})"
        elif kernel.is_terminal:
            message = f"{kernel.cluster_hostname} has ended; this is the kept tail of its log"
        else:
            message = (
                f"the agent of {kernel.cluster_hostname} is not connected; this is the kept tail"
            )
        await self._send_json(
            {
                "type": "state",
                "live": False,
                "kernel": kernel.cluster_hostname,
                "status": kernel.status,
                "message": message,
            }
        )
        if kernel.log_tail:
            await self._send_json({"type": "chunk", "data": kernel.log_tail})
        await self._send_json(
            {"type": "ended", "status": kernel.status, "reason": kernel.status_reason or message}
        )

    async def disconnect(self, code: int) -> None:
        if self.stream_id is not None:
            await self.channel_layer.group_send(
                self.agent_group,
                protocol.gw_agent_command(
                    {"type": protocol.LOGS_STOP, "stream_id": self.stream_id}
                ),
            )
            await self.channel_layer.group_discard(
                protocol.log_stream_group(self.stream_id), self.channel_name
            )
            self.stream_id = None
        if self.owner_group is not None:
            await self.channel_layer.group_discard(self.owner_group, self.channel_name)
            self.owner_group = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            answer = _ping_answer(text_data)
        except BadFrame as exc:
            await self.refuse(CLOSE_BAD_INPUT, str(exc))
            return
        await self._send_json(answer)

    async def _send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content))

    async def logs_chunk(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"type": "chunk", "data": event.get("data", "")}))

    async def sessions_changed(self, event: dict[str, Any]) -> None:
        for item in event.get("sessions") or []:
            if (
                item.get("id") == self.session_id
                and item.get("kernel") == self.kernel_hostname
                and item.get("status") in TERMINAL
            ):
                await self._send_json(
                    {"type": "ended", "status": item["status"], "reason": item.get("reason", "")}
                )


# --- terminal --------------------------------------------------------------


def _term_size(message: dict[str, Any]) -> tuple[int, int] | None:
    cols, rows = message.get("cols"), message.get("rows")
    for value in (cols, rows):
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        if not 1 <= value <= MAX_TERM_SIZE:
            return None
    return cols, rows  # type: ignore[return-value]


def _query(scope: dict[str, Any]) -> dict[str, str]:
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    return dict(parse_qsl(raw, keep_blank_values=True))


class TerminalConsumer(LoopDispatch, OpenSockets, _Refusing, _Toucher, AsyncWebsocketConsumer):
    """``/ws/sessions/<session_id>/terminal/?term=<uuid>&cols=80&rows=24``: a shell in main1.

    ``term`` is the browser tab's stable id (kept in its sessionStorage): the
    same id re-attaches to the same shell, which the agent keeps for a grace
    period after a disconnect (``term_detach``).

    Each user holds at most ``BAI_MAX_TERMINALS_PER_USER`` terminals, across
    sessions and processes, a detached shell included until its grace period
    ends (``sessions_app.terminals``); one more is refused with 4429.

    Browser → server: ``{"type": "input", "data"}``, ``{"type": "resize", "cols", "rows"}``,
    ``{"type": "close"}`` (end the shell), ``{"type": "ping"}``.
    Server → browser: ``{"type": "ready", "term"}``, ``{"type": "output", "data"}``,
    ``{"type": "closed", "reason"}``, ``{"type": "error", "message"}``.
    """

    socket_kind = "terminal"

    term_id: str | None = None
    agent_group: str | None = None
    closed_by_agent = False
    # The agent gateway's own channel, once it has answered: commands then go
    # there directly (in one daphne process, without a Redis round trip).
    gateway_channel: str | None = None
    _via_group = 0  # commands sent through the agent's group so far
    # Whose place (sessions_app.terminals) this terminal holds, and its renewal.
    place_holder: Any = None
    _renew_task: asyncio.Task[None] | None = None
    _open_task: asyncio.Task[None] | None = None
    _routed: asyncio.Event

    async def connect(self) -> None:
        user = _user(self.scope)
        if user is None:
            await self.refuse(CLOSE_UNAUTHENTICATED, "Log in to open a terminal.")
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        query = _query(self.scope)
        try:
            tab = uuid.UUID(query["term"]) if query.get("term") else uuid.uuid4()
        except ValueError:
            await self.refuse(CLOSE_BAD_INPUT, "term must be a UUID.")
            return
        size = _term_size(
            {
                "cols": _int_or_none(query.get("cols", "80")),
                "rows": _int_or_none(query.get("rows", "24")),
            }
        )
        if size is None:
            await self.refuse(CLOSE_BAD_INPUT, f"cols and rows must be 1..{MAX_TERM_SIZE}.")
            return
        try:
            session, main = await db(selectors.get_session_main_for_user)(
                user=user, session_id=session_id
            )
        except NotFound as exc:
            await self.refuse(CLOSE_NOT_FOUND, exc.message)
            return
        if session.status in ENDING:
            await self.refuse(
                CLOSE_GONE,
                f"The session has ended ({session.status}: {session.status_reason}).",
            )
            return
        if session.status != Status.RUNNING or main.agent_id is None:
            await self.refuse(
                CLOSE_NOT_READY, f"The session is not running yet ({session.status})."
            )
            return
        term_id = f"{session.pk.hex}-{tab.hex}"
        taken, held = await terminals.claim(user_id=user.pk, term_id=term_id)
        if not taken:
            limit = settings.BAI_MAX_TERMINALS_PER_USER
            logger.info("terminal refused to user %s: %d of %d open", user.pk, held, limit)
            await self.refuse(CLOSE_TOO_MANY, terminals.refusal(limit=limit, held=held))
            return
        self.place_holder = user.pk
        self._renew_task = asyncio.create_task(self._renew_place(term_id))
        self.max_input = settings.BAI_TERMINAL_MAX_INPUT
        self.term_id = term_id
        self.agent_group = protocol.agent_group(main.agent_id)
        self.output_group = protocol.terminal_group(self.term_id)
        self.session_id = str(session.pk)
        # Join before opening: not a byte of the prompt may be missed.
        await self.channel_layer.group_add(self.output_group, self.channel_name)
        # The owner's status pushes say when the session ends under the shell.
        self.owner_group = protocol.user_group(session.owner_id)
        await self.channel_layer.group_add(self.owner_group, self.channel_name)
        await self.accept()
        self._routed = asyncio.Event()
        self._open_task = asyncio.create_task(
            self._open(
                {
                    "type": protocol.TERM_OPEN,
                    "term_id": self.term_id,
                    "kernel_id": str(main.pk),
                    "cols": size[0],
                    "rows": size[1],
                },
                str(tab),
            )
        )
        self.touch_for(session_id=str(session.pk), owner_acts=session.owner_id == user.pk)
        logger.info(
            "terminal %s opened on session %s by user %s", self.term_id, session.pk, user.pk
        )

    async def _open(self, command: dict[str, Any], tab: str) -> None:
        """Open (or re-attach to) the shell, and say "ready" once the agent's gateway
        has taken the command. A command sent to the agent's group while the agent
        reconnects (its daphne died, or the balancer moved it) reaches no one: ask
        again until a gateway answers, so a page never types into a shell nobody opened."""
        while True:
            await self._agent(command)
            try:
                await asyncio.wait_for(self._routed.wait(), TERM_OPEN_RETRY)
                break
            except TimeoutError:
                logger.info("terminal %s: no gateway took the open yet; again", self.term_id)
        await self.send(text_data=json.dumps({"type": "ready", "term": tab}))

    async def _renew_place(self, term_id: str) -> None:
        while True:
            await asyncio.sleep(terminals.RENEW_EVERY)
            await terminals.renew(user_id=self.place_holder, term_id=term_id)

    async def _agent(self, command: dict[str, Any]) -> None:
        """Send a command to the agent, through its gateway.

        ``reply`` tells the gateway where this terminal's output goes. Until the
        gateway has answered with its own channel (``term.route``) for every
        command sent so far, commands go through the agent's group; after that,
        straight to the gateway's channel. Waiting for the answer to the last
        one keeps keystrokes in order across the switch.
        """
        if self.gateway_channel is not None:
            event = protocol.gw_agent_command(command, reply=self.channel_name)
            await self.channel_layer.send(self.gateway_channel, event)
        else:
            self._via_group += 1
            event = protocol.gw_agent_command(command, reply=self.channel_name, ack=self._via_group)
            await self.channel_layer.group_send(self.agent_group, event)

    async def term_route(self, event: dict[str, Any]) -> None:
        gateway = event.get("gateway")
        if gateway is None:
            # That gateway went away (the agent reconnects): back to the group.
            if event.get("from") == self.gateway_channel:
                self.gateway_channel = None
        elif event.get("ack") == self._via_group:
            self.gateway_channel = gateway
            self._routed.set()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.term_id is None:
            return
        try:
            # Input of max_input bytes may take six characters a byte as JSON escapes.
            message = _parse(text_data, 6 * self.max_input + MAX_CONTROL_FRAME)
        except BadFrame as exc:
            await self.refuse(CLOSE_BAD_INPUT, str(exc))
            return
        kind = message.get("type")
        if kind == "input":
            data = message.get("data")
            if not isinstance(data, str):
                await self._error("input: data must be a string")
            elif len(data) > self.max_input or len(data.encode("utf-8")) > self.max_input:
                await self._error(
                    f"input: {len(data.encode('utf-8'))} bytes in one message; "
                    f"the limit is {self.max_input} bytes"
                )
            else:
                await self._agent(
                    {"type": protocol.TERM_INPUT, "term_id": self.term_id, "data": data}
                )
                self.touch_soon()
        elif kind == "resize":
            size = _term_size(message)
            if size is None:
                await self._error(f"resize: cols and rows must be whole numbers 1..{MAX_TERM_SIZE}")
            else:
                await self._agent(
                    {
                        "type": protocol.TERM_RESIZE,
                        "term_id": self.term_id,
                        "cols": size[0],
                        "rows": size[1],
                    }
                )
        elif kind == "close":
            await self._agent({"type": protocol.TERM_CLOSE, "term_id": self.term_id})
        elif kind == "ping":
            await self.send(text_data='{"type":"pong"}')
        else:
            await self._error("unknown message; send input, resize, close or ping")

    async def _error(self, message: str) -> None:
        await self.send(text_data=json.dumps({"type": "error", "message": message}))

    async def disconnect(self, code: int) -> None:
        self.stop_touching()
        if self._renew_task is not None:
            self._renew_task.cancel()
            self._renew_task = None
        if self._open_task is not None:
            self._open_task.cancel()
            self._open_task = None
        if self.term_id is None:
            return
        if not self.closed_by_agent:
            # The agent keeps the shell for a grace period: a reconnect with
            # the same term id re-attaches to it. Its place is held as long.
            await self._agent({"type": protocol.TERM_DETACH, "term_id": self.term_id})
            await terminals.detach(user_id=self.place_holder, term_id=self.term_id)
        else:
            await terminals.release(user_id=self.place_holder, term_id=self.term_id)
        await self.channel_layer.group_discard(self.output_group, self.channel_name)
        await self.channel_layer.group_discard(self.owner_group, self.channel_name)
        self.term_id = None

    async def term_output(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"type": "output", "data": event["data"]}))

    async def term_closed(self, event: dict[str, Any]) -> None:
        self.closed_by_agent = True
        if self.term_id is not None:
            # The shell is gone: its place is free now, not when the socket goes.
            await terminals.release(user_id=self.place_holder, term_id=self.term_id)
        await self.send(
            text_data=json.dumps({"type": "closed", "reason": event.get("reason") or "ended"})
        )
        await self.close(code=1000)

    async def sessions_changed(self, event: dict[str, Any]) -> None:
        ended = _session_ended(event, self.session_id)
        if ended is not None:
            self.closed_by_agent = True
            if self.term_id is not None:
                await terminals.release(user_id=self.place_holder, term_id=self.term_id)
            await self.refuse(CLOSE_GONE, ended)


def _session_ended(event: dict[str, Any], session_id: str | None) -> str | None:
    """What to tell a stream of ``session_id`` when a status push says it is ending."""
    for item in event.get("sessions") or []:
        if item.get("id") == session_id and not item.get("kernel") and item.get("status") in ENDING:
            return f"The session has ended ({item['status']}: {item.get('reason', '')})."
    return None


# --- code execution ---------------------------------------------------------------

# Requests of one socket waiting for their answers at once.
MAX_PENDING_RUNS = 16
# Seconds a code stream gathers its history's writes before it writes them.
HISTORY_GATHER = 0.05
# What each browser message may hold besides its type.
EXEC_MESSAGES = {
    "run": ("mode", "code", "options", "run_id"),
    "input": ("run_id", "code"),
    "interrupt": ("run_id",),
    "complete": ("code", "cursor_pos"),
}


def _exec_body(message: dict[str, Any]) -> dict[str, Any]:
    """The request body (``execution.exec_request``) a browser message asks for,
    or InvalidInput saying why it asks for none."""
    kind = message.get("type")
    fields = EXEC_MESSAGES.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise InvalidInput("unknown message; send run, input, interrupt, complete, attach or ping")
    unknown = sorted(str(key) for key in message if key != "type" and key not in fields)
    if unknown:
        raise InvalidInput(f"{kind}: unknown field {', '.join(unknown)}")
    body = {key: message[key] for key in fields if key in message}
    if kind == "run":
        if body.get("mode") not in RunMode.values:
            raise InvalidInput("run: mode must be query or batch")
        return body
    if "cursor_pos" in body:
        body["options"] = {"cursor_pos": body.pop("cursor_pos")}
    return {**body, "mode": kind}


class ExecuteConsumer(LoopDispatch, OpenSockets, _Refusing, _Toucher, AsyncWebsocketConsumer):
    """``/ws/sessions/<session_id>/execute/``: code runs in main1, its output streamed.

    The same requests, checks and history as the REST endpoint
    (``sessions_app.execution``), asked with ``stream: true``.

    Browser → server: ``{"type": "run", "mode": "query"|"batch", "code", "options"?,
    "run_id"?}``, ``{"type": "input", "run_id", "code"}``, ``{"type": "interrupt",
    "run_id"?}``, ``{"type": "complete", "code", "cursor_pos"}``, ``{"type": "attach"}``,
    ``{"type": "ping"}``.
    Server → browser: ``{"type": "records", "run_id", "records"}`` as they come, then
    ``{"type": "result", "run_id", "status", "exit_code", "error"?, "completions"?}``
    (after a ``waiting-input`` result, more comes once ``input`` is sent; a
    ``continued`` one: another page follows the run now), or ``{"type": "error",
    "message"}`` for a request refused (the stream stays open); once the history
    has these runs' rows as they stand, ``{"type": "history", "run_ids"}``; once the
    owner's activity is written, ``{"type": "activity"}``. ``{"type": "attach"}``
    follows the run that is going, if one is (a page reloaded during ``input()``):
    ``{"type": "pending", "run_id"}``, then that run's records and result; nothing
    when none is.
    """

    socket_kind = "execute"

    target: execution.ExecTarget | None = None
    owner_group: str | None = None
    history: asyncio.Task[None] | None = None
    closed = False

    async def connect(self) -> None:
        user = _user(self.scope)
        if user is None:
            await self.refuse(CLOSE_UNAUTHENTICATED, "Log in to run code.")
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        try:
            target = await db(execution.exec_target)(user=user, session_id=session_id)
        except NotFound as exc:
            await self.refuse(CLOSE_NOT_FOUND, exc.message)
            return
        except Conflict as exc:
            ended = exc.extra.get("status") in ENDING
            await self.refuse(CLOSE_GONE if ended else CLOSE_NOT_READY, exc.message)
            return
        self.user_id = user.pk
        self.pending: dict[str, execution.Sent] = {}  # by request id
        self.history: asyncio.Task[None] | None = None
        self.writes: list[execution.HistoryWrite] = []
        self.max_frame = code_run_limit()
        # The owner's status pushes say when the session ends under the runs.
        self.owner_group = protocol.user_group(target.owner_id)
        await self.channel_layer.group_add(self.owner_group, self.channel_name)
        await self.accept()
        self.target = target
        self.touch_for(session_id=target.session_id, owner_acts=target.owner_acts)
        logger.info("code runs of session %s opened by user %s", target.session_id, user.pk)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.target is None:
            return
        try:
            message = _parse(text_data, self.max_frame)
        except BadFrame as exc:
            await self.refuse(CLOSE_BAD_INPUT, str(exc))
            return
        if message.get("type") == "ping":
            await self.send(text_data='{"type":"pong"}')
            return
        if len(self.pending) >= MAX_PENDING_RUNS:
            await self._error(f"{len(self.pending)} requests wait for answers; wait for one first")
            return
        if message.get("type") == "attach":
            # A page opened again (reloaded while its run waited in input(), say)
            # follows the run that is going; opening a page is not activity.
            await self._ask(execution.ATTACH, attach=True)
            return
        try:
            request = execution.exec_request(
                _exec_body(message), max_code=settings.BAI_EXEC_MAX_CODE
            )
        except InvalidInput as exc:
            await self._error(exc.message)
            return
        written = self.touch_soon()
        if written is not None:
            written.add_done_callback(self._activity_written)
        await self._ask(request)

    async def _ask(self, request: execution.ExecRequest, *, attach: bool = False) -> None:
        target = self.target
        if target is None:
            return
        command = execution.exec_command(target=target, request=request, stream=True)
        self.pending[command["req_id"]] = execution.Sent(request, attach=attach)
        self.touch_while(True)
        await execution.send_to_agent(target, command, reply=self.channel_name)

    def _activity_written(self, written: asyncio.Future[bool]) -> None:
        """The page shows the session's last activity and idle deadline: tell it they moved."""
        if not self.closed and not written.cancelled() and written.result():
            self.activity_told = asyncio.create_task(self._tell_activity())

    async def _tell_activity(self) -> None:
        with contextlib.suppress(Exception):  # it may close meanwhile
            await self.send(text_data='{"type":"activity"}')

    async def exec_records(self, event: dict[str, Any]) -> None:
        sent = self.pending.get(event["req_id"])
        if sent is not None:
            await self._announce(sent, event)
            await self._records(event)
            self._record(sent, event)

    async def _announce(self, sent: execution.Sent, event: dict[str, Any]) -> None:
        """Before the first answer of an attach: the run this page now follows."""
        if sent.attach:
            sent.attach = False
            pending = {"type": "pending", "run_id": event["run_id"]}
            await self.send(text_data=json.dumps(pending))

    async def exec_result(self, event: dict[str, Any]) -> None:
        sent = self.pending.pop(event["req_id"], None)
        if sent is None:
            return
        self.touch_while(bool(self.pending))
        if event.get("reason") is not None:
            if not sent.attach:  # an attach refused: no run is going, nothing to show
                await self._error(event["reason"])
        else:
            await self._announce(sent, event)
            if event["records"]:
                await self._records(event)
            result = {"type": "result", **execution.answer_fields(event)}
            await self.send(text_data=json.dumps(result))
        self._record(sent, event)

    async def exec_lost(self, event: dict[str, Any]) -> None:
        sent = self.pending.pop(event["req_id"], None)
        self.touch_while(bool(self.pending))
        if sent is not None:
            await self._error(event["reason"])
            self._record(sent, None)

    def _record(self, sent: execution.Sent, answer: dict[str, Any] | None) -> None:
        """Write what an answer changes in the history after what came before,
        off the stream's path (the next request need not wait for it), gathered
        for ``HISTORY_GATHER`` seconds: a quick run is one write of the run as
        it ended."""
        change = sent.history_change(answer)
        if change is None:
            return
        self.writes.append((sent, answer, change))
        if self.history is None or self.history.done():
            self.history = asyncio.create_task(self._write_history())

    async def _write_history(self) -> None:
        target, user_id = self.target, self.user_id
        await asyncio.sleep(HISTORY_GATHER)
        while self.writes:
            writes, self.writes = self.writes, []
            await db(execution.write_history)(target=target, user_id=user_id, writes=writes)
            run_ids = sorted({sent.request.run_id for sent, _, _ in writes if sent.request.run_id})
            if not self.closed:  # the page reloads its history
                with contextlib.suppress(Exception):  # it may close meanwhile
                    await self.send(text_data=json.dumps({"type": "history", "run_ids": run_ids}))

    async def _records(self, event: dict[str, Any]) -> None:
        await self.send(
            text_data=json.dumps(
                {"type": "records", "run_id": event["run_id"], "records": event["records"]}
            )
        )

    async def _error(self, message: str) -> None:
        await self.send(text_data=json.dumps({"type": "error", "message": message}))

    async def sessions_changed(self, event: dict[str, Any]) -> None:
        ended = _session_ended(event, self.session_id)
        if ended is not None:
            await self.refuse(CLOSE_GONE, ended)

    async def disconnect(self, code: int) -> None:
        self.closed = True
        self.stop_touching()
        if self.owner_group is not None:
            await self.channel_layer.group_discard(self.owner_group, self.channel_name)
            self.owner_group = None
        if self.history is not None:  # the history is written before the stream is done
            await asyncio.wait([self.history])


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
