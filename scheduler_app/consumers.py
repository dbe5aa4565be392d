"""The agent gateway: one websocket per agent at /ws/agent/.

Agents authenticate with ``Authorization: Token <token>`` (stored hashed),
register, then heartbeat; every heartbeat is answered with the commands that
close the gap between desired state (database) and the agent's report. The
channel-layer group of the agent carries the fast path: scheduler nudges and
browser commands (logs, terminals) in, streams out to their browser groups.

Agents are untrusted peers:

- every frame is decoded and checked against ``agent.protocol`` (its size, JSON,
  nesting, and every field of every message) before anything acts on it; a frame
  that fails is answered with an ``error`` saying why, logged, and changes nothing,
  and the connection stays open;
- an agent speaks only about its own kernels: reports and log tails are applied
  only to kernels placed on it, log chunks only to streams this gateway asked it to
  follow (of that kernel), terminal output only to terminals it was asked to open
  or was sent input for, code-run answers only to the requests sent to it (each
  to the channel that sent it); anything else is refused;
- the resource group is the admin's to set (``reconcile.agent_register``).

Liveness never queues behind work: a heartbeat's time is recorded the moment it is
read, on threads of its own, while the database work of the connection (reports,
the reconcile that answers a heartbeat, log tails, nudges) runs in arrival order on
one task per connection, with a bounded backlog, so the receive loop keeps reading.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from agent import protocol
from backendai_web.websockets import LoopDispatch, OpenSockets

from . import reconcile

logger = logging.getLogger(__name__)

# Database work waiting per connection: beyond either bound a report is refused
# (the next heartbeat carries the kernel's state again) and a reconcile dropped.
BACKLOG_ITEMS = 2048
BACKLOG_CHARS = 64 * 1024 * 1024  # of log tails
# Log streams, terminals and code-run requests remembered per connection (the
# oldest are forgotten).
KNOWN_STREAMS = 4096
# Refusals logged per connection and minute; the rest are counted.
REFUSALS_LOGGED = 20


def _db(func):  # type: ignore[no-untyped-def]
    """Run ORM work in the shared thread pool, not the single thread-sensitive
    executor: many agents report at once, and one slow call must not queue
    every other agent's work behind it."""
    return database_sync_to_async(func, thread_sensitive=False)


def _claim(layer: Any, group: str, channel: str) -> None:
    """The agent's group has one member, this connection: sends to it from this
    process skip Redis (``backendai_web.channel_layer``; other layers have no claims)."""
    if hasattr(layer, "claim_group"):
        layer.claim_group(group, channel)


def _release(layer: Any, group: str, channel: str) -> None:
    if hasattr(layer, "release_group"):
        layer.release_group(group, channel)


_setup_lock = threading.Lock()
_heartbeat_pool: ThreadPoolExecutor | None = None


def _heartbeat_db(func):  # type: ignore[no-untyped-def]
    """Heartbeat times go through threads of their own: a pool busy with every
    agent's reports must not hold back the one update that keeps an agent ALIVE."""
    global _heartbeat_pool
    with _setup_lock:
        if _heartbeat_pool is None:
            _heartbeat_pool = ThreadPoolExecutor(2, thread_name_prefix="bai-heartbeat")
    return database_sync_to_async(func, thread_sensitive=False, executor=_heartbeat_pool)


_beacon_started = False


def start_listening_beacon() -> None:
    """Tell the lost-agent sweep, every few seconds, that this process listens for
    agents (``reconcile.gateway_listening_beat``). Called once by the ASGI entry
    point; a daemon thread, so it needs no event loop and ends with the process."""
    global _beacon_started
    with _setup_lock:
        if _beacon_started:
            return
        _beacon_started = True
    threading.Thread(target=_beacon, name="bai-gateway-beacon", daemon=True).start()


def _beacon() -> None:
    failing = False
    while True:
        try:
            reconcile.gateway_listening_beat()
            if failing:
                logger.info("gateway beacon: redis answers again")
            failing = False
        except Exception:  # noqa: BLE001 - the beacon must outlive any outage
            if not failing:
                logger.warning("gateway beacon: cannot reach redis", exc_info=True)
            failing = True
        time.sleep(reconcile.gateway_listening_period())


class _Recent(collections.OrderedDict[str, str]):
    """A bounded map: past ``limit`` entries the oldest is forgotten."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: str, value: str = "") -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass
class _Work:
    """One item of a connection's backlog. ``reports`` of a reconcile: a heartbeat's
    (the agent's full state), or None for a nudge."""

    kind: str  # "reconcile", "report" or "log_tail"
    message: dict[str, Any] | None = None
    reports: list[dict[str, Any]] | None = None
    started: bool = False
    chars: int = 0


class AgentGatewayConsumer(LoopDispatch, OpenSockets, AsyncJsonWebsocketConsumer):
    """Terminal output goes straight to the channels of the browser consumers that
    sent the terminal's commands (``reply``), not through the terminal's group:
    one direct send per frame, and none through Redis when the browser consumer
    is in this process. A terminal with no known consumer (e.g. after this
    connection replaced another) falls back to its group."""

    socket_kind = "agent"

    agent_id: str | None = None
    group: str | None = None
    generation = 0
    _worker: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        headers = dict(self.scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        token = auth[6:].strip() if auth.lower().startswith("token ") else ""
        await self.accept()
        try:
            agent = await _db(reconcile.agent_authenticate)(token=token)
        except reconcile.AgentRefused as exc:
            client = self.scope.get("client") or ("?", 0)
            logger.warning("agent connection from %s refused: %s", client[0], exc)
            await self.send_json({"type": protocol.ERROR, "message": str(exc)})
            await self.close(code=protocol.CLOSE_BAD_TOKEN)
            return
        self.agent_id = agent.pk
        self.max_frame = protocol.max_frame_chars(settings.BAI_LOG_TAIL_BYTES)
        self.term_routes: dict[str, set[str]] = {}
        # What this agent was asked for: log streams (stream id -> kernel id),
        # terminals and code runs (request id -> the channel waiting for its
        # answers); and those just ended, whose late frames are dropped quietly.
        self.streams = _Recent(KNOWN_STREAMS)
        self.terms = _Recent(KNOWN_STREAMS)
        self.execs = _Recent(KNOWN_STREAMS)
        self.ended = _Recent(KNOWN_STREAMS)
        self.backlog: collections.deque[_Work] = collections.deque()
        self.backlog_chars = 0
        self.work_ready = asyncio.Event()
        self._worker = asyncio.create_task(self._work())
        self._refusals_window = time.monotonic()
        self._refusals_logged = 0
        self._refusals_quiet = 0

    async def disconnect(self, code: int) -> None:
        if self._worker is not None:
            # What is still waiting is dropped: the next connection's register
            # carries the agent's whole state again.
            self._worker.cancel()
            self._worker = None
        # The browser consumers that sent here go back to the agent's group
        # (where the next connection of this agent will be).
        routes = getattr(self, "term_routes", {})
        for channel in {c for channels in routes.values() for c in channels}:
            await self.channel_layer.send(
                channel, protocol.gw_term_route(None, sender=self.channel_name)
            )
        routes.clear()
        # Whoever waits for a code run's answer hears now that none will come.
        for req_id, reply in getattr(self, "execs", {}).items():
            await self.channel_layer.send(
                reply,
                {
                    "type": protocol.GW_EXEC_LOST,
                    "req_id": req_id,
                    "reason": "the session's agent disconnected before it answered",
                },
            )
        if self.group:
            _release(self.channel_layer, self.group, self.channel_name)
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.agent_id and self.group:
            await _db(reconcile.agent_disconnected)(agent_id=self.agent_id)
            logger.info("agent %s disconnected (code %s)", self.agent_id, code)

    # --- frames in -----------------------------------------------------------

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if self.agent_id is None:
            return  # refused in connect(); the close is on its way
        if text_data is None:
            await self._refuse("frame", "binary frames are not part of the protocol")
            return
        try:
            message = protocol.decode_frame(text_data, max_chars=self.max_frame)
        except protocol.FrameError as exc:
            await self._refuse("frame", str(exc))
            return
        await self.receive_json(message)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.agent_id is None:
            return
        refusal = protocol.validate(content)
        kind = content.get("type") if isinstance(content, dict) else None
        if refusal is not None:
            known = isinstance(kind, str) and kind in self._handlers
            await self._refuse(kind if known else "frame", refusal)
            return
        if self.group is None and kind != protocol.REGISTER:
            await self._refuse(kind, "the first message must be register")
            return
        try:
            await self._handlers[kind](self, content)
        except Exception:
            # A fault of ours must not end the agent's connection either.
            logger.exception("agent %s: handling a %s message failed", self.agent_id, kind)
            await self._error(f"{kind}: the manager failed to handle it; it was dropped")

    async def _error(self, message: str) -> None:
        await self.send_json({"type": protocol.ERROR, "message": message})

    async def _refuse(self, kind: str | None, why: str) -> None:
        """Answer and log a frame that changes nothing; the connection stays open."""
        now = time.monotonic()
        if now - self._refusals_window >= 60:
            if self._refusals_quiet:
                logger.warning(
                    "agent %s: %d more refused frames were not logged",
                    self.agent_id,
                    self._refusals_quiet,
                )
            self._refusals_window, self._refusals_logged, self._refusals_quiet = now, 0, 0
        if self._refusals_logged < REFUSALS_LOGGED:
            self._refusals_logged += 1
            logger.warning("agent %s: refused a %s: %s", self.agent_id, kind or "frame", why)
        else:
            self._refusals_quiet += 1
        await self._error(f"{kind or 'frame'} refused: {why}")

    async def _close_protocol(self, message: str) -> None:
        await self._error(message)
        await self.close(code=protocol.CLOSE_PROTOCOL)

    # --- agent -> manager --------------------------------------------------

    async def _on_register(self, msg: dict[str, Any]) -> None:
        if msg.get("protocol") not in (None, protocol.PROTOCOL_VERSION):
            await self._close_protocol(f"unsupported protocol {msg.get('protocol')!r}")
            return
        from sessions_app.models import Agent

        try:
            agent = await _db(
                lambda: reconcile.agent_register(
                    agent=Agent.objects.get(pk=self.agent_id), info=msg
                )
            )()
        except reconcile.AgentRefused as exc:
            await self._close_protocol(str(exc))
            return
        self.group = protocol.agent_group(agent.pk)
        self.generation = agent.connection_generation
        # Only one live connection per agent: the newest registration wins. Join the group
        # first, then announce: an older connection that joined before this announcement
        # hears it; one that joins after it finds the newer number in the database below.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_send(
            self.group,
            {
                "type": protocol.GW_AGENT_REPLACED,
                "channel": self.channel_name,
                "generation": self.generation,
            },
        )
        if await _db(reconcile.agent_generation)(agent_id=agent.pk) != self.generation:
            await self._replaced()
            return
        _claim(self.channel_layer, self.group, self.channel_name)
        await self.send_json(
            {
                "type": protocol.REGISTERED,
                "agent_id": agent.pk,
                "heartbeat_interval": settings.BAI_AGENT_HEARTBEAT_INTERVAL,
                "log_tail_bytes": settings.BAI_LOG_TAIL_BYTES,
                "exec_output_limit": settings.BAI_EXEC_OUTPUT_LIMIT,
            }
        )
        self._want_reconcile(msg["kernels"])

    async def _on_heartbeat(self, msg: dict[str, Any]) -> None:
        # First the time, at once; the report waits its turn behind earlier ones.
        await _heartbeat_db(reconcile.agent_heartbeat)(agent_id=self.agent_id)
        self._want_reconcile(msg["kernels"])

    async def _on_kernel_status(self, msg: dict[str, Any]) -> None:
        if not self._enqueue(_Work("report", message=msg)):
            await self._refuse(
                protocol.KERNEL_STATUS,
                f"{len(self.backlog)} reports are waiting; this one was dropped "
                "(the next heartbeat carries the kernel's state)",
            )

    async def _on_log_tail(self, msg: dict[str, Any]) -> None:
        if not self._enqueue(_Work("log_tail", message=msg, chars=len(msg["data"]))):
            await self._refuse(protocol.LOG_TAIL, "too much is waiting; send it again later")

    async def _on_log_chunk(self, msg: dict[str, Any]) -> None:
        stream_id = msg["stream_id"]
        kernel_id = self.streams.get(stream_id)
        if kernel_id is None:
            if stream_id not in self.ended:  # else: a late chunk of a stopped stream
                await self._refuse(
                    protocol.LOG_CHUNK, f"stream {stream_id} was not opened on this agent"
                )
            return
        if kernel_id != msg["kernel_id"]:
            await self._refuse(
                protocol.LOG_CHUNK, f"stream {stream_id} follows another kernel's log"
            )
            return
        await self.channel_layer.group_send(
            protocol.log_stream_group(stream_id),
            {"type": protocol.GW_LOGS_CHUNK, "kernel_id": kernel_id, "data": msg["data"]},
        )

    async def _on_term_output(self, msg: dict[str, Any]) -> None:
        if await self._own_terminal(msg["term_id"]):
            await self._to_terminal(
                msg["term_id"], {"type": protocol.GW_TERM_OUTPUT, "data": msg["data"]}
            )

    async def _on_term_closed(self, msg: dict[str, Any]) -> None:
        term_id = msg["term_id"]
        if not await self._own_terminal(term_id):
            return
        await self._to_terminal(
            term_id, {"type": protocol.GW_TERM_CLOSED, "reason": msg.get("reason") or ""}
        )
        self.term_routes.pop(term_id, None)
        self.terms.pop(term_id, None)
        self.ended.remember(term_id)

    async def _own_terminal(self, term_id: str) -> bool:
        return await self._asked_here(
            self.terms, term_id, "terminal frame", f"terminal {term_id} is not open on this agent"
        )

    async def _asked_here(self, asked: _Recent, key: str, kind: str, refusal: str) -> bool:
        """Whether ``key`` is something this agent was asked for; a frame about
        anything else is refused, except a late one of something just ended."""
        if key in asked:
            return True
        if key not in self.ended:
            await self._refuse(kind, refusal)
        return False

    async def _on_exec_records(self, msg: dict[str, Any]) -> None:
        reply = await self._exec_reply(msg["req_id"])
        if reply is not None:
            await self.channel_layer.send(reply, {**msg, "type": protocol.GW_EXEC_RECORDS})

    async def _on_exec_result(self, msg: dict[str, Any]) -> None:
        req_id = msg["req_id"]
        reply = await self._exec_reply(req_id)
        if reply is not None:
            # The one answer that ends the request: anything later is dropped.
            del self.execs[req_id]
            self.ended.remember(req_id)
            await self.channel_layer.send(reply, {**msg, "type": protocol.GW_EXEC_RESULT})

    async def _exec_reply(self, req_id: str) -> str | None:
        """The channel waiting for request ``req_id``, if it was sent to this agent."""
        refusal = f"request {req_id} was not sent to this agent"
        if await self._asked_here(self.execs, req_id, "exec frame", refusal):
            return self.execs[req_id]
        return None

    async def _to_terminal(self, term_id: str, event: dict[str, Any]) -> None:
        channels = self.term_routes.get(term_id)
        if channels:
            for channel in channels:
                await self.channel_layer.send(channel, event)
        else:
            await self.channel_layer.group_send(protocol.terminal_group(term_id), event)

    async def _on_error(self, msg: dict[str, Any]) -> None:
        logger.warning("agent %s reports: %s", self.agent_id, msg.get("message"))
        stream_id = msg.get("stream_id")
        if stream_id and self.streams.pop(stream_id, None) is not None:
            self.ended.remember(stream_id)  # that follow failed; nothing more comes

    _handlers = {
        protocol.REGISTER: _on_register,
        protocol.HEARTBEAT: _on_heartbeat,
        protocol.KERNEL_STATUS: _on_kernel_status,
        protocol.LOG_CHUNK: _on_log_chunk,
        protocol.LOG_TAIL: _on_log_tail,
        protocol.TERM_OUTPUT: _on_term_output,
        protocol.TERM_CLOSED: _on_term_closed,
        protocol.EXEC_RECORDS: _on_exec_records,
        protocol.EXEC_RESULT: _on_exec_result,
        protocol.ERROR: _on_error,
    }

    # --- the connection's database work, in arrival order -------------------

    def _enqueue(self, work: _Work) -> bool:
        if len(self.backlog) >= BACKLOG_ITEMS or self.backlog_chars + work.chars > BACKLOG_CHARS:
            return False
        self.backlog.append(work)
        self.backlog_chars += work.chars
        self.work_ready.set()
        return True

    def _want_reconcile(self, reports: list[dict[str, Any]] | None) -> None:
        """Queue a reconcile: a heartbeat's (``reports``) or a nudge's (None).

        A reconcile still waiting last in line absorbs the new one: a newer
        heartbeat replaces the older one's full state, and a nudge is covered by
        any reconcile. Only the last in line, so no report overtakes another."""
        last = self.backlog[-1] if self.backlog else None
        if last is not None and last.kind == "reconcile" and not last.started:
            if reports is not None:
                last.reports = reports
            return
        if not self._enqueue(_Work("reconcile", reports=reports)):
            logger.warning(
                "agent %s: %d items waiting; a reconcile was dropped (the next heartbeat retries)",
                self.agent_id,
                len(self.backlog),
            )

    async def _work(self) -> None:
        while True:
            await self.work_ready.wait()
            while self.backlog:
                work = self.backlog[0]
                work.started = True
                try:
                    await self._do(work)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("agent %s: applying a %s failed", self.agent_id, work.kind)
                finally:
                    self.backlog.popleft()
                    self.backlog_chars -= work.chars
            self.work_ready.clear()

    async def _do(self, work: _Work) -> None:
        if work.kind == "reconcile":
            commands = await _db(reconcile.agent_reconcile)(
                agent_id=self.agent_id, reports=work.reports
            )
            for command in commands:
                await self.send_json(command)
            return
        msg = work.message
        assert msg is not None
        if work.kind == "report":
            taken = await _db(reconcile.agent_kernel_report)(agent_id=self.agent_id, report=msg)
            # "gone" for a kernel it never had is the answer to a destroy: no fault.
            if not taken and msg["status"] != protocol.KR_GONE:
                await self._refuse(
                    protocol.KERNEL_STATUS, f"kernel {msg['kernel_id']} is not on this agent"
                )
        elif work.kind == "log_tail":
            taken = await _db(reconcile.kernel_store_log_tail)(
                agent_id=self.agent_id, kernel_id=msg["kernel_id"], data=msg["data"]
            )
            if not taken:
                await self._refuse(
                    protocol.LOG_TAIL, f"kernel {msg['kernel_id']} is not on this agent"
                )

    # --- channel layer -> agent --------------------------------------------

    async def agent_command(self, event: dict[str, Any]) -> None:
        command = event["command"]
        kind = command.get("type")
        if kind in protocol.MANAGER_MESSAGES:
            refusal = protocol.validate_command(command)
            if refusal:
                logger.warning("agent %s: not sending %s", self.agent_id, refusal)
                return
        # Bind what the agent is asked for to this agent: only these streams,
        # terminals and code runs may carry its output.
        if kind == protocol.LOGS_FOLLOW:
            self.streams.remember(command["stream_id"], command["kernel_id"])
            self.ended.pop(command["stream_id"], None)
        elif kind == protocol.LOGS_STOP:
            if self.streams.pop(command["stream_id"], None) is not None:
                self.ended.remember(command["stream_id"])
        elif kind == protocol.EXEC and event.get("reply"):
            self.execs.remember(command["req_id"], event["reply"])
            self.ended.pop(command["req_id"], None)
        term_id = command.get("term_id")
        if term_id is not None:
            self.terms.remember(term_id)
            self.ended.pop(term_id, None)
        reply = event.get("reply")
        if term_id is None or not reply:
            await self.send_json(command)
            return
        # A browser terminal consumer: remember where this terminal's output goes.
        if kind in (protocol.TERM_DETACH, protocol.TERM_CLOSE):
            channels = self.term_routes.get(term_id)
            if channels is not None:
                channels.discard(reply)
                if not channels:
                    del self.term_routes[term_id]
            await self.send_json(command)
            return
        self.term_routes.setdefault(term_id, set()).add(reply)
        await self.send_json(command)
        if event.get("ack") is not None:
            # It came through the group: say where to send from now on.
            await self.channel_layer.send(
                reply, protocol.gw_term_route(self.channel_name, ack=event["ack"])
            )

    async def agent_reconcile(self, event: dict[str, Any]) -> None:
        if self.group is not None:
            self._want_reconcile(None)

    async def agent_replaced(self, event: dict[str, Any]) -> None:
        if self.group is None or event.get("channel") == self.channel_name:
            return
        # An older connection's announcement (it registered before this one) changes nothing.
        if event.get("generation", self.generation + 1) > self.generation:
            await self._replaced()

    async def _replaced(self) -> None:
        """Leave the agent's group and close with CLOSE_REPLACED, saying why: a newer
        connection of the same agent registered. Not a disconnection of the agent."""
        logger.info("agent %s: a newer connection took over", self.agent_id)
        _release(self.channel_layer, self.group, self.channel_name)
        await self.channel_layer.group_discard(self.group, self.channel_name)
        self.group = None
        await self._error(
            "replaced: a newer connection of this agent registered; this one is closed"
        )
        await self.close(code=protocol.CLOSE_REPLACED)
