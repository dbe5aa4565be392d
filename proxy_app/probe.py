"""``GET /_bai/probe?t=<token>&timeout=<s>``: one health check of a replica for the
serving reconciler (``serving_app/health.py`` signs the token, naming the agent,
kernel, port and path). One tunnel, one ``GET``, closed after; the answer is JSON
``{"ok": bool, "status": int | null, "reason": str}`` (ok: a 2xx answer in time)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import h11

from agent.protocol import TUNNEL_FAILED
from serving_app.health import read_probe_token
from sessions_app.service_ports import App

from . import tunnels
from .access import Target

MAX_TIMEOUT = 30.0


async def _answer(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _get(target: Target, path: str, port: int) -> int:
    tunnel = await tunnels.open_tunnel(target)
    try:
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method="GET",
            target=path,
            headers=[("host", "replica"), ("user-agent", "bai-health"), ("connection", "close")],
        )
        await tunnel.write(conn.send(request) + conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await tunnel.read()
                if data is None:
                    why = (
                        # The agent says why it could not connect (it tried the port).
                        (tunnel.close_reason or f"nothing listens on port {port}")
                        if tunnel.close_code == TUNNEL_FAILED
                        else "the replica closed the connection without an answer"
                    )
                    raise tunnels.TunnelFailed(why)
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                return event.status_code
            elif isinstance(event, h11.ConnectionClosed):
                raise tunnels.TunnelFailed("the replica closed the connection")
    finally:
        await tunnel.close()


async def serve_probe(scope: dict[str, Any], receive: Any, send: Any) -> None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    probe = read_probe_token((query.get("t") or [""])[0])
    if probe is None:
        await _answer(send, 403, {"ok": False, "status": None, "reason": "bad probe token"})
        return
    try:
        timeout = min(max(float((query.get("timeout") or ["2"])[0]), 0.1), MAX_TIMEOUT)
    except ValueError:
        timeout = 2.0
    target = Target(
        session_id=str(probe["k"]),
        kernel_id=str(probe["k"]),
        agent_id=str(probe["a"]),
        app=App(f"port-{probe['p']}", "http", int(probe["p"]), preopen=True),
        running=True,
        status="RUNNING",
        secret="",
    )
    try:
        status = await asyncio.wait_for(_get(target, str(probe["h"]), int(probe["p"])), timeout)
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
        await _answer(send, 200, {"ok": False, "status": None, "reason": reason})
        return
    except (tunnels.TunnelFailed, h11.ProtocolError, OSError) as exc:
        await _answer(send, 200, {"ok": False, "status": None, "reason": str(exc)[:200]})
        return
    ok = 200 <= status < 300
    reason = "" if ok else f"GET {probe['h']} answered {status}"
    await _answer(send, 200, {"ok": ok, "status": status, "reason": reason})
