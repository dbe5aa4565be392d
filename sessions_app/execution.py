"""Code execution in a session's main1 (the wire: ``agent/protocol.py``, EXEC).

A request is checked here (its shape by ``specs.EXECUTE_SCHEMA``, its meaning
per mode), authorised like every session endpoint (its owner or an admin; for
anyone else there is no such session), refused for a batch session or one that
is not RUNNING, and sent to main1's agent through the agent's gateway, which
passes the agent's answers on to the channel that asked, and only to it.

A query or batch run is recorded (``ExecutionRun``) under a run id of the
manager's choosing when the user gave none, from the time it was sent: at its
first answer (or, when none came, as a run that may be going), and closed when
an answer says it finished or timed out; a run the agent refused to start
leaves no row. Neither the code nor its output is kept.

``execute`` (REST) runs in the request's thread: it checks, gives its
database connection back, asks with ``stream: false`` and waits, on the event
loop, for the one ``exec_result`` (``BAI_EXEC_FLUSH`` seconds and
``ANSWER_GRACE`` more at most, on the one reply channel the process keeps for
these requests), and answers. The row of a run that this answer ended is
written in the same thread right after the answer is out
(``handler.after_response``), so it costs the caller no wait; the row of a run
still going (or never answered) is written before the answer, so the answer
that ends it finds it. The websocket (``consumers.ExecuteConsumer``) asks with
``stream: true``, relays records as they come and records runs off the
stream's path. Neither holds a database connection while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connections
from django.utils import timezone
from knox.models import AuthToken

from agent import protocol
from backendai_web.handler import after_response

from . import selectors
from .errors import AgentTimeout, Conflict, InvalidInput
from .loop import touch_later
from .models import TERMINAL, ExecutionRun, RunMode, RunStatus, SessionType, Status
from .specs import EXECUTE_SCHEMA, spec_errors

logger = logging.getLogger(__name__)

# Seconds a request waits for the agent beyond the flush it asked for.
ANSWER_GRACE = 10.0
STARTS_RUN = frozenset(RunMode.values)
ENDS_RUN = frozenset({protocol.EXEC_FINISHED, protocol.EXEC_TIMEOUT})
# Per mode: what it needs and what it takes.
NEEDS_RUN_ID = {"continue": "to continue a run", "input": "to give a run its input"}
TAKES_NO_CODE = ("continue", "interrupt")
OPTION_MODES = {
    "build": ("batch",),
    "exec": ("batch",),
    "timeout": ("query", "batch"),
    "cursor_pos": ("complete",),
}
BATCH_SESSION = "this is a batch session; code runs in interactive sessions only"


@dataclass(frozen=True)
class ExecRequest:
    """A checked request: what main1's agent is asked."""

    mode: str
    code: str = ""
    run_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def starts_run(self) -> bool:
        return self.mode in STARTS_RUN


@dataclass(frozen=True)
class ExecTarget:
    """Where a session's code runs, and whether asking counts as its owner's activity."""

    session_id: str
    kernel_id: str
    agent_id: str
    owner_id: int
    owner_acts: bool


# What a console's socket asks when it opens: follow the run that is going (running
# or waiting for input), which an earlier page started; the agent refuses it when none is.
ATTACH = ExecRequest(mode="continue")

# --- checks ------------------------------------------------------------------


def exec_request(body: Any, *, max_code: int) -> ExecRequest:
    """The request a body asks for, or InvalidInput naming every bad field."""
    if not isinstance(body, dict):
        raise InvalidInput("The body must be a JSON object.")
    shape = spec_errors(body, EXECUTE_SCHEMA)
    if shape:
        raise _invalid(shape)
    request = ExecRequest(
        mode=body["mode"],
        code=body.get("code") or "",
        run_id=body.get("run_id"),
        options=dict(body.get("options") or {}),
    )
    meaning = _meaning_errors(request, max_code)
    if meaning:
        raise _invalid(meaning)
    if request.mode == "complete":
        cursor = request.options.get("cursor_pos", len(request.code))
        return replace(request, run_id=None, options={"cursor_pos": cursor})
    if request.starts_run and request.run_id is None:
        return replace(request, run_id=secrets.token_hex(8))
    return request


def _meaning_errors(request: ExecRequest, max_code: int) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    mode = request.mode
    size = len(request.code.encode("utf-8"))
    if size > max_code:
        errors["code"] = [f"{size} bytes of utf-8; the limit is {max_code} bytes"]
    elif request.code and mode in TAKES_NO_CODE:
        errors["code"] = [f"{mode} takes no code"]
    elif mode in STARTS_RUN and "\x00" in request.code:
        errors["code"] = [_nul_refusal(request.code, "Python source and shell commands")]
    for name in ("build", "exec"):
        command = request.options.get(name)
        if isinstance(command, str) and "\x00" in command:
            errors[f"options.{name}"] = [_nul_refusal(command, "shell commands")]
    if request.run_id is None and mode in NEEDS_RUN_ID:
        errors["run_id"] = [f"is required {NEEDS_RUN_ID[mode]}"]
    for name in request.options:
        if mode not in OPTION_MODES[name]:
            errors[f"options.{name}"] = [f"only {' and '.join(OPTION_MODES[name])} take it"]
    if mode == "batch" and not request.options.get("exec"):
        errors["options.exec"] = ["a batch run needs the command to run"]
    cursor = request.options.get("cursor_pos")
    if mode == "complete" and cursor is not None and cursor > len(request.code):
        errors["options.cursor_pos"] = [
            f"{cursor} is past the end of the code ({len(request.code)} characters)"
        ]
    return errors


def _nul_refusal(text: str, what: str) -> str:
    line = text.count("\n", 0, text.index("\x00")) + 1
    return f"holds a NUL character (line {line}), which {what} cannot hold; write it as \\0"


def _invalid(errors: dict[str, list[str]]) -> InvalidInput:
    name, messages = next(iter(errors.items()))
    return InvalidInput(f"{name}: {messages[0]}", errors)


@dataclass(frozen=True)
class ReadFacts:
    """main1's facts, already read with the request's token
    (``selectors.token_candidates_with_main_facts``); None: no such session."""

    facts: dict[str, Any] | None


class MainFactsReader:
    """The candidates of ``tokens.ExpiringTokenAuthentication`` for a REST run: a
    token key's tokens, with session ``session_id``'s main1 facts read in the same
    query and kept as ``read`` (who may see them is decided after, by the user).
    A REST run reads its token and its session in one round trip; ``read`` stays
    None when no token was looked up (e.g. a browser's session cookie)."""

    def __init__(self, session_id: object) -> None:
        self.session_id = session_id
        self.read: ReadFacts | None = None

    def __call__(self, token_key: str) -> list[AuthToken]:
        found = selectors.token_candidates_with_main_facts(token_key, self.session_id)
        if found:  # every row carries the same session's facts
            self.read = ReadFacts(found[0][1])
        return [token for token, _ in found]


def exec_target(
    *, user: AbstractBaseUser, session_id: object, read: ReadFacts | None = None
) -> ExecTarget:
    """main1 of a session the user may run code in: NotFound for anyone but its
    owner or an admin, Conflict (with ``extra.status``) for a batch session or
    one that is not RUNNING. ``read``: the facts, when they were read already."""
    if read is None:
        facts = selectors.session_main_facts_for_user(user=user, session_id=session_id)
    else:
        facts = selectors.visible_main_facts(user=user, facts=read.facts)
    if facts["session_type"] == SessionType.BATCH:
        raise Conflict(BATCH_SESSION, {"status": facts["status"]})
    if facts["status"] != Status.RUNNING or facts["agent_id"] is None:
        raise _not_running(facts["status"], facts["status_reason"])
    return ExecTarget(
        session_id=str(facts["session_id"]),
        kernel_id=str(facts["kernel_id"]),
        agent_id=facts["agent_id"],
        owner_id=facts["owner_id"],
        owner_acts=facts["owner_id"] == user.pk,
    )


def _not_running(status: str, reason: str) -> Conflict:
    if status in TERMINAL or status == Status.TERMINATING:
        message = f"the session has ended ({status}: {reason}); code runs only in a running session"
    else:
        message = f"the session is not running yet ({status}); code runs once it is RUNNING"
    return Conflict(message, {"status": status})


# --- history -----------------------------------------------------------------


@dataclass
class Sent:
    """A request on its way: what it asked, when, and whether its run has a row yet."""

    request: ExecRequest
    sent_at: datetime = field(default_factory=timezone.now)
    recorded: bool = False
    # A page that opens follows the run that is going, if one is (``ATTACH``).
    attach: bool = False

    def history_change(self, answer: dict[str, Any] | None) -> str | None:
        """What ``answer`` (an ``exec_result`` or ``exec_records``; None when
        none came) changes in the history: "create" the run's row (its first
        answer), "close" it (it ended), or nothing (None)."""
        if answer is not None and answer.get("reason") is not None:
            return None  # refused: no run started
        if self.request.starts_run and not self.recorded:
            self.recorded = True
            return "create"
        if answer is not None and answer.get("status") in ENDS_RUN:
            return "close"
        return None


def run_record(
    *,
    target: ExecTarget,
    user_id: int,
    sent: Sent,
    answer: dict[str, Any] | None,
    change: str,
) -> None:
    """Apply ``Sent.history_change``: a run's row is made at its first answer
    (or, when none came, as a run that may be going), so a refused start leaves
    none; an answer that says the run finished or timed out closes it."""
    status = (answer or {}).get("status")
    ended = status in ENDS_RUN
    fields = {
        "status": status if ended else RunStatus.RUNNING,
        "exit_code": answer["exit_code"] if answer and ended else None,
        "error": (answer.get("error") or "") if answer and ended else "",
        "finished_at": timezone.now() if ended else None,
    }
    if change == "create":
        ExecutionRun.objects.create(
            session_id=target.session_id,
            user_id=user_id,
            mode=sent.request.mode,
            run_id=sent.request.run_id,
            started_at=sent.sent_at,
            **fields,
        )
        logger.info(
            "run %s (%s) in session %s", sent.request.run_id, sent.request.mode, target.session_id
        )
    elif answer is not None:
        ExecutionRun.objects.filter(
            session_id=target.session_id, run_id=answer["run_id"], status=RunStatus.RUNNING
        ).update(**fields)


# One change to a run's row: what was sent, the answer, and ``Sent.history_change``'s word.
HistoryWrite = tuple[Sent, dict[str, Any] | None, str]


def coalesce_history(writes: list[HistoryWrite]) -> list[HistoryWrite]:
    """``writes`` in order, with a run made and closed within them written once:
    its "create" takes the answer that closed it (a quick run's row is one insert
    of the run as it ended, instead of an insert and an update)."""
    out: list[HistoryWrite] = []
    created: dict[str, int] = {}  # run id -> its create's place in ``out``
    for sent, answer, change in writes:
        run_id = answer.get("run_id") if answer is not None else None
        if change == "close" and run_id in created:
            place = created.pop(run_id)
            out[place] = (out[place][0], answer, "create")
            continue
        if change == "create" and sent.request.run_id is not None:
            created[sent.request.run_id] = len(out)
        out.append((sent, answer, change))
    return out


def write_history(*, target: ExecTarget, user_id: int, writes: list[HistoryWrite]) -> None:
    """Apply ``writes`` (coalesced) in order, each on its own: one that fails is
    logged and the others are still written."""
    for sent, answer, change in coalesce_history(writes):
        try:
            run_record(target=target, user_id=user_id, sent=sent, answer=answer, change=change)
        except Exception:
            logger.exception(
                "recording run %s of session %s", sent.request.run_id, target.session_id
            )


# --- the agent ---------------------------------------------------------------


def exec_command(*, target: ExecTarget, request: ExecRequest, stream: bool) -> dict[str, Any]:
    """The wire command for main1's agent (``protocol.EXEC``), under a new request id."""
    return {
        "type": protocol.EXEC,
        "req_id": uuid.uuid4().hex,
        "kernel_id": target.kernel_id,
        "mode": request.mode,
        "run_id": request.run_id,
        "code": request.code,
        "options": request.options,
        "stream": stream,
        "flush": settings.BAI_EXEC_FLUSH,
    }


async def send_to_agent(target: ExecTarget, command: dict[str, Any], *, reply: str) -> None:
    """Send through the agent's gateway, which passes its answers to ``reply``."""
    await get_channel_layer().group_send(
        protocol.agent_group(target.agent_id), protocol.gw_agent_command(command, reply=reply)
    )


class _Replies:
    """The one reply channel of the REST requests of an event loop (so of a daphne
    process), opened at the first request and kept: each request waits for the
    answers to its own request id, which a single reader hands out. A channel a
    request would cost a Redis subscribe and unsubscribe on every run's path.

    Only main1's agent can answer a request: the gateway passes an agent's
    answers on only for the request ids it sent that agent, so sharing the
    channel lets no agent answer another's request, and an answer for a request
    that stopped waiting (it timed out) is dropped here."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel: str | None = None
        self.waiting: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.opening = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None

    async def open(self) -> str:
        async with self.opening:
            if self.channel is None or self.reader is None or self.reader.done():
                self.channel = await self.layer.new_channel()
                self.reader = asyncio.get_running_loop().create_task(self._read(self.channel))
            return self.channel

    async def _read(self, channel: str) -> None:
        try:
            while True:
                event = await self.layer.receive(channel)
                queue = self.waiting.get(event.get("req_id"))
                if queue is not None:
                    queue.put_nowait(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the next request opens a new channel
            logger.warning("the reply channel %s failed", channel, exc_info=True)

    @contextlib.asynccontextmanager
    async def expect(self, req_id: str) -> AsyncIterator[tuple[str, asyncio.Queue[dict[str, Any]]]]:
        """The reply channel to name in the command, and the queue its answers come on."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.waiting[req_id] = queue
        try:
            yield await self.open(), queue
        finally:
            del self.waiting[req_id]


_replies: dict[tuple[asyncio.AbstractEventLoop, int], _Replies] = {}


def _replies_here() -> _Replies:
    layer = get_channel_layer()
    key = (asyncio.get_running_loop(), id(layer))
    replies = _replies.get(key)
    if replies is None or replies.layer is not layer:
        for old in [old for old in _replies if old[0].is_closed()]:
            del _replies[old]
        replies = _replies[key] = _Replies(layer)
    return replies


async def _ask(target: ExecTarget, command: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """The agent's ``exec_result`` for ``command``, on the loop's reply channel."""
    try:
        async with _replies_here().expect(command["req_id"]) as (reply, answers):
            await send_to_agent(target, command, reply=reply)
            async with asyncio.timeout(timeout):
                while True:
                    event = await answers.get()
                    if event["type"] == protocol.GW_EXEC_LOST:
                        raise AgentTimeout(f"{event['reason']}; try again", _run(command))
                    if event["type"] == protocol.GW_EXEC_RESULT:
                        return event
    except TimeoutError:
        going = f"; run {command['run_id']} may still be going" if command["run_id"] else ""
        raise AgentTimeout(
            f"main1's agent did not answer within {timeout:g} s{going}; try again",
            _run(command),
        ) from None


def _run(command: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": command["run_id"]} if command["run_id"] else {}


def answer_fields(answer: dict[str, Any]) -> dict[str, Any]:
    """What a user sees of an ``exec_result``: status, run id, exit code, the
    exception a run ended on when it raised one, and completions when it
    answers a complete."""
    shown = {key: answer.get(key) for key in ("status", "run_id", "exit_code")}
    if answer.get("error"):
        shown["error"] = answer["error"]
    if answer.get("completions") is not None:
        shown["completions"] = answer["completions"]
    return shown


# --- REST ----------------------------------------------------------------------


def execute_checks(
    *, user: AbstractBaseUser, session_id: object, body: Any, read: ReadFacts | None = None
) -> tuple[ExecRequest, ExecTarget]:
    """What ``execute`` checks before it asks the agent: the body (InvalidInput),
    then the session (NotFound, Conflict)."""
    request = exec_request(body, max_code=settings.BAI_EXEC_MAX_CODE)
    return request, exec_target(user=user, session_id=session_id, read=read)


def execute(
    *, user: AbstractBaseUser, session_id: object, body: Any, read: ReadFacts | None = None
) -> dict[str, Any]:
    """Run (or continue, feed, interrupt, complete) code in a session's main1 and
    answer with what the agent gathered: ``{"status", "run_id", "exit_code",
    "records", "completions"?}``. InvalidInput, NotFound, Conflict (including the
    agent's refusals, in its words) or AgentTimeout otherwise.

    Call it in a thread, never on the event loop (the API calls it in the
    request's thread, where the request was authenticated): the checks and the
    run's record use that thread's database connection, which goes back to the
    pool before the wait for the agent, and the wait is on the event loop (the
    process's reply channel). A run waiting for its agent holds no connection."""
    request, target = execute_checks(user=user, session_id=session_id, body=body, read=read)
    _give_back_connections()
    command = exec_command(target=target, request=request, stream=False)
    sent = Sent(request)
    answer: dict[str, Any] | None = None
    try:
        answer = async_to_sync(_ask_as)(target, command)
    finally:
        if change := sent.history_change(answer):
            record = partial(
                run_record, target=target, user_id=user.pk, sent=sent, answer=answer, change=change
            )
            # A run that ended with this answer is written once the answer is out:
            # nothing of it can come after. One still going (or unanswered) is
            # written first, so the answer that ends it later finds its row.
            if answer is not None and answer.get("status") in ENDS_RUN:
                after_response(record)
            else:
                record()
    if answer.get("reason") is not None:
        raise Conflict(answer["reason"], _run(command))
    return {**answer_fields(answer), "records": answer["records"]}


async def _ask_as(target: ExecTarget, command: dict[str, Any]) -> dict[str, Any]:
    if target.owner_acts:
        touch_later(target.session_id)
    return await _ask(target, command, timeout=settings.BAI_EXEC_FLUSH + ANSWER_GRACE)


def _give_back_connections() -> None:
    """Give this thread's database connections back (to the pool) before a wait,
    as a request's end would; one inside a transaction (a test's) stays."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
