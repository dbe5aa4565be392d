"""The inference router against the same replica called directly, in the same run.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/serve.py [--requests 2000] [--clients 16] [--no-scaling]

Starts daphne, the apps proxy (``python -m proxy_app.serve``) and a Docker agent on loopback
(bench/streams.py's stack), launches one replica session of ``bai-kernel/sklearn-serve:1`` (uvicorn serving the iris
classifier) and measures ``POST /predict`` (one instance) with a bounded load generator in
this process (asyncio, kept-alive HTTP/1.1 connections, h11):

1. through the router (``/serve/<endpoint>/predict`` on the apps origin, a bearer token,
   the agent's tunnel) and directly (the container's bridge address), one caller at a time:
   latency p50 and p99 (target: at most 3 ms added to p50);
2. the same with ``--clients`` concurrent callers for a fixed number of requests:
   requests/s (target: at least 70 % of direct);
3. the time from an autoscaling threshold being crossed to the new replica serving (target:
   within 10 s): a rule ``rps_per_replica gt <threshold>`` on the endpoint, ``--clients``
   callers through the router; t0 is the moment ``serving_app.metrics.snapshot`` (the
   reconciler's view, over ``BAI_SERVE_METRICS_WINDOW``) first shows the value over the
   threshold, t1 the first answer that names a second replica;
4. the cold start from zero (target: within 5 s): the endpoint scaled to 0 and its replica
   gone, then one ``POST /predict`` through the router, held until a replica is healthy and
   answered; three times, median and max.

``--no-scaling`` stops after 2 (for before/after runs by turns).

The endpoint is a real ``Endpoint`` (private, a real token), the proxy the real
``proxy_app.asgi:application`` and serving_app's reconciler runs in this process every
``RECONCILE_EVERY`` seconds, as beat would (health checks every second through the proxy).

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
from streams import Stack, pct  # noqa: E402

BODY = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]}).encode()
RECONCILE_EVERY = 1.0  # seconds between reconciler passes (BAI_SERVE_RECONCILE_INTERVAL=1)
WINDOW_S = 5  # BAI_SERVE_METRICS_WINDOW of this run


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


class Reconciler:
    """serving_app's reconciler every RECONCILE_EVERY seconds in a thread (beat's part)."""

    def __init__(self) -> None:
        import threading

        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from django.db import connection

        from serving_app import reconcile

        while not self.stop.wait(RECONCILE_EVERY):
            for endpoint_id in reconcile.endpoint_ids():
                try:
                    reconcile.reconcile_endpoint(endpoint_id)
                except Exception as exc:  # noqa: BLE001 - report and go on, as a worker does
                    print(f"  reconciler: {exc!r}")
        connection.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def _routes(endpoint, status: str = "HEALTHY") -> list:
    return list(endpoint.routes.filter(status=status).order_by("id"))


def _wait(predicate, timeout: float, what: str):
    from tests.live import wait_for

    return wait_for(predicate, timeout=timeout, what=what)


def _post_replica(apps_port: int, token: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{apps_port}/serve/bench/predict",
        data=BODY,
        headers={
            "Host": f"apps.localhost:{apps_port}",
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
        return json.loads(response.read())["replica"]


def scale_up_time(endpoint, routed: Target, apps_port: int, token: str, clients: int, rps: float):
    """Seconds from the rule's threshold being crossed (as the reconciler sees the metrics)
    to the first answer from a second replica, with the rule's trigger and the new route's
    health on the way; under ``clients`` callers through the router."""
    import threading

    from serving_app import metrics, services
    from serving_app.models import EndpointEvent

    threshold = round(rps / 3, 1)  # well under what the callers drive through one replica
    services.rule_create(
        endpoint=endpoint,
        data={
            "metric": "rps_per_replica",
            "comparator": "gt",
            "threshold": threshold,
            "step": 1,
            "cooldown": 600,
            "max_replicas": 2,
        },
    )
    first = _post_replica(apps_port, token)
    stop = threading.Event()

    async def drive() -> None:
        conns = [await routed.client() for _ in range(clients)]

        async def caller(conn: Client) -> None:
            while not stop.is_set():
                await conn.post(routed.path)

        await asyncio.gather(*(caller(c) for c in conns))
        for conn in conns:
            conn.close()

    load = threading.Thread(target=lambda: asyncio.run(drive()), daemon=True)
    load.start()
    try:
        _wait(
            lambda: (
                metrics.snapshot(str(endpoint.pk), window_s=WINDOW_S)["rps"] > threshold
                and time.time()
            ),
            60,
            "the threshold to be crossed",
        )
        t0 = time.monotonic()
        triggered = _wait(
            lambda: EndpointEvent.objects.filter(endpoint=endpoint, data__to=2).first(),
            60,
            "the rule to fire",
        )
        t_rule = time.monotonic() - t0
        _wait(lambda: len(_routes(endpoint)) == 2, 60, "the new replica's health check")
        t_healthy = time.monotonic() - t0
        _wait(lambda: _post_replica(apps_port, token) != first, 30, "an answer from it")
        t_serving = time.monotonic() - t0
    finally:
        stop.set()
        load.join(60)
    return {
        "threshold": threshold,
        "value": triggered.data.get("value"),
        "rule": t_rule,
        "healthy": t_healthy,
        "serving": t_serving,
    }


def cold_start_times(endpoint, apps_port: int, token: str, runs: int = 3) -> list[float]:
    """Seconds from the first request to an endpoint scaled to zero (its replicas gone)
    until its answer, which the router holds while wake() and the reconciler start one."""
    from django.contrib.auth.models import User

    from serving_app import services

    owner = User.objects.get(pk=endpoint.owner_id)
    services.endpoint_update(endpoint=endpoint, user=owner, data={"min_replicas": 0, "rules": []})
    times = []
    for _ in range(runs):
        services.endpoint_scale(endpoint=endpoint, user=owner, replicas=0)
        _wait(
            lambda: (
                not endpoint.routes.exists()
                and type(endpoint).objects.get(pk=endpoint.pk).status == "SCALED_TO_ZERO"
            ),
            90,
            "the replicas to go",
        )
        t0 = time.monotonic()
        _post_replica(apps_port, token)
        times.append(time.monotonic() - t0)
    return times


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
        "--no-scaling", action="store_true", help="only parts 1 and 2 (latency, requests/s)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.clients = 20, 2

    # This process runs the reconciler (and the services it calls) as a worker would.
    os.environ.update(
        CELERY_TASK_ALWAYS_EAGER="true",
        BAI_SERVE_METRICS_WINDOW=str(WINDOW_S),
        BAI_SERVE_UNHEALTHY_AFTER="2",
    )
    apps_port = streams.apps_environment()
    ids = streams.setup_database()
    from django.conf import settings
    from django.contrib.auth.models import User

    from backendai_web.env import persistent_secret
    from serving_app import services
    from serving_app.models import Endpoint
    from sessions_app import kernel_images
    from sessions_app.models import Image, Kernel

    Image.objects.get_or_create(reference=kernel_images.SKLEARN_SERVE_IMAGE)
    kernel_images.build_sklearn_serve()  # an engine hit when current; else from the cache
    user = User.objects.get(username="bench")
    for old in Endpoint.objects.filter(name="bench"):
        services.endpoint_delete(endpoint=old, user=user)
    stack = Stack(ids["agent_token"])
    proxy = reconciler = None
    try:
        # The health checks this process signs must open in the proxy: the same key.
        settings.SECRET_KEY = persistent_secret(stack.tmp / "var" / "secret_key")
        proxy = streams.subprocess.Popen(
            [sys.executable, "-m", "proxy_app.serve", "-b", "127.0.0.1", "-p", str(apps_port)],
            cwd=streams.ROOT,
            env={
                **os.environ,
                "LOG_LEVEL": "WARNING",
                "BAI_VAR_DIR": str(stack.tmp / "var"),
                "BAI_CHANNEL_PREFIX": stack.prefix,
            },
            stdout=open(stack.tmp / "apps.log", "w"),  # noqa: SIM115
            stderr=streams.subprocess.STDOUT,
        )
        endpoint = services.endpoint_create(
            owner=user,
            data={
                "name": "bench",
                "image": kernel_images.SKLEARN_SERVE_IMAGE,
                "start_command": kernel_images.SKLEARN_SERVE_COMMAND,
                "port": kernel_images.SKLEARN_SERVE_PORT,
                "health_interval": 1,
                "resources": {"cpu": "1", "mem": "1g"},
                "replicas": 1,
                "min_replicas": 1,
                "max_replicas": 2,
            },
        )
        _, token = services.token_create(endpoint=endpoint, user=user)
        reconciler = Reconciler()
        (route,) = _wait(lambda: _routes(endpoint), 120, "the replica to turn healthy")
        kernel = Kernel.objects.get(session_id=route.session_id, cluster_role="main")
        import docker

        container = docker.from_env().containers.get(kernel.container_id)
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
            "/serve/bench/predict",
            [("authorization", f"Bearer {token}")],
        )
        direct = Target("direct", ip, port, f"{ip}:{port}", "/predict")

        results: dict[str, dict[str, float]] = {}
        for target in (direct, routed):
            lat = asyncio.run(latency(target, args.requests))
            cpu0 = streams.cpu_seconds(proxy.pid)
            rps = asyncio.run(throughput(target, args.clients, args.requests))
            results[target.name] = {
                "p50": pct(lat, 50),
                "p99": pct(lat, 99),
                "rps": rps,
                "proxy_us": (streams.cpu_seconds(proxy.pid) - cpu0) / args.requests * 1e6,
            }
        d, r = results["direct"], results["router"]
        if not args.no_scaling:
            up = scale_up_time(endpoint, routed, apps_port, token, args.clients, r["rps"])
            cold = sorted(cold_start_times(endpoint, apps_port, token))
        print(f"inference router vs direct ({time.strftime('%Y-%m-%d')})")
        print(
            f"  conditions: {os.cpu_count()} cores, {platform.platform()}, Python "
            f"{platform.python_version()}; the apps proxy on uvicorn (proxy_app.serve), one Docker agent; "
            f"replica: uvicorn (1 worker) + scikit-learn in {kernel_images.SKLEARN_SERVE_IMAGE}, "
            f"1 cpu; POST /predict with one instance; {args.requests} sequential requests, "
            f"then {args.requests} shared by {args.clients} concurrent kept-alive callers; "
            f"reconciler every {RECONCILE_EVERY:g} s, health checks every 1 s, metrics window "
            f"{WINDOW_S} s"
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
        print(
            f"  apps proxy CPU per routed request ({args.clients} callers): {r['proxy_us']:.0f} µs"
        )
        if args.no_scaling:
            return
        print(
            f"  threshold crossed (rps_per_replica > {up['threshold']}) -> new replica serving: "
            f"{up['serving']:.1f} s (rule fired after {up['rule']:.1f} s at value "
            f"{up['value']}, replica healthy after {up['healthy']:.1f} s; target <= 10 s)"
        )
        print(
            f"  cold start from zero (first request held until answered), {len(cold)} runs: "
            f"median {cold[len(cold) // 2]:.2f} s, max {cold[-1]:.2f} s (target <= 5 s)"
        )
    finally:
        if reconciler is not None:
            reconciler.close()
        for old in Endpoint.objects.filter(name="bench"):
            services.endpoint_delete(endpoint=old, user=user)
        if proxy is not None and proxy.poll() is None:
            proxy.terminate()
            proxy.wait(30)  # its shutdown grace (proxy_app.serve) and some
        stack.stop()


if __name__ == "__main__":
    main()
