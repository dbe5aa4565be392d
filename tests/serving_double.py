"""A stand-in for serving_app's side of the router contract, until core's selectors land.

The router (proxy_app/router.py) reaches serving_app through three calls only:
``_router_view(name)``, ``_token_ok(endpoint_id, presented)`` and ``_wake(endpoint_id, reason)``.
``ServingDouble`` answers them from plain data shaped like the contract's RouterView and
RouteTarget, so that router tests run against real upstreams before the Endpoint and Route
tables exist. Two ways in:

- in the test process: ``ServingDouble.install(monkeypatch)`` (the ``serving`` fixture);
- in an apps-proxy subprocess: ``tests.serving_double_asgi:application`` reads the same data
  from the JSON file named by ``BAI_TEST_SERVING_DOUBLE`` (``ServingDouble.save``), on every
  call, so a test changes routes while the proxy runs.

When core's selectors are merged, tests swap this for real rows (an Endpoint, Routes, tokens)
and the real ``proxy_app.asgi:application``; nothing else in the tests names the double.

``LoopbackTunnel`` is the other stand-in, for the in-process tests only: a tunnel straight to
``127.0.0.1:<port>`` instead of through an agent, with the agent's behaviour when nothing listens
(the tunnel closes with TUNNEL_FAILED before any byte).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV = "BAI_TEST_SERVING_DOUBLE"


@dataclass
class RouteTarget:
    route_id: int
    ratio: float
    session_id: str
    target: dict[str, Any]  # {"session_id", "kernel_id", "agent_id", "port"}


@dataclass
class RouterView:
    endpoint_id: str
    owner_id: int
    open_to_public: bool
    status: str
    status_reason: str
    replicas: int
    min_replicas: int
    routes: list[RouteTarget] = field(default_factory=list)


def route(
    route_id: int, port: int, *, ratio: float = 1.0, kernel_id: str = "", agent_id: str = "loopback"
) -> RouteTarget:
    """A route to ``port`` of a kernel (for LoopbackTunnel, 127.0.0.1:port)."""
    kernel = kernel_id or f"00000000-0000-0000-0000-{route_id:012d}"
    return RouteTarget(
        route_id=route_id,
        ratio=ratio,
        session_id=kernel,
        target={"session_id": kernel, "kernel_id": kernel, "agent_id": agent_id, "port": port},
    )


@dataclass
class ServingDouble:
    endpoints: dict[str, RouterView] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)  # endpoint id -> plain tokens
    wakes: list[tuple[str, str]] = field(default_factory=list)
    view_calls: int = 0
    on_wake: Any = None  # called with the endpoint's view when woken (e.g. to add a route)

    def endpoint(
        self, name: str, *routes: RouteTarget, public: bool = True, **fields: Any
    ) -> RouterView:
        defaults = {
            "endpoint_id": f"e{len(self.endpoints):07d}-0000-0000-0000-000000000000",
            "owner_id": 1,
            "open_to_public": public,
            "status": "READY" if routes else "PROVISIONING",
            "status_reason": "",
            "replicas": len(routes),
            "min_replicas": 0,
        }
        view = RouterView(**{**defaults, **fields}, routes=list(routes))
        self.endpoints[name] = view
        return view

    # The three calls of the contract.
    def router_view(self, name: str) -> RouterView | None:
        self.view_calls += 1
        return self.endpoints.get(name)

    def token_ok(self, endpoint_id: str, presented: str) -> bool:
        return presented in self.tokens.get(endpoint_id, [])

    def wake(self, endpoint_id: str, reason: str) -> None:
        self.wakes.append((endpoint_id, reason))
        for view in self.endpoints.values():
            if view.endpoint_id == endpoint_id and self.on_wake is not None:
                self.on_wake(view)

    def install(self, monkeypatch: Any) -> None:
        from proxy_app import router

        monkeypatch.setattr(router, "_router_view", self.router_view)
        monkeypatch.setattr(router, "_token_ok", self.token_ok)
        monkeypatch.setattr(router, "_wake", self.wake)
        router.views.clear()
        router.balancers.clear()
        router._tokens.clear()
        monkeypatch.setattr(router, "_recorder", None)

    # The subprocess form.
    def save(self, path: Path) -> None:
        data = {
            "endpoints": {name: asdict(view) for name, view in self.endpoints.items()},
            "tokens": self.tokens,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


def from_file(path: str) -> ServingDouble:
    data = json.loads(Path(path).read_text())
    double = ServingDouble(tokens=data.get("tokens", {}))
    for name, raw in data.get("endpoints", {}).items():
        routes = [RouteTarget(**r) for r in raw.pop("routes")]
        double.endpoints[name] = RouterView(**raw, routes=routes)
    return double


# --------------------------------------------------------------------------- the transport


async def loopback_tunnel(target: Any) -> Any:
    """``tunnels.open_tunnel`` for upstreams on this machine: 127.0.0.1:<target port>."""
    from agent.protocol import TUNNEL_FAILED
    from proxy_app.tunnels import Tunnel

    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", target.app.port)
    except OSError:

        async def refused() -> dict[str, Any]:
            return {"type": "websocket.disconnect", "code": TUNNEL_FAILED}

        async def ignore(_event: dict[str, Any]) -> None:
            return None

        return Tunnel(refused, ignore)

    async def receive() -> dict[str, Any]:
        data = await reader.read(64 * 1024)
        if not data:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "bytes": data}

    async def send(event: dict[str, Any]) -> None:
        if event["type"] == "websocket.send":
            writer.write(event["bytes"])
            await writer.drain()
        elif event["type"] == "websocket.close":
            writer.close()

    return Tunnel(receive, send)
