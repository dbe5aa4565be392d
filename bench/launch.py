"""Launch latency: from the API request to every kernel RUNNING, for 1 and for
4 kernels, against plain Docker SDK starts of the same image measured in the
same run.

    python bench/launch.py [--runs 10] [--image bai-kernel/minimal:1]

It starts its own system on loopback: a fresh PostgreSQL database
(``bai_bench_launch``), daphne, a Celery worker and one Docker agent, then
times sessions created through the REST API until the push over
``/ws/sessions/`` says RUNNING. Baselines: one ``containers.run(detach=True)``;
for 4 kernels, one internal network plus four detached containers started in
parallel (like for like with what a 4-kernel session needs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import docker
import websockets

ROOT = Path(__file__).resolve().parent.parent
PORT = 8765


def sh(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def start_system(
    tmp: Path, db_url: str, redis_url: str
) -> tuple[list[subprocess.Popen[bytes]], str]:
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "BAI_STORAGE_ROOT": str(tmp / "storage"),
        "BAI_CHANNEL_PREFIX": "bench",
        "LOG_LEVEL": "WARNING",
    }
    py = sys.executable
    manage = [py, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    setup = (
        "from django.contrib.auth.models import User;"
        "from sessions_app.models import Agent, Image, ResourceGroup;"
        "from sessions_app.tokens import token_create;"
        "u=User.objects.create_superuser('bench','b@example.org','bench-pass');"
        "print(token_create(user=u)[1]);"
        "a=Agent(id='bench',resource_group=ResourceGroup.objects.get(name='default'));"
        "print(a.set_new_token()); a.save();"
        "Image.objects.get_or_create(reference=IMAGE)"
    )
    out = subprocess.run(
        [*manage, "shell", "-c", f"IMAGE={IMAGE!r};{setup}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    api_token, agent_token = out[-2], out[-1]
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)

    def spawn(
        name: str, args: list[str], extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env={**env, **(extra or {})},
            stdout=open(logs / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
        )

    procs = [
        spawn(
            "daphne",
            [
                py,
                "-m",
                "backendai_web.serve",
                "-b",
                "127.0.0.1",
                "-p",
                str(PORT),
                "backendai_web.asgi:application",
            ],
        ),
        spawn(
            "worker",
            [
                py,
                "-m",
                "celery",
                "-A",
                "backendai_web",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
            ],
        ),
    ]
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/login/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    procs.append(
        spawn(
            "agent",
            [
                py,
                "-m",
                "agent",
                "--manager",
                f"ws://127.0.0.1:{PORT}",
                "--backend",
                "docker",
                "--work-dir",
                str(tmp / "agent"),
            ],
            {"BACKENDAI_AGENT_TOKEN": agent_token},
        )
    )
    return procs, api_token


def api(token: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


async def time_session(token: str, kernels: int) -> float:
    """Seconds from the POST to the push that says the session is RUNNING."""
    async with websockets.connect(
        f"ws://127.0.0.1:{PORT}/ws/sessions/",
        additional_headers={"Authorization": f"Token {token}"},
    ) as ws:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        created = await loop.run_in_executor(
            None,
            lambda: api(
                token,
                "POST",
                "/api/v1/sessions/",
                {
                    "image": IMAGE,
                    "cluster_size": kernels,
                    "cluster_mode": "single-node",
                    "resources": {"cpu": "0.25", "mem": "64m"},
                    "name": f"bench-{uuid.uuid4().hex[:8]}",
                },
            ),
        )
        session_id = created["id"]
        elapsed: float | None = None
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
            for item in message.get("sessions", []):
                if item["id"] == session_id and not item["kernel"]:
                    if item["status"] == "RUNNING" and elapsed is None:
                        elapsed = time.perf_counter() - started
                        await loop.run_in_executor(
                            None,
                            lambda: api(
                                token, "POST", f"/api/v1/sessions/{session_id}/terminate/", {}
                            ),
                        )
                    elif item["status"] in ("ERROR", "TERMINATED", "CANCELLED"):
                        if elapsed is None:
                            raise RuntimeError(f"session {session_id} ended: {item['reason']}")
                        # Gone: the next run does not overlap this one's teardown.
                        return elapsed


def plain_single(client: docker.DockerClient) -> float:
    started = time.perf_counter()
    container = client.containers.run(
        IMAGE, ["sleep", "3600"], detach=True, user="1000:1000", labels={"bench": "launch"}
    )
    elapsed = time.perf_counter() - started
    container.remove(force=True)
    return elapsed


def plain_four(client: docker.DockerClient) -> float:
    started = time.perf_counter()
    network = client.networks.create(
        f"bench-{uuid.uuid4().hex[:8]}", internal=True, labels={"bench": "launch"}
    )
    with ThreadPoolExecutor(4) as pool:
        containers = list(
            pool.map(
                lambda i: client.containers.run(
                    IMAGE,
                    ["sleep", "3600"],
                    detach=True,
                    user="1000:1000",
                    network=network.name,
                    hostname=f"k{i}",
                    labels={"bench": "launch"},
                ),
                range(4),
            )
        )
    elapsed = time.perf_counter() - started
    for container in containers:
        container.remove(force=True)
    network.remove()
    return elapsed


def main() -> None:
    global IMAGE
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="bai-kernel/minimal:1")
    parser.add_argument(
        "--database-url", default="postgres://bai:bai@127.0.0.1:5432/bai_bench_launch"
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    IMAGE = args.image
    db_name = args.database_url.rsplit("/", 1)[1]
    subprocess.run(
        ["su", "postgres", "-c", f"dropdb --if-exists {db_name}; createdb -O bai {db_name}"],
        check=True,
        cwd="/",  # postgres may not enter the caller's (private) directory
    )

    client = docker.from_env()
    tmp = Path(f"/tmp/bench-launch-{os.getpid()}")
    tmp.mkdir()
    procs, token = start_system(tmp, args.database_url, args.redis_url)
    try:
        time.sleep(2)  # let the agent register
        for kernels in (1, 4):  # warm-up: first use of the image and code paths
            asyncio.run(time_session(token, kernels))
        results = {}
        for kernels, plain in ((1, plain_single), (4, plain_four)):
            ours, base = [], []
            for _ in range(args.runs):  # interleaved, so both see the same conditions
                ours.append(asyncio.run(time_session(token, kernels)))
                base.append(plain(client))
            results[kernels] = (statistics.median(ours), statistics.median(base))
        print(f"launch latency, {args.runs} runs each, image {IMAGE}")
        print(
            f"conditions: {date.today()}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"docker {client.version()['Version']}, PostgreSQL + Redis on loopback, one agent"
        )
        for kernels, (ours, base) in results.items():
            label = "one plain start" if kernels == 1 else "network + 4 parallel plain starts"
            print(
                f"{kernels} kernel(s): API→RUNNING median {ours * 1000:.0f} ms; {label} median "
                f"{base * 1000:.0f} ms; ratio {ours / base:.2f} (target ≤ 1.5)"
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
        for container in client.containers.list(all=True, filters={"label": "bench=launch"}):
            container.remove(force=True)


IMAGE = "bai-kernel/minimal:1"

if __name__ == "__main__":
    main()
