"""The inference router against the same replica called directly, in the same run.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/serve.py [--requests 2000] [--clients 16]

Starts daphne, the apps proxy and a Docker agent on loopback (bench/streams.py's stack),
launches one replica session of ``bai-kernel/sklearn-serve:1`` (uvicorn serving the iris
classifier) and measures ``POST /predict`` (one instance) with a bounded load generator in
this process (asyncio, kept-alive HTTP/1.1 connections, h11):

1. through the router (``/serve/<endpoint>/predict`` on the apps origin, a bearer token,
   the agent's tunnel) and directly (the container's bridge address), one caller at a time:
   latency p50 and p99 (target: at most 3 ms added to p50);
2. the same with ``--clients`` concurrent callers for a fixed number of requests:
   requests/s (target: at least 70 % of direct);
3. the time from an autoscaling threshold being crossed to the new replica serving
   (target: within 10 s) -- PLACEHOLDER, needs core's reconciler (see ``scale_up_time``);
4. the cold start from zero: the first request to an endpoint scaled to zero, until it is
   answered (target: within 5 s) -- PLACEHOLDER, needs core's reconciler (``cold_start_time``).

Until core's serving_app lands, the router's view of the endpoint (its one HEALTHY route, its
token) comes from tests/serving_double.py, served by ``tests.serving_double_asgi`` in the proxy
process (``bench_endpoint``); after the merge, ``bench_endpoint`` creates a real Endpoint and
the proxy is ``proxy_app.asgi:application``. Everything else is the real path.

Not part of the test run. Prints the figures, the ratios and the conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

import h11  # noqa: E402
import streams  # noqa: E402
from streams import Stack, launch, pct  # noqa: E402

BODY = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]}).encode()
TOKEN = "bench-endpoint-token"  # noqa: S105  (the double's token; a real one after the merge)


class Client:
    """One kept-alive HTTP/1.1 connection (h11 over asyncio streams)."""

    def __init__(self, addr: str, port: int, host: str, headers: list[tuple[str, str]]):
        self.addr, self.port, self.host, self.headers = addr, port, host, headers

    async def open(self) -> Client:
        self.reader, self.writer = await asyncio.open_connection(self.addr, self.port)
        self.conn = h11.Connection(h11.CLIENT)
        return self

    async def post(self, path: str) -> float:
        """Seconds for one POST and its whole answer (which must be 200)."""
        t0 = time.perf_counter()
        headers = [
            ("host", self.host),
            ("content-type", "application/json"),
            ("content-length", str(len(BODY))),
            *self.headers,
        ]
        self.writer.write(
            self.conn.send(h11.Request(method="POST", target=path, headers=headers))
            + self.conn.send(h11.Data(data=BODY))
            + self.conn.send(h11.EndOfMessage())
        )
        status = 0
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self.conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
        elapsed = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"{path} answered {status}")
        self.conn.start_next_cycle()
        return elapsed

    def close(self) -> None:
        self.writer.close()


class Target:
    def __init__(self, name: str, addr: str, port: int, host: str, path: str, headers=()):
        self.name, self.addr, self.port, self.host = name, addr, port, host
        self.path, self.headers = path, list(headers)

    async def client(self) -> Client:
        return await Client(self.addr, self.port, self.host, self.headers).open()


async def latency(target: Target, n: int) -> list[float]:
    client = await target.client()
    for _ in range(50):  # warm: the kept tunnel, uvicorn's first requests
        await client.post(target.path)
    times = [await client.post(target.path) * 1000 for _ in range(n)]
    client.close()
    return times


async def throughput(target: Target, clients: int, total: int) -> float:
    """Requests/s of ``clients`` callers sharing ``total`` requests (bounded: no open loop)."""
    conns = [await target.client() for _ in range(clients)]
    for conn in conns:
        await conn.post(target.path)
    left = total

    async def caller(conn: Client) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await conn.post(target.path)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    return total / elapsed


def bench_endpoint(double_file: Path, session: dict) -> None:
    """The endpoint the router serves: one HEALTHY route to the replica session, private.

    Before the merge: the double's data (tests/serving_double.py). AFTER THE MERGE, replace with a
    real Endpoint (open_to_public False), one HEALTHY Route to ``session`` and an EndpointToken
    whose plain text is TOKEN, and start the proxy as ``proxy_app.asgi:application``."""
    from sessions_app import kernel_images
    from tests.serving_double import ServingDouble, route

    kernel = session["kernels"][0]
    double = ServingDouble()
    view = double.endpoint(
        "iris",
        route(
            1,
            kernel_images.SKLEARN_SERVE_PORT,
            kernel_id=str(kernel["id"]),
            agent_id=kernel["agent"],
        ),
        public=False,
    )
    double.tokens = {view.endpoint_id: [TOKEN]}
    double.save(double_file)


def scale_up_time() -> str:
    """PLACEHOLDER (after the merge): seconds from a rule's threshold being crossed to the new
    replica serving. Sketch: an endpoint with replicas=1, max 2, a rule ``rps_per_replica gt X``
    (cooldown 1 s); drive > X requests/s with ``throughput``-style callers through the router;
    note t0 when ``serving_app.metrics.snapshot`` first shows rps over X, then poll
    ``/serve/iris/predict`` until an answer names a second replica (``replica`` field); print
    the difference (target <= 10 s)."""
    return "not measured yet: needs core's reconciler and rules (fill in after the merge)"


def cold_start_time() -> str:
    """PLACEHOLDER (after the merge): seconds from the first request to an endpoint scaled to
    zero (min_replicas 0, replicas 0, status SCALED_TO_ZERO) to its answer, which the router holds
    while ``serving_app.services.wake`` and the reconciler start a replica (target <= 5 s).
    Sketch: scale the bench endpoint to 0, wait for its route to go, then time one
    ``Client.post('/serve/iris/predict')``; repeat 3 times, print the median and max."""
    return "not measured yet: needs core's reconciler (fill in after the merge)"


def _wait_ready(url: str, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {deadline_s:.0f} s")
        time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--proxy",
        default="tests.serving_double_asgi:application",
        help="the apps proxy's ASGI application (proxy_app.asgi:application after the merge)",
    )
    args = parser.parse_args()

    from sessions_app import kernel_images

    apps_port = streams.apps_environment()
    ids = streams.setup_database()
    from sessions_app.models import Image

    Image.objects.get_or_create(reference=kernel_images.SKLEARN_SERVE_IMAGE)
    kernel_images.build_sklearn_serve()  # an engine hit when current; else from the cache
    stack = Stack(ids["agent_token"])
    proxy = None
    try:
        session = launch(
            stack,
            ids["token"],
            {
                "image": kernel_images.SKLEARN_SERVE_IMAGE,
                "ports": [kernel_images.SKLEARN_SERVE_PORT],
                "resources": {"cpu": 1, "mem": "1g"},
                "startup_command": kernel_images.SKLEARN_SERVE_COMMAND,
            },
        )
        double_file = stack.tmp / "serving.json"
        bench_endpoint(double_file, session)
        proxy = streams.subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(apps_port)]
            + [args.proxy],
            cwd=streams.ROOT,
            env={
                **os.environ,
                "LOG_LEVEL": "WARNING",
                "BAI_VAR_DIR": str(stack.tmp / "var"),
                "BAI_CHANNEL_PREFIX": stack.prefix,
                "BAI_TEST_SERVING_DOUBLE": str(double_file),
            },
            stdout=open(stack.tmp / "apps.log", "w"),  # noqa: SIM115
            stderr=streams.subprocess.STDOUT,
        )
        import docker

        container = docker.from_env().containers.get(session["kernels"][0]["container_id"])
        ip = next(
            n["IPAddress"]
            for n in container.attrs["NetworkSettings"]["Networks"].values()
            if n["IPAddress"]
        )
        port = kernel_images.SKLEARN_SERVE_PORT
        _wait_ready(f"http://{ip}:{port}/health")
        origin = f"apps.localhost:{apps_port}"
        routed = Target(
            "router",
            "127.0.0.1",
            apps_port,
            origin,
            "/serve/iris/predict",
            [("authorization", f"Bearer {TOKEN}")],
        )
        direct = Target("direct", ip, port, f"{ip}:{port}", "/predict")

        results: dict[str, dict[str, float]] = {}
        for target in (direct, routed):
            lat = asyncio.run(latency(target, args.requests))
            results[target.name] = {
                "p50": pct(lat, 50),
                "p99": pct(lat, 99),
                "rps": asyncio.run(throughput(target, args.clients, args.requests)),
            }
        d, r = results["direct"], results["router"]
        print(f"inference router vs direct ({time.strftime('%Y-%m-%d')})")
        print(
            f"  conditions: {os.cpu_count()} cores, {platform.platform()}, Python "
            f"{platform.python_version()}; one daphne for the apps proxy, one Docker agent; "
            f"replica: uvicorn (1 worker) + scikit-learn in {kernel_images.SKLEARN_SERVE_IMAGE}, "
            f"1 cpu; POST /predict with one instance; {args.requests} sequential requests, "
            f"then {args.requests} shared by {args.clients} concurrent kept-alive callers"
        )
        print(f"  {'':28} {'direct':>10} {'router':>10} {'router/direct':>14}")
        for label, key in (
            ("POST /predict p50 (ms)", "p50"),
            ("POST /predict p99 (ms)", "p99"),
            (f"requests/s ({args.clients} callers)", "rps"),
        ):
            print(f"  {label:28} {d[key]:10.2f} {r[key]:10.2f} {r[key] / d[key]:14.2f}")
        print(f"  added to p50: {r['p50'] - d['p50']:.2f} ms (target <= 3 ms)")
        print(f"  router requests/s: {r['rps'] / d['rps']:.0%} of direct (target >= 70 %)")
        print(f"  threshold crossed -> new replica serving: {scale_up_time()}")
        print(f"  cold start from zero: {cold_start_time()}")
    finally:
        if proxy is not None and proxy.poll() is None:
            proxy.terminate()
            proxy.wait(10)
        stack.stop()


if __name__ == "__main__":
    main()
