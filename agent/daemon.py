"""The node daemon: one websocket to the manager, commands in, reports out.

It dials ``<manager>/ws/agent/`` with ``Authorization: Token <token>``, registers its
capacity and the kernels it already runs, then heartbeats the kernels it really runs
every ``heartbeat_interval`` and carries out the manager's commands through a
:class:`~agent.backends.base.Backend`. When the manager goes away it reconnects with
exponential backoff; a close with code 4401 (bad token) ends the process instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import random
import urllib.parse
from collections.abc import Awaitable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from agent import metrics, protocol
from agent.backends.base import Backend, KernelError
from agent.config import AgentConfig, capacity
from agent.tunnel import run_tunnel

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
EXIT_OK = 0
EXIT_BAD_TOKEN = 3

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0
REGISTER_TIMEOUT = 30.0
DEFAULT_HEARTBEAT = 10.0
OUTBOX_LIMIT = 20_000  # frames kept while the manager is away (oldest dropped first)
OUTBOX_HIGH = 256  # log followers wait while more frames than this are queued
# Frames that only make sense to a live listener: dropped while disconnected.
# A code run's answers too: the manager's wait for them ended with the connection, and
# the run's output waits in the agent for the next "continue".
_VOLATILE = frozenset(
    {protocol.TERM_OUTPUT, protocol.LOG_CHUNK, protocol.EXEC_RECORDS, protocol.EXEC_RESULT}
)
# Frames someone is waiting on interactively: sent ahead of queued log chunks,
# so a followed log (up to OUTBOX_HIGH frames queued) does not delay an echo.
_URGENT = frozenset({protocol.TERM_OUTPUT, protocol.TERM_CLOSED})


class _RedactAuthorization(logging.Filter):
    """The websockets handshake log prints request headers at DEBUG: hide the token."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 2 and str(args[0]).lower() == "authorization":
            record.args = (args[0], "[redacted]")
        return True


_WS_LOG = logging.getLogger("agent.ws")
_WS_LOG.addFilter(_RedactAuthorization())


def _bounded_setting(value: Any, current: int, low: int, high: int) -> int:
    """A manager's integer setting moved into low..high; ``current`` when it sent none."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(value, low), high)
    return current


class BadToken(Exception):
    """The manager refused the token; retrying with it cannot help."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: Backend,
        *,
        slots: dict[str, str] | None = None,
        backoff_start: float = BACKOFF_START,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.config = config
        self.backend = backend
        backend.emit = self.emit
        self.slots = slots if slots is not None else capacity(config)
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.agent_id: str | None = None
        self.heartbeat_interval = DEFAULT_HEARTBEAT
        self._ws: ClientConnection | None = None
        self._outbox: collections.deque[dict[str, Any]] = collections.deque()
        self._urgent: collections.deque[dict[str, Any]] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_room = asyncio.Event()
        self._outbox_room.set()
        backend.execution.room = self._outbox_room.wait  # streamed runs pace on the outbox
        self._tasks: set[asyncio.Task[Any]] = set()
        self._follows: dict[str, asyncio.Task[Any]] = {}
        self._stop = asyncio.Event()
        self.registered = asyncio.Event()  # set on each successful registration (tests wait on it)

    # --- outgoing -------------------------------------------------------------------

    def emit(self, frame: dict[str, Any]) -> None:
        """Queue a frame for the manager; never blocks. Free text is cut to the
        protocol's bounds first, so the manager never refuses a report over it."""
        frame = protocol.fit(frame)
        kind = frame.get("type")
        if self._ws is None and kind in _VOLATILE:
            return
        if kind in _URGENT:
            self._urgent.append(frame)
            self._outbox_ready.set()
            return
        self._outbox.append(frame)
        if len(self._outbox) > OUTBOX_LIMIT:
            dropped = self._outbox.popleft()
            log.warning("outbox full: dropped a %s frame", dropped.get("type"))
        if len(self._outbox) > OUTBOX_HIGH:
            self._outbox_room.clear()
        self._outbox_ready.set()

    async def _sender(self, ws: ClientConnection) -> None:
        while True:
            await self._outbox_ready.wait()
            while self._urgent or self._outbox:
                if self._urgent:
                    frame = self._urgent.popleft()
                else:
                    frame = self._outbox.popleft()
                    if len(self._outbox) <= OUTBOX_HIGH // 2:
                        self._outbox_room.set()
                await ws.send(json.dumps(frame))
            self._outbox_room.set()
            self._outbox_ready.clear()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            kernels = [k.to_wire() for k in await self.backend.list_kernels()]
            self.emit({"type": protocol.HEARTBEAT, "kernels": kernels, "slots": self.slots})

    # --- the connection loop ---------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Serve until stopped; returns the process exit code."""
        await self.backend.start()
        attempt = 0
        try:
            while not self._stop.is_set():
                try:
                    session = asyncio.create_task(self._session())
                    stopper = asyncio.create_task(self._stop.wait())
                    done, _ = await asyncio.wait(
                        {session, stopper}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if stopper in done:
                        await self._end_session(session)
                        break
                    stopper.cancel()
                    if session.result():
                        attempt = 0  # it registered: start the backoff afresh
                except BadToken as exc:
                    log.error("the manager refused this agent's token: %s; not retrying", exc)
                    return EXIT_BAD_TOKEN
                except (TimeoutError, OSError, WebSocketException) as exc:
                    log.warning("manager connection failed: %s", exc or type(exc).__name__)
                delay = min(self.backoff_max, self.backoff_start * 2**attempt)
                delay = random.uniform(delay / 2, delay)  # jitter: agents do not return in step
                attempt += 1
                log.info("reconnecting in %.2f s", delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
        finally:
            await self.backend.close()
        return EXIT_OK

    async def _end_session(self, session: asyncio.Task[bool]) -> None:
        """Close the connection cleanly (1001), then make sure the session task is over."""
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(1001, "agent stopping"), 3)
        if not session.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(session), 3)
        session.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.config.token}"}

    def _origin(self) -> str:
        # Sent so that an origin-validating ASGI stack in front of the gateway accepts us.
        parts = urllib.parse.urlsplit(self.config.manager)
        scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
        return f"{scheme}://{parts.netloc}"

    async def _session(self) -> bool:
        """One connection. Returns True if it registered; raises BadToken on 4401."""
        url = self.config.ws_url
        log.info("connecting to %s", url)
        registered = False
        try:
            async with connect(
                url,
                additional_headers=self._headers(),
                origin=self._origin(),  # type: ignore[arg-type]
                open_timeout=10,
                max_size=16 * 1024 * 1024,
                ping_interval=20,
                ping_timeout=20,
                logger=_WS_LOG,
            ) as ws:
                await self._register(ws)
                registered = True
                await self._serve(ws)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise BadToken(
                    f"handshake answered HTTP {status} (bad token, or the origin was refused)"
                ) from exc
            raise
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            reason = exc.rcvd.reason if exc.rcvd else ""
            if code == protocol.CLOSE_BAD_TOKEN:
                raise BadToken(reason or "close code 4401") from exc
            log.warning("manager closed the connection: code=%s reason=%s", code, reason)
        return registered

    async def _register(self, ws: ClientConnection) -> None:
        kernels = [k.to_wire() for k in await self.backend.list_kernels()]
        await ws.send(
            json.dumps(
                protocol.fit(
                    {
                        "type": protocol.REGISTER,
                        "protocol": protocol.PROTOCOL_VERSION,
                        "hostname": self.config.hostname,
                        "backend": self.backend.name,
                        "resource_group": self.config.resource_group,
                        "slots": self.slots,
                        "labels": self.config.labels,
                        "version": AGENT_VERSION,
                        "kernels": kernels,
                    }
                )
            )
        )
        async with asyncio.timeout(REGISTER_TIMEOUT):
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("type") == protocol.REGISTERED:
                    break
                if msg.get("type") == protocol.ERROR:
                    log.warning("manager error before registration: %s", msg.get("message"))
        self.agent_id = str(msg["agent_id"])
        self._apply_registered(msg)
        self.backend.set_agent_id(self.agent_id)
        log.info(
            "registered as agent %s (heartbeat every %.1f s, %d kernels reported)",
            self.agent_id,
            self.heartbeat_interval,
            len(kernels),
        )

    def _apply_registered(self, msg: dict[str, Any]) -> None:
        """The manager's settings for this agent, within the protocol's bounds."""
        self.heartbeat_interval = float(msg.get("heartbeat_interval") or DEFAULT_HEARTBEAT)
        config = self.config
        config.log_tail_bytes = _bounded_setting(
            msg.get("log_tail_bytes"),
            config.log_tail_bytes,
            protocol.LOG_TAIL_BYTES_MIN,
            protocol.LOG_TAIL_BYTES_MAX,
        )
        config.exec_output_limit = _bounded_setting(
            msg.get("exec_output_limit"),
            config.exec_output_limit,
            protocol.EXEC_OUTPUT_LIMIT_MIN,
            protocol.EXEC_OUTPUT_LIMIT_MAX,
        )

    async def _serve(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._outbox_ready.set()  # flush what queued up while disconnected
        sender = asyncio.create_task(self._sender(ws))
        heartbeats = asyncio.create_task(self._heartbeats())
        reader = asyncio.create_task(self._reader(ws))
        self.registered.set()
        try:
            done, _ = await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise ConnectionClosed from whichever side saw it first
        finally:
            self.registered.clear()
            self._ws = None
            for task in (sender, heartbeats, reader):
                task.cancel()
            for task in list(self._follows.values()):
                task.cancel()
            self._follows.clear()
            self._drop_volatile()
            self.backend.terminals.detach_all()

    def _drop_volatile(self) -> None:
        kept = [f for f in self._urgent if f.get("type") not in _VOLATILE]
        kept += [f for f in self._outbox if f.get("type") not in _VOLATILE]
        self._urgent.clear()
        self._outbox.clear()
        self._outbox.extend(kept)
        self._outbox_room.set()

    async def _reader(self, ws: ClientConnection) -> None:
        async for raw in ws:
            try:
                msg = json.loads(raw)
            except ValueError:
                log.warning("ignoring a frame that is not JSON")
                continue
            if not isinstance(msg, dict):
                log.warning("ignoring a frame that is not an object")
                continue
            try:
                self.dispatch(msg)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring malformed %s frame: %r", msg.get("type"), exc)
        # a clean close from the manager ends here; the caller reconnects
        raise ConnectionClosed(ws.protocol.close_rcvd, ws.protocol.close_sent)

    # --- commands -----------------------------------------------------------------------

    def dispatch(self, msg: dict[str, Any]) -> None:
        """Carry out one manager frame. Slow work runs as tasks; terminal input stays in order."""
        kind = msg.get("type")
        backend = self.backend
        if kind == protocol.CREATE_KERNELS:
            ids = [k["kernel_id"] for k in msg["kernels"]]
            log.info("create_kernels session %s kernels %s", msg["session_id"], ids)
            self._spawn(backend.create_kernels(msg))
        elif kind == protocol.DESTROY_KERNELS:
            log.info("destroy_kernels %s (%s)", msg["kernel_ids"], msg.get("reason"))
            self._spawn(
                backend.destroy_kernels(list(msg["kernel_ids"]), msg.get("reason") or ""),
                operation="destroy",
            )
        elif kind == protocol.TERM_INPUT:
            backend.term_input(msg["term_id"], msg["data"])
        elif kind == protocol.TERM_OPEN:
            self._spawn(
                backend.term_open(
                    msg["term_id"], msg["kernel_id"], int(msg["cols"]), int(msg["rows"])
                )
            )
        elif kind == protocol.TERM_RESIZE:
            self._spawn(backend.term_resize(msg["term_id"], int(msg["cols"]), int(msg["rows"])))
        elif kind == protocol.TERM_DETACH:
            backend.term_detach(msg["term_id"])
        elif kind == protocol.TERM_CLOSE:
            self._spawn(backend.term_close(msg["term_id"]))
        elif kind == protocol.LOGS_FOLLOW:
            stream_id = msg["stream_id"]
            if stream_id not in self._follows:
                task = asyncio.create_task(
                    self._follow(msg["kernel_id"], stream_id, int(msg.get("tail") or 0))
                )
                self._follows[stream_id] = task
                task.add_done_callback(lambda _t: self._follows.pop(stream_id, None))
        elif kind == protocol.LOGS_STOP:
            task = self._follows.pop(msg["stream_id"], None)
            if task is not None:
                task.cancel()
        elif kind == protocol.TUNNEL_OPEN:
            self._spawn(run_tunnel(backend, msg))
        elif kind == protocol.EXEC:
            backend.execution.handle(msg)
        elif kind == protocol.REGISTERED:
            self._apply_registered(msg)
        elif kind == protocol.ERROR:
            log.warning("manager says: %s", msg.get("message"))
        else:
            log.warning("ignoring unknown frame type %r", kind)

    def _spawn(self, coro: Awaitable[Any], operation: str = "command") -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                metrics.ERRORS.labels(operation).inc()
                log.exception("command failed")

        task = asyncio.create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self, kernel_id: str, stream_id: str, tail: int) -> None:
        try:
            async for chunk in self.backend.follow_logs(kernel_id, tail):
                await self._outbox_room.wait()
                self.emit(
                    {
                        "type": protocol.LOG_CHUNK,
                        "kernel_id": kernel_id,
                        "stream_id": stream_id,
                        "data": chunk,
                    }
                )
        except KernelError as exc:
            self.emit(
                {
                    "type": protocol.ERROR,
                    "message": f"logs_follow {stream_id}: {exc}",
                    "stream_id": stream_id,
                }
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            metrics.ERRORS.labels("logs").inc()
            log.exception("log stream %s of kernel %s failed", stream_id, kernel_id)
