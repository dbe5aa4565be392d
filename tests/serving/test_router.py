"""The inference router (proxy_app/router.py) in this process, against real HTTP servers.

The endpoints, routes and tokens are real rows (``Endpoint``, ``Route`` to a RUNNING session's
main kernel, ``EndpointToken``), read through serving_app's real selectors, and a request to an
endpoint scaled to zero wakes it through ``serving_app.services.wake``. The replicas are real
HTTP/1.1 servers on loopback (python's threaded http.server), reached by a tunnel straight to
their port (``loopback_tunnel``, keyed by the replica's kernel id) instead of through an agent;
the path through a real agent to real model containers is tests/docker/test_serving.py's.

Personas: ``alice`` owns the endpoints; a caller is whoever holds (or lacks) a token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connections

from proxy_app import router, tunnels
from proxy_app.app import application
from serving_app import metrics
from serving_app.models import Endpoint, EndpointEvent, Route, RouteStatus
from sessions_app.models import Kernel, Session, Status

pytestmark = pytest.mark.django_db(transaction=True)

HOST = b"apps.localhost:8001"


class Replica:
    """A real HTTP server on 127.0.0.1: answers who it is, and can be slow, fail or stream."""

    def __init__(
        self, name: str, *, status: int = 200, cors: bool = False, cookies: tuple[str, ...] = ()
    ) -> None:
        self.name, self.status, self.cors, self.cookies = name, status, cors, cookies
        self.hits: Counter[str] = Counter()
        self.gate = threading.Event()  # the SSE stream's second event waits for it
        self.release = threading.Event()  # /hold waits for it
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go in separate writes

            def log_message(self, *_args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if replica.cors:  # a model server that lets everyone in, with cookies
                    self.send_header("Access-Control-Allow-Origin", "*")
                    self.send_header("Access-Control-Allow-Credentials", "true")
                for cookie in replica.cookies:
                    self.send_header("Set-Cookie", cookie)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                replica.hits[self.command] += 1
                if self.path == "/sse":
                    self._sse()
                    return
                if self.path == "/hold":
                    replica.release.wait(10)
                self._answer(
                    replica.status,
                    {
                        "replica": replica.name,
                        "method": self.command,
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "prefix": self.headers.get("X-Forwarded-Prefix"),
                        "body": body.decode(),
                    },
                )

            def _sse(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, event in enumerate((b"data: one\n\n", b"data: two\n\n")):
                    if i:
                        replica.gate.wait(10)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas():
    made: list[Replica] = []

    def make(name: str, **kw: Any) -> Replica:
        made.append(Replica(name, **kw))
        return made[-1]

    yield make
    for replica in made:
        replica.stop()


class Serving:
    """Endpoints as rows: each replica a RUNNING session whose main kernel a loopback
    tunnel maps to a local port, and a HEALTHY route to it."""

    def __init__(self, owner, image, group, agent) -> None:
        self.owner, self.image, self.group, self.agent = owner, image, group, agent
        self.ports: dict[str, int] = {}  # kernel id -> 127.0.0.1 port

    def _replica(self, endpoint: Endpoint, port: int, ratio: float, route: Route | None) -> Route:
        if route is None:
            route = Route.objects.create(endpoint=endpoint, traffic_ratio=ratio)
        session = Session.objects.create(
            owner=self.owner,
            name=f"serve-{route.pk}-{endpoint.name}",
            session_type="inference",
            image=self.image,
            resource_group=self.group,
            status=Status.RUNNING,
        )
        kernel = Kernel.objects.create(
            id=session.pk,
            session=session,
            cluster_role="main",
            cluster_idx=1,
            local_rank=0,
            cluster_hostname="main1",
            image=self.image.reference,
            agent=self.agent,
            status=Status.RUNNING,
        )
        self.ports[str(kernel.pk)] = port
        Route.objects.filter(pk=route.pk).update(session=session)
        route.refresh_from_db()
        route.transition(RouteStatus.HEALTHY)
        return route

    def _endpoint(self, name: str, *replicas: int | tuple[int, float], **fields: Any) -> Endpoint:
        wanted = fields.pop("replicas", len(replicas))
        endpoint = Endpoint.objects.create(
            owner=self.owner,
            name=name,
            image=self.image,
            resource_group=self.group,
            replicas=wanted,
            **{
                "status": "READY" if replicas else "PROVISIONING",
                "open_to_public": True,
                "start_command": "python3 -m http.server 8000",
                **fields,
            },
        )
        for replica in replicas:
            port, ratio = replica if isinstance(replica, tuple) else (replica, 1.0)
            self._replica(endpoint, port, ratio, None)
        return endpoint

    async def endpoint(self, name: str, *replicas: int | tuple[int, float], **fields: Any):
        """An endpoint with a HEALTHY route per replica (a loopback port, or (port, ratio))."""
        return await sync_to_async(self._endpoint)(name, *replicas, **fields)

    async def token(self, endpoint: Endpoint) -> str:
        from serving_app.services import token_create

        return (await sync_to_async(token_create)(endpoint=endpoint, user=self.owner))[1]

    async def route_ids(self, endpoint: Endpoint) -> list[int]:
        qs = Route.objects.filter(endpoint=endpoint).order_by("id").values_list("pk", flat=True)
        return await sync_to_async(list)(qs)

    def turn_healthy(self, endpoint: Endpoint, port: int) -> Route:
        """What health checks do for a new replica (the reconciler's route), on ``port``."""
        route = Route.objects.get(endpoint=endpoint, status=RouteStatus.PROVISIONING)
        Session.objects.filter(pk=route.session_id).update(status=Status.RUNNING)
        Kernel.objects.filter(session=route.session_id).update(
            status=Status.RUNNING, agent=self.agent
        )
        self.ports[str(route.session_id)] = port  # main1's kernel id is the session's
        route.transition(RouteStatus.HEALTHY)
        return route


async def loopback_tunnel(target: Any) -> Any:
    """``tunnels.open_tunnel`` for replicas on this machine: 127.0.0.1:<the kernel's port>."""
    from agent.protocol import TUNNEL_FAILED

    port = serving_ports.get(str(target.kernel_id), target.app.port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:

        async def refused() -> dict[str, Any]:
            return {"type": "websocket.disconnect", "code": TUNNEL_FAILED}

        async def ignore(_event: dict[str, Any]) -> None:
            return None

        return tunnels.Tunnel(refused, ignore)

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

    return tunnels.Tunnel(receive, send)


serving_ports: dict[str, int] = {}


@pytest.fixture
def serving(monkeypatch, settings, alice, image, group, agent):
    """Endpoint rows of alice's; the router's caches empty; tunnels straight to loopback."""
    made = Serving(alice, image, group, agent)
    serving_ports.clear()
    made.ports = serving_ports
    router.views.clear()
    router.balancers.clear()
    router._tokens.clear()
    monkeypatch.setattr(router, "_recorder", None)
    monkeypatch.setattr(tunnels, "open_tunnel", loopback_tunnel)
    settings.BAI_SERVE_COLD_START_TIMEOUT = 5.0
    yield made
    tunnels.pool._idle.clear()  # loopback tunnels of this test's loop, gone with it
    # The ORM ran in sync_to_async's one thread: its connection must not outlive the test.
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


def closed_port() -> int:
    from tests.live import free_port

    return free_port()  # nothing listens there once the probe socket is closed


async def call(
    method: str,
    path: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    events: asyncio.Queue[dict[str, Any]] | None = None,
    gone: asyncio.Event | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request to the apps proxy's ASGI application; (status, headers, body).

    The caller stays until ``gone`` is set (never, without it), then disconnects."""
    raw, _, query = path.partition("?")
    scope = {
        "type": "http",
        "method": method,
        "path": raw,
        "raw_path": raw.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"host", HOST),
            *([(b"content-length", str(len(body)).encode())] if body else []),
            *(headers or []),
        ],
        "client": ("127.0.0.1", 40000),
        "scheme": "http",
        "http_version": "1.1",
    }
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)
        if events is not None:
            await events.put(event)

    await application(scope, receive, send)
    start = sent[0]
    return (
        start["status"],
        dict(start["headers"]),
        b"".join(e.get("body", b"") for e in sent[1:]),
    )


async def settled() -> None:
    """The router's metrics are in Redis."""
    await router._metrics().flush()


# --------------------------------------------------------------------------- tests


async def test_a_public_endpoint_answers_from_its_replica_below_the_endpoint_path(
    serving, replicas
) -> None:
    a = replicas("a")
    await serving.endpoint("iris", a.port)
    status, headers, body = await call(
        "POST",
        "/serve/iris/predict?x=1",
        headers=[(b"authorization", b"Bearer whatever")],
        body=b'{"instances": []}',
    )
    answer = json.loads(body)
    assert status == 200, body
    assert answer["replica"] == "a" and answer["method"] == "POST"
    assert answer["path"] == "/predict?x=1"
    assert answer["body"] == '{"instances": []}'
    assert answer["authorization"] is None, "the caller's token never reaches the replica"
    assert answer["prefix"] == "/serve/iris"


async def test_a_replicas_cookies_stay_on_the_bare_apps_host(serving, replicas) -> None:
    """The router's host is every app's parent: a replica's cookie for it, or for the
    manager's host above, would reach every user's apps or the manager, and is dropped."""
    a = replicas(
        "a",
        cookies=(
            "kept=1; Path=/serve/iris/; HttpOnly",
            "parent=1; Domain=apps.localhost; Path=/",
            "manager=1; Domain=localhost",
            "own=1; Domain=.apps.localhost",
        ),
    )
    await serving.endpoint("iris", a.port)
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    status, _, _ = await call("GET", "/serve/iris/x", events=events)
    assert status == 200
    start = await events.get()
    cookies = [v for k, v in start["headers"] if k == b"set-cookie"]
    assert cookies == [b"kept=1; Path=/serve/iris/; HttpOnly"]


async def test_unknown_endpoints_and_bare_names_are_answered_in_json(serving) -> None:
    status, headers, body = await call("GET", "/serve/nope/x")
    assert status == 404 and json.loads(body) == {"message": "no endpoint 'nope'"}
    assert headers[b"content-type"] == b"application/json"
    status, headers, _ = await call("GET", "/serve/nope")
    assert status == 308 and headers[b"location"] == b"/serve/nope/"


async def test_a_private_endpoint_takes_its_own_token_only(serving, replicas) -> None:
    a = replicas("a")
    private = await serving.endpoint("private", a.port, open_to_public=False)
    other = await serving.endpoint("other", a.port, open_to_public=False)
    tok_private, tok_other = await serving.token(private), await serving.token(other)

    status, headers, body = await call("GET", "/serve/private/x")
    assert status == 401 and b"Bearer" in json.loads(body)["message"].encode()
    assert headers[b"www-authenticate"].startswith(b"Bearer")
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", f"Token {tok_private}".encode())]
    )
    assert status == 401
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", f"Bearer {tok_other}".encode())]
    )
    assert status == 403 and json.loads(body) == {
        "message": "this token does not open this endpoint"
    }
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", f"Bearer {tok_private}".encode())]
    )
    assert status == 200 and json.loads(body)["replica"] == "a"
    assert a.hits["GET"] == 1, "refused callers never reached the replica"


async def test_sequential_requests_alternate_over_equal_routes(
    serving, replicas, monkeypatch
) -> None:
    a, b = replicas("a"), replicas("b")
    fetched: list[str] = []
    real_view = router._router_view
    monkeypatch.setattr(
        router, "_router_view", lambda name: fetched.append(name) or real_view(name)
    )
    await serving.endpoint("iris", a.port, b.port)
    seen = Counter()
    for _ in range(40):
        status, _, body = await call("GET", "/serve/iris/whoami")
        assert status == 200
        seen[json.loads(body)["replica"]] += 1
    assert seen == {"a": 20, "b": 20}
    assert fetched == ["iris"], "the view is cached (<= 1 s) and fetched once"


async def test_traffic_ratios_share_sequential_traffic_in_proportion(serving, replicas) -> None:
    a, b = replicas("a"), replicas("b")
    await serving.endpoint("iris", (a.port, 1.0), (b.port, 0.25))
    seen = Counter()
    for _ in range(50):
        _, _, body = await call("GET", "/serve/iris/whoami")
        seen[json.loads(body)["replica"]] += 1
    assert seen == {"a": 40, "b": 10}


async def test_a_busy_route_is_passed_over_for_one_with_fewer_outstanding_requests(
    serving, replicas
) -> None:
    a, b = replicas("a"), replicas("b")
    await serving.endpoint("iris", a.port, b.port)
    held = asyncio.create_task(call("GET", "/serve/iris/hold"))  # takes a: first in turn
    while a.hits["GET"] + b.hits["GET"] == 0:
        await asyncio.sleep(0.01)
    assert a.hits["GET"] == 1
    seen = Counter()
    for _ in range(5):  # a still holds one: everything goes to b
        _, _, body = await call("GET", "/serve/iris/whoami")
        seen[json.loads(body)["replica"]] += 1
    assert seen == {"b": 5}
    a.release.set()
    status, _, body = await held
    assert status == 200 and json.loads(body)["replica"] == "a"


async def test_concurrent_requests_spread_evenly(serving, replicas) -> None:
    a, b = replicas("a"), replicas("b")
    await serving.endpoint("iris", a.port, b.port)
    answers = await asyncio.gather(*(call("GET", "/serve/iris/whoami") for _ in range(60)))
    seen = Counter(json.loads(body)["replica"] for _, _, body in answers)
    assert all(status == 200 for status, _, _ in answers)
    assert 24 <= seen["a"] <= 36 and 24 <= seen["b"] <= 36, seen


async def test_an_idempotent_request_to_an_unreachable_replica_goes_to_another(
    serving, replicas
) -> None:
    b = replicas("b")
    await serving.endpoint("iris", closed_port(), b.port)
    for method in ("GET", "PUT", "DELETE", "GET"):
        status, _, body = await call(method, "/serve/iris/x", body=b"same body")
        assert status == 200, body
        assert json.loads(body)["replica"] == "b" and json.loads(body)["body"] == "same body"
    # POST is not idempotent: when it lands on the dead replica, the caller hears so.
    outcomes = Counter()
    for _ in range(4):
        status, _, body = await call("POST", "/serve/iris/predict", body=b"{}")
        outcomes[status] += 1
        if status == 502:
            assert "could not answer" in json.loads(body)["message"]
    assert outcomes == {200: 2, 502: 2}
    assert b.hits["POST"] == 2


async def test_a_503_from_a_replica_is_retried_for_get_and_passed_on_for_post(
    serving, replicas
) -> None:
    sick, well = replicas("sick", status=503), replicas("well")
    await serving.endpoint("iris", sick.port, well.port)
    for _ in range(4):
        status, _, body = await call("GET", "/serve/iris/whoami")
        assert status == 200 and json.loads(body)["replica"] == "well"
    assert sick.hits["GET"] == 2, "the sick replica was tried, once in two"
    statuses = Counter()
    for _ in range(4):
        status, _, body = await call("POST", "/serve/iris/predict")
        statuses[(status, json.loads(body)["replica"])] += 1
    assert statuses == {(503, "sick"): 2, (200, "well"): 2}


async def test_a_single_replica_that_fails_is_not_retried_on_itself(serving, replicas) -> None:
    sick = replicas("sick", status=503)
    await serving.endpoint("iris", sick.port)
    status, _, body = await call("GET", "/serve/iris/whoami")
    assert status == 503 and json.loads(body)["replica"] == "sick"
    assert sick.hits["GET"] == 1


async def test_no_healthy_replica_is_a_503_that_says_why(serving) -> None:
    await serving.endpoint(
        "broken",
        status="DEGRADED",
        status_reason="the replica failed to start 3 times: image not found",
        replicas=2,
    )
    status, _, body = await call("GET", "/serve/broken/predict")
    assert status == 503
    assert json.loads(body) == {
        "message": "endpoint 'broken' has no healthy replica: degraded: "
        "the replica failed to start 3 times: image not found"
    }
    assert await Endpoint.objects.aget(name="broken") is not None
    assert not await EndpointEvent.objects.filter(kind="scale").aexists(), "nothing woke it"


async def test_a_request_to_an_endpoint_scaled_to_zero_wakes_it_and_is_held_until_healthy(
    serving, replicas
) -> None:
    a = replicas("a")
    endpoint = await serving.endpoint(
        "sleepy", status="SCALED_TO_ZERO", replicas=0, min_replicas=0, max_replicas=2
    )
    woken = threading.Event()

    def health_checks() -> None:
        # What the reconciler's health checks do a moment after wake() has asked for a
        # replica (and the reconciler, run by wake after commit, has made its route).
        from django.db import connection

        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if Route.objects.filter(endpoint=endpoint, status="PROVISIONING").exists():
                    woken.set()
                    time.sleep(0.6)
                    serving.turn_healthy(endpoint, a.port)
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    checker = threading.Thread(target=health_checks, daemon=True)
    checker.start()
    t0 = time.monotonic()
    first, second = await asyncio.gather(
        call("GET", "/serve/sleepy/whoami"), call("GET", "/serve/sleepy/whoami")
    )
    held = time.monotonic() - t0
    checker.join(5)
    assert woken.is_set(), "wake() made the reconciler ask for a replica"
    assert first[0] == 200 and second[0] == 200, (first, second)
    assert json.loads(first[2])["replica"] == "a"
    assert 0.5 < held < 4, held
    await endpoint.arefresh_from_db()
    assert endpoint.replicas == 1
    messages = [e.message async for e in EndpointEvent.objects.filter(endpoint=endpoint)]
    assert "scaled 0 → 1: a request arrived while scaled to zero" in messages, messages


async def test_a_held_request_gives_up_after_the_cold_start_timeout(serving, settings) -> None:
    settings.BAI_SERVE_COLD_START_TIMEOUT = 0.5
    endpoint = await serving.endpoint("sleepy", status="SCALED_TO_ZERO", replicas=0)
    t0 = time.monotonic()
    status, _, body = await call("GET", "/serve/sleepy/whoami")
    assert status == 503 and 0.4 < time.monotonic() - t0 < 4
    # Woken: a replica is wanted and starting, but none turned healthy in time.
    assert json.loads(body) == {
        "message": "endpoint 'sleepy' has no healthy replica: its replicas are still starting "
        "(provisioning); none became healthy within 0.5 s"
    }
    await endpoint.arefresh_from_db()
    assert endpoint.replicas == 1 and endpoint.status == "PROVISIONING"


async def test_server_sent_events_reach_the_caller_one_by_one(serving, replicas) -> None:
    a = replicas("a")
    await serving.endpoint("llm", a.port)
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    request = asyncio.create_task(call("GET", "/serve/llm/sse", events=events))
    start = await asyncio.wait_for(events.get(), 5)
    assert start["status"] == 200
    assert dict(start["headers"])[b"content-type"] == b"text/event-stream"
    first = await asyncio.wait_for(events.get(), 5)
    # The replica holds its second event until the first has reached the caller.
    assert first["body"] == b"data: one\n\n" and first["more_body"]
    assert not request.done()
    a.gate.set()
    second = await asyncio.wait_for(events.get(), 5)
    assert second["body"] == b"data: two\n\n"
    status, _, body = await request
    assert body == b"data: one\n\ndata: two\n\n"


async def test_a_caller_that_leaves_mid_stream_ends_its_request_and_its_tunnel(
    serving, replicas
) -> None:
    a = replicas("a")
    await serving.endpoint("llm", a.port)
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    gone = asyncio.Event()
    request = asyncio.create_task(call("GET", "/serve/llm/sse", events=events, gone=gone))
    await asyncio.wait_for(events.get(), 5)  # the answer's start
    await asyncio.wait_for(events.get(), 5)  # its first event; the second never comes
    gone.set()
    await asyncio.wait_for(request, 5)  # not held until the replica ends its stream
    assert not any(tunnels.pool._idle.values())  # its tunnel closed, never kept for another
    a.gate.set()


async def test_requests_are_recorded_per_route_in_the_metrics(serving, replicas) -> None:
    a, sick = replicas("a"), replicas("sick", status=500)
    endpoint = await serving.endpoint("measured", a.port, sick.port)
    first, second = await serving.route_ids(endpoint)
    endpoint_id = str(endpoint.pk)
    for _ in range(6):
        await call("POST", "/serve/measured/predict")
    await settled()
    snap = await asyncio.to_thread(metrics.snapshot, endpoint_id, window_s=5, now=time.time() + 1)
    assert snap["routes"][first]["rps"] == pytest.approx(3 / 5)
    assert snap["routes"][first]["errors"] == 0 and snap["routes"][second]["errors"] == 3
    assert snap["routes"][first]["p50_ms"] is not None
    assert snap["inflight"] == 0

    held = asyncio.create_task(call("GET", "/serve/measured/hold"))
    while not a.hits["GET"]:
        await asyncio.sleep(0.01)
    await settled()
    snap = await asyncio.to_thread(metrics.snapshot, endpoint_id)
    assert snap["inflight"] == 1 and snap["routes"][first]["inflight"] == 1
    a.release.set()
    await held
    await settled()
    assert (await asyncio.to_thread(metrics.snapshot, endpoint_id))["inflight"] == 0


async def test_the_apps_own_hosts_are_not_the_router(serving, replicas) -> None:
    a = replicas("a")
    await serving.endpoint("iris", a.port)
    scope_host = b"0123456789abcdef0123456789abcdef-jupyter.apps.localhost:8001"
    global HOST
    saved, HOST = HOST, scope_host
    try:
        status, headers, _ = await call("GET", "/serve/iris/whoami")
    finally:
        HOST = saved
    assert status == 403 and headers[b"content-type"].startswith(b"text/html")


MANAGER = "http://127.0.0.1:8000"


async def test_the_managers_origin_gets_a_preflight_answer_without_a_token(
    serving, replicas, settings
) -> None:
    settings.BAI_MANAGER_ORIGIN = [MANAGER]
    a = replicas("a")
    await serving.endpoint("iris", a.port, open_to_public=False)
    status, headers, _ = await call(
        "OPTIONS",
        "/serve/iris/predict",
        headers=[
            (b"origin", MANAGER.encode()),
            (b"access-control-request-method", b"POST"),
            (b"access-control-request-headers", b"authorization,content-type"),
        ],
    )
    assert status == 204
    assert headers[b"access-control-allow-origin"] == MANAGER.encode()
    assert b"POST" in headers[b"access-control-allow-methods"]
    allowed = {h.strip() for h in headers[b"access-control-allow-headers"].split(b",")}
    assert {b"authorization", b"content-type"} <= allowed
    assert b"access-control-allow-credentials" not in headers
    assert headers[b"vary"] == b"Origin"
    assert a.hits["OPTIONS"] == 0, "a preflight never reaches a replica"


@pytest.mark.parametrize(
    ("origin", "asked"),
    [
        (b"http://evil.example", b"authorization"),
        (b"http://apps.localhost:8001", b"authorization"),  # the apps' own origin is not it
        (MANAGER.encode(), b"authorization, x-api-key"),  # headers the box never sends
    ],
)
async def test_other_origins_and_headers_are_refused_at_preflight(
    serving, replicas, settings, origin, asked
) -> None:
    settings.BAI_MANAGER_ORIGIN = [MANAGER]
    await serving.endpoint("iris", replicas("a").port)
    status, headers, body = await call(
        "OPTIONS",
        "/serve/iris/predict",
        headers=[
            (b"origin", origin),
            (b"access-control-request-method", b"POST"),
            (b"access-control-request-headers", asked),
        ],
    )
    assert status == 403 and json.loads(body)["message"].startswith("CORS preflight refused")
    assert b"access-control-allow-origin" not in headers


async def test_answers_to_the_managers_origin_carry_its_origin_and_never_credentials(
    serving, replicas, settings
) -> None:
    settings.BAI_MANAGER_ORIGIN = [MANAGER]
    a = replicas("a", cors=True)
    endpoint = await serving.endpoint("iris", a.port, open_to_public=False)
    token = await serving.token(endpoint)
    from_page = [(b"origin", MANAGER.encode()), (b"content-type", b"application/json")]

    status, headers, body = await call(
        "POST",
        "/serve/iris/predict",
        headers=[*from_page, (b"authorization", f"Bearer {token}".encode())],
        body=b"{}",
    )
    assert status == 200 and json.loads(body)["replica"] == "a"
    assert headers[b"access-control-allow-origin"] == MANAGER.encode()
    assert b"access-control-allow-credentials" not in headers, "the replica's is dropped"

    # The page reads why it was refused, too.
    status, headers, body = await call("POST", "/serve/iris/predict", headers=from_page)
    assert status == 401 and headers[b"access-control-allow-origin"] == MANAGER.encode()

    # Any other origin gets no CORS header at all, not even the replica's "*".
    status, raw_headers, _ = await call(
        "POST",
        "/serve/iris/predict",
        headers=[
            (b"origin", b"http://evil.example"),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        body=b"{}",
    )
    assert status == 200
    assert not any(k.startswith(b"access-control-") for k in raw_headers)


async def test_a_tunnel_whose_agent_is_gone_drops_writes_and_still_ends_its_websocket() -> None:
    # The apps proxy's server raises OSError on a send to a websocket whose peer left.
    async def gone_send(_event: dict[str, Any]) -> None:
        raise OSError("the agent's connection is gone")

    async def gone_receive() -> dict[str, Any]:
        return {"type": "websocket.disconnect", "code": 1006}

    tunnel = tunnels.Tunnel(gone_receive, gone_send)
    await tunnel.write(b"GET / HTTP/1.1\r\n\r\n")  # dropped, not raised
    assert await tunnel.read() is None  # the read tells it closed
    fresh = tunnels.Tunnel(gone_receive, gone_send)
    await fresh.close()
    assert fresh.finished.is_set()  # serve_agent_end's task ends: nothing waits for ever
