"""The inference router (proxy_app/router.py) in this process, against real HTTP servers.

The replicas are real HTTP/1.1 servers on loopback (python's threaded http.server), reached by a
tunnel straight to their port (``tests.serving_double.loopback_tunnel``) instead of through an
agent; serving_app's side (the endpoint's view, tokens, wake) is the double of
``tests/serving_double.py``, installed by the ``serving`` fixture. The path through a real agent
to real model containers is tests/docker/test_serve_router.py's.

Personas: none; a caller is whoever holds (or lacks) an endpoint's token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from proxy_app import router, tunnels
from proxy_app.app import application
from serving_app import metrics
from tests.serving_double import ServingDouble, loopback_tunnel, route

HOST = b"apps.localhost:8001"


class Replica:
    """A real HTTP server on 127.0.0.1: answers who it is, and can be slow, fail or stream."""

    def __init__(self, name: str, *, status: int = 200) -> None:
        self.name, self.status = name, status
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


@pytest.fixture
def serving(monkeypatch, settings):
    """serving_app's side of the contract as plain data; tunnels go straight to loopback."""
    double = ServingDouble()
    double.install(monkeypatch)
    monkeypatch.setattr(tunnels, "open_tunnel", loopback_tunnel)
    settings.BAI_SERVE_COLD_START_TIMEOUT = 5.0
    yield double
    tunnels.pool._idle.clear()  # loopback tunnels of this test's loop, gone with it


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
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request to the apps proxy's ASGI application; (status, headers, body)."""
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
        await asyncio.Event().wait()  # the caller never goes away
        raise AssertionError  # pragma: no cover

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
    serving.endpoint("iris", route(1, a.port))
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


async def test_unknown_endpoints_and_bare_names_are_answered_in_json(serving) -> None:
    status, headers, body = await call("GET", "/serve/nope/x")
    assert status == 404 and json.loads(body) == {"message": "no endpoint 'nope'"}
    assert headers[b"content-type"] == b"application/json"
    status, headers, _ = await call("GET", "/serve/nope")
    assert status == 308 and headers[b"location"] == b"/serve/nope/"


async def test_a_private_endpoint_takes_its_own_token_only(serving, replicas) -> None:
    a = replicas("a")
    private = serving.endpoint("private", route(1, a.port), public=False)
    other = serving.endpoint("other", route(2, a.port), public=False)
    serving.tokens = {private.endpoint_id: ["tok-private"], other.endpoint_id: ["tok-other"]}

    status, headers, body = await call("GET", "/serve/private/x")
    assert status == 401 and b"Bearer" in json.loads(body)["message"].encode()
    assert headers[b"www-authenticate"].startswith(b"Bearer")
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", b"Token tok-private")]
    )
    assert status == 401
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", b"Bearer tok-other")]
    )
    assert status == 403 and json.loads(body) == {
        "message": "this token does not open this endpoint"
    }
    status, _, body = await call(
        "GET", "/serve/private/x", headers=[(b"authorization", b"Bearer tok-private")]
    )
    assert status == 200 and json.loads(body)["replica"] == "a"
    assert a.hits["GET"] == 1, "refused callers never reached the replica"


async def test_sequential_requests_alternate_over_equal_routes(serving, replicas) -> None:
    a, b = replicas("a"), replicas("b")
    serving.endpoint("iris", route(1, a.port), route(2, b.port))
    seen = Counter()
    for _ in range(40):
        status, _, body = await call("GET", "/serve/iris/whoami")
        assert status == 200
        seen[json.loads(body)["replica"]] += 1
    assert seen == {"a": 20, "b": 20}
    assert serving.view_calls == 1, "the view is cached (<= 1 s) and fetched once"


async def test_traffic_ratios_share_sequential_traffic_in_proportion(serving, replicas) -> None:
    a, b = replicas("a"), replicas("b")
    serving.endpoint("iris", route(1, a.port, ratio=1.0), route(2, b.port, ratio=0.25))
    seen = Counter()
    for _ in range(50):
        _, _, body = await call("GET", "/serve/iris/whoami")
        seen[json.loads(body)["replica"]] += 1
    assert seen == {"a": 40, "b": 10}


async def test_a_busy_route_is_passed_over_for_one_with_fewer_outstanding_requests(
    serving, replicas
) -> None:
    a, b = replicas("a"), replicas("b")
    serving.endpoint("iris", route(1, a.port), route(2, b.port))
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
    serving.endpoint("iris", route(1, a.port), route(2, b.port))
    answers = await asyncio.gather(*(call("GET", "/serve/iris/whoami") for _ in range(60)))
    seen = Counter(json.loads(body)["replica"] for _, _, body in answers)
    assert all(status == 200 for status, _, _ in answers)
    assert 24 <= seen["a"] <= 36 and 24 <= seen["b"] <= 36, seen


async def test_an_idempotent_request_to_an_unreachable_replica_goes_to_another(
    serving, replicas
) -> None:
    b = replicas("b")
    serving.endpoint("iris", route(1, closed_port()), route(2, b.port))
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
    serving.endpoint("iris", route(1, sick.port), route(2, well.port))
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
    serving.endpoint("iris", route(1, sick.port))
    status, _, body = await call("GET", "/serve/iris/whoami")
    assert status == 503 and json.loads(body)["replica"] == "sick"
    assert sick.hits["GET"] == 1


async def test_no_healthy_replica_is_a_503_that_says_why(serving) -> None:
    serving.endpoint(
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
    assert serving.wakes == []


async def test_a_request_to_an_endpoint_scaled_to_zero_wakes_it_and_is_held_until_healthy(
    serving, replicas
) -> None:
    a = replicas("a")
    view = serving.endpoint("sleepy", status="SCALED_TO_ZERO", replicas=0)

    def wake(woken) -> None:  # the reconciler's part: a replica turns HEALTHY a moment later
        def healthy() -> None:
            time.sleep(0.6)
            woken.routes = [route(1, a.port)]
            woken.replicas, woken.status = 1, "READY"

        threading.Thread(target=healthy, daemon=True).start()

    serving.on_wake = wake
    t0 = time.monotonic()
    first, second = await asyncio.gather(
        call("GET", "/serve/sleepy/whoami"), call("GET", "/serve/sleepy/whoami")
    )
    held = time.monotonic() - t0
    assert first[0] == 200 and second[0] == 200, (first, second)
    assert 0.5 < held < 3, held
    assert serving.wakes[0] == (view.endpoint_id, "a request arrived while scaled to zero")


async def test_a_held_request_gives_up_after_the_cold_start_timeout(serving, settings) -> None:
    settings.BAI_SERVE_COLD_START_TIMEOUT = 0.5
    serving.endpoint("sleepy", status="SCALED_TO_ZERO", replicas=0)
    t0 = time.monotonic()
    status, _, body = await call("GET", "/serve/sleepy/whoami")
    assert status == 503 and 0.4 < time.monotonic() - t0 < 2
    assert json.loads(body) == {
        "message": "endpoint 'sleepy' has no healthy replica: scaled to zero; "
        "none became healthy within 0.5 s"
    }
    assert len(serving.wakes) == 1


async def test_server_sent_events_reach_the_caller_one_by_one(serving, replicas) -> None:
    a = replicas("a")
    serving.endpoint("llm", route(1, a.port))
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


async def test_requests_are_recorded_per_route_in_the_metrics(serving, replicas) -> None:
    a, sick = replicas("a"), replicas("sick", status=500)
    view = serving.endpoint(
        "measured", route(1, a.port), route(2, sick.port), endpoint_id=str(uuid.uuid4())
    )
    for _ in range(6):
        await call("POST", "/serve/measured/predict")
    await settled()
    snap = await asyncio.to_thread(
        metrics.snapshot, view.endpoint_id, window_s=5, now=time.time() + 1
    )
    assert snap["routes"][1]["rps"] == pytest.approx(3 / 5)
    assert snap["routes"][1]["errors"] == 0 and snap["routes"][2]["errors"] == 3
    assert snap["routes"][1]["p50_ms"] is not None
    assert snap["inflight"] == 0

    held = asyncio.create_task(call("GET", "/serve/measured/hold"))
    while not a.hits["GET"]:
        await asyncio.sleep(0.01)
    await settled()
    snap = await asyncio.to_thread(metrics.snapshot, view.endpoint_id)
    assert snap["inflight"] == 1 and snap["routes"][1]["inflight"] == 1
    a.release.set()
    await held
    await settled()
    assert (await asyncio.to_thread(metrics.snapshot, view.endpoint_id))["inflight"] == 0


async def test_the_apps_own_hosts_are_not_the_router(serving, replicas) -> None:
    a = replicas("a")
    serving.endpoint("iris", route(1, a.port))
    scope_host = b"0123456789abcdef0123456789abcdef-jupyter.apps.localhost:8001"
    global HOST
    saved, HOST = HOST, scope_host
    try:
        status, headers, _ = await call("GET", "/serve/iris/whoami")
    finally:
        HOST = saved
    assert status == 403 and headers[b"content-type"].startswith(b"text/html")
