"""A load test with Locust: many users launch and terminate sessions on the minimal
image, follow their logs and open terminals (websockets), and call the API, against a
running manager on loopback (``scripts/webfarm up`` gives the production shape).

    python bench/load.py --url http://127.0.0.1:8080 --users 12 --spawn-rate 2 --run-time 90

Bounded: at most ``--users`` (<= 50) users, ``--run-time`` (<= 600) seconds, loopback
addresses only; it stops by itself. It makes its load users (``load-<run>-1`` …, with API
tokens) and an admin token through ``manage.py`` in the same environment (DATABASE_URL,
REDIS_URL) as the manager it loads. It prints the conditions, sessions started per
minute sustained (from the moment every user is spawned), the API's p95, and checks
that no agent was ever oversubscribed (sampled every second through the API), that no
session is stuck after the run (every load session ends once terminated), and that
/metrics agrees with the database. Exit status 1 when a check fails.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Locust runs on gevent: patch before anything imports ssl or sockets.
    from gevent import monkey

    monkey.patch_all()

import argparse  # noqa: E402
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from datetime import date
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "bai-kernel/minimal:1"
RESOURCES = {"cpu": "0.1", "mem": "32m"}
ACTIVE = {"PENDING", "SCHEDULED", "PREPARING", "PULLING", "RUNNING", "TERMINATING"}


def manage(code: str) -> str:
    """Run Django code in a fresh process (this one is gevent's) and return its output."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py shell failed: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


SETUP = """
import json
from django.contrib.auth import get_user_model
from sessions_app.models import ResourcePolicy
from sessions_app.tokens import token_create
User = get_user_model()
admin = User.objects.filter(is_superuser=True).order_by("pk").first() or User.objects.create_superuser(
    f"load-{run}-admin", password=None
)
tokens = []
for i in range(1, {users} + 1):
    # Users of this run only: an earlier run's detached terminals may still hold places.
    user, _ = User.objects.get_or_create(username=f"load-{run}-{{i}}")
    tokens.append(token_create(user=user)[1])
print(json.dumps({{"admin": token_create(user=admin)[1], "users": tokens}}))
"""

OWNED = """
import json
from sessions_app.models import ACTIVE, Session
print(json.dumps([str(pk) for pk in Session.objects.filter(
    owner__username__startswith="load-{run}-", status__in=ACTIVE).values_list("pk", flat=True)]))
"""

# --smoke's own manager: the rows it needs, and its agent's token.
SMOKE_SETUP = f"""
from sessions_app.models import Agent, Image, ResourceGroup, ResourcePolicy
group, _ = ResourceGroup.objects.get_or_create(name="default")
ResourcePolicy.objects.get_or_create(is_default=True, defaults={{"name": "default"}})
Image.objects.get_or_create(reference="{IMAGE}")
agent = Agent.objects.filter(pk="bench-node").first() or Agent(
    id="bench-node", resource_group=group, capacity_slots={{}}
)
token = agent.set_new_token()
agent.save()
print(token)
"""


def smoke_manager():  # noqa: ANN201
    """A manager of its own for --smoke: the database of DATABASE_URL (migrated), one
    daphne and one Docker agent on loopback (bench/streams.py's stack)."""
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
    sys.path.insert(0, str(ROOT / "bench"))
    from streams import Stack

    return Stack(manage(SMOKE_SETUP))


# What the database says, for the comparison with /metrics (the same moment: nothing moves then).
FIGURES = """
import json
from django.db.models import Count
from sessions_app.models import ACTIVE, Agent, Session
print(json.dumps({
    "sessions": {f"{g}|{s}": n for g, s, n in Session.objects.filter(status__in=ACTIVE)
                 .values_list("resource_group__name", "status").annotate(n=Count("id")).order_by()},
    "agents": {f"{g}|{s}": n for g, s, n in Agent.objects
               .values_list("resource_group__name", "status").annotate(n=Count("id")).order_by()},
    "pending": Session.objects.filter(status="PENDING").count(),
}))
"""

if __name__ != "__main__":
    # Loaded by Locust (the runner below imports this module by name): the users.
    import random

    from locust import HttpUser, between, task
    from websockets.sync.client import connect

    STARTED: list[float] = []  # when each load session was seen RUNNING
    CREATED: list[str] = []  # every load session's id

    class SessionUser(HttpUser):
        wait_time = between(0.5, 2.0)
        tokens: list[str] = []

        def on_start(self) -> None:
            self.token = random.choice(self.tokens)
            self.client.headers["Authorization"] = f"Token {self.token}"

        def _ws(self, name: str, path: str, send: str | None, until: str) -> None:
            url = self.host.replace("http", "ws", 1) + path
            started = time.perf_counter()
            error = None
            try:
                with connect(
                    url,
                    additional_headers={"Authorization": f"Token {self.token}"},
                    open_timeout=10,
                ) as ws:
                    if send is not None:
                        ws.recv(timeout=15)  # "ready"
                        ws.send(send)
                    deadline = time.monotonic() + 15
                    seen = ""
                    while until not in seen and time.monotonic() < deadline:
                        seen += ws.recv(timeout=15)
                    if until not in seen:
                        raise TimeoutError(f"{until!r} never came")
                    if send is not None:
                        # End the shell: a socket merely closed keeps it (and the user's
                        # place under BAI_MAX_TERMINALS_PER_USER) for the agent's grace period.
                        ws.send(json.dumps({"type": "close"}))
                        while '"closed"' not in ws.recv(timeout=10):
                            pass
            except Exception as exc:  # noqa: BLE001 - reported to Locust as a failure
                error = exc
            self.environment.events.request.fire(
                request_type="WS",
                name=name,
                response_time=(time.perf_counter() - started) * 1000,
                response_length=0,
                exception=error,
                context={},
            )

        @task(3)
        def browse(self) -> None:
            self.client.get("/api/v1/sessions/?limit=20", name="GET /api/v1/sessions/")
            self.client.get("/api/v1/images/", name="GET /api/v1/images/")
            self.client.get("/api/v1/presets/", name="GET /api/v1/presets/")

        @task(2)
        def session_life(self) -> None:
            created = self.client.post(
                "/api/v1/sessions/",
                json={
                    "image": IMAGE,
                    "name": f"load-{uuid.uuid4().hex[:8]}",
                    "resources": RESOURCES,
                },
                name="POST /api/v1/sessions/",
            )
            if created.status_code != 201:
                return
            sid = created.json()["id"]
            CREATED.append(sid)
            deadline = time.monotonic() + 60
            status = "PENDING"
            while status != "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.5)
                got = self.client.get(f"/api/v1/sessions/{sid}/", name="GET /api/v1/sessions/<id>/")
                status = got.json().get("status", status) if got.ok else status
                if status not in ACTIVE:
                    break
            if status == "RUNNING":
                STARTED.append(time.time())
                self._ws("WS logs", f"/ws/sessions/{sid}/kernels/main1/logs/", None, '"type"')
                self._ws(
                    "WS terminal",
                    f"/ws/sessions/{sid}/terminal/?term={uuid.uuid4()}&cols=80&rows=24",
                    json.dumps({"type": "input", "data": "echo load-$((40+2))\n"}),
                    "load-42",
                )
            self.client.post(
                f"/api/v1/sessions/{sid}/terminate/",
                json={},
                name="POST /api/v1/sessions/<id>/terminate/",
            )


def _metrics(url: str, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(
        f"{url}/metrics", headers={"Authorization": f"Token {token}"}, timeout=30
    ).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--spawn-rate", type=float, default=2.0)
    parser.add_argument("--run-time", type=int, default=90, help="seconds")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, against a manager of its own (the test suite runs it so)",
    )
    args = parser.parse_args()
    if not args.smoke:
        return load(parser, args)
    stack = smoke_manager()
    try:
        args.url, args.users, args.spawn_rate, args.run_time = stack.url, 2, 2.0, 10
        time.sleep(2)  # let the agent register
        load(parser, args)
        return 0  # a smoke run judges no check
    finally:
        stack.stop()


def load(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    host = urlparse(args.url).hostname or ""
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        parser.error("loopback addresses only")
    if not (1 <= args.users <= 50 and 0 < args.spawn_rate <= 10 and 10 <= args.run_time <= 600):
        parser.error("bounded: 1-50 users, spawn rate up to 10/s, 10-600 s")

    run = uuid.uuid4().hex[:6]
    secrets = json.loads(manage(SETUP.format(users=args.users, run=run)))
    import gevent
    import requests
    from locust.env import Environment

    sys.path.insert(0, str(ROOT / "bench"))
    import load as users_module  # this file, as Locust's users

    users_module.SessionUser.tokens = secrets["users"]
    admin = {"Authorization": f"Token {secrets['admin']}"}
    env = Environment(user_classes=[users_module.SessionUser], host=args.url)
    runner = env.create_local_runner()

    worst: dict[str, Decimal] = {}
    over: list[str] = []

    def sample_agents() -> None:
        while True:
            for agent in requests.get(
                f"{args.url}/api/v1/agents/", headers=admin, timeout=10
            ).json():
                rows = agent if isinstance(agent, dict) else {}
                cap, occ = rows.get("capacity_slots") or {}, rows.get("occupied_slots") or {}
                for slot, held in occ.items():
                    if Decimal(str(held)) > Decimal(str(cap.get(slot, "0"))):
                        over.append(f"{rows.get('id')}: {slot} {held} of {cap.get(slot)}")
                worst[rows.get("id", "?")] = max(
                    worst.get(rows.get("id", "?"), Decimal(0)), Decimal(str(occ.get("cpu", "0")))
                )
            gevent.sleep(1.0)

    sampler = gevent.spawn(sample_agents)
    began = time.time()
    runner.start(args.users, spawn_rate=args.spawn_rate)
    spawned_at = began + args.users / args.spawn_rate
    gevent.spawn_later(args.run_time, runner.quit)
    runner.greenlet.join()
    ended = time.time()
    sampler.kill()

    # Stuck? End every load session and wait for all of them to be gone.
    # The users' own list, and the database's: a launch whose user was stopped by the
    # end of the run before it read the answer exists all the same.
    ids = set(users_module.CREATED) | set(json.loads(manage(OWNED.format(run=run))))
    for sid in ids:
        requests.post(
            f"{args.url}/api/v1/sessions/{sid}/terminate/", json={}, headers=admin, timeout=30
        )
    stuck = sorted(ids)
    deadline = time.monotonic() + 90
    while stuck and time.monotonic() < deadline:
        gevent.sleep(1)
        stuck = [
            sid
            for sid in stuck
            if requests.get(f"{args.url}/api/v1/sessions/{sid}/", headers=admin, timeout=30)
            .json()
            .get("status")
            in ACTIVE
        ]

    # /metrics against the database, at rest.
    gevent.sleep(2)
    db = json.loads(manage(FIGURES))
    figures = _metrics(args.url, secrets["admin"])
    disagree = []
    for kind, name in (("sessions", "bai_sessions"), ("agents", "bai_agents")):
        for key, n in db[kind].items():
            group, status = key.split("|")
            got = figures.get((name, (("group", group), ("status", status))), 0)
            if got != n:
                disagree.append(f"{name}{{{group},{status}}} {got} != {n}")
    pending = sum(v for (n, _), v in figures.items() if n == "bai_sessions_pending")
    if pending != db["pending"]:
        disagree.append(f"bai_sessions_pending {pending} != {db['pending']}")

    total = env.stats.total
    http = [e for (name, method), e in env.stats.entries.items() if method != "WS"]
    api_p95 = max((e.get_response_time_percentile(0.95) for e in http), default=0)
    from locust.stats import StatsEntry

    merged = StatsEntry(env.stats, "API", "HTTP")
    for entry in http:
        merged.extend(entry)
    sustained = [t for t in users_module.STARTED if t >= spawned_at]
    window = max(ended - spawned_at, 1)
    print(
        f"load test, {date.today().isoformat()}, {platform.node()}: {os.cpu_count()} cores, "
        f"{args.users} users (spawn {args.spawn_rate}/s), {args.run_time} s, against {args.url}"
    )
    print(f"  requests: {total.num_requests}, failures: {total.num_failures}")
    print(
        f"  sessions started: {len(users_module.STARTED)} in all; "
        f"{len(sustained) * 60 / window:.1f} per minute sustained (after ramp-up, {window:.0f} s)"
    )
    print(
        f"  API p95 (all HTTP requests): {merged.get_response_time_percentile(0.95):.0f} ms "
        f"(worst single endpoint {api_p95:.0f} ms), p50 {merged.get_response_time_percentile(0.5):.0f} ms"
    )
    for (name, method), e in sorted(env.stats.entries.items()):
        print(
            f"    {method:5} {name:42} n={e.num_requests:5} fail={e.num_failures:3} "
            f"p50={e.get_response_time_percentile(0.5):6.0f} ms p95={e.get_response_time_percentile(0.95):6.0f} ms"
        )
    for error in list(env.stats.errors.values())[:5]:
        print(
            f"    failure x{error.occurrences}: {error.method} {error.name}: {str(error.error)[:160]}"
        )
    print(f"  most cpu held on an agent: {', '.join(f'{a} {c}' for a, c in worst.items()) or '-'}")
    checks = {
        "no agent oversubscribed": not over,
        "no session stuck": not stuck,
        "metrics agree with the database": not disagree,
    }
    for name, ok in checks.items():
        print(f"  check: {name}: {'ok' if ok else 'FAILED'}")
    for line in over[:5] + [f"stuck: {s}" for s in stuck[:5]] + disagree[:5]:
        print(f"    {line}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
