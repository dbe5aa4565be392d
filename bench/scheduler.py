"""Benchmark of the scheduling dispatcher on PostgreSQL: snapshot, policy and commit.

Fills a dedicated database (default ``bai_bench``; created if missing, migrated, flushed) with the
shapes of bench/scheduler_policy.py's ``make_snapshot``: 1,000 agents (some with GPUs), 10,000
pending sessions of ~100 users, cluster sizes 1-4, single- and multi-node, demand about 1.5x
capacity, all inserted with bulk_create. Then, in one resource group (DRF, concentrated):

1. policy alone: ``build_snapshot`` from the database once, then ``policy.schedule`` on it
   (best of --repeat); placements/s of the pure decision;
2. the fill pass: one ``schedule_pass`` over the 10,000 pending sessions on empty agents -- lock,
   snapshot, policy, every write (sessions, kernels, events, waits, occupancy), commit and the
   after-commit pushes to owners and agents; placements/s end to end;
3. steady state: --rounds passes; before each (untimed), --churn of the running sessions end
   (their rows are set TERMINATED in bulk, as the agents' reports would) and as many new pending
   sessions arrive, so every pass reads a full queue (~ the thousands still waiting), places what
   the freed room allows and records the waits of the rest. Pass latency p50/p99/max and
   placements/s over those passes.

    python bench/scheduler.py [--database-url postgres://bai:bai@127.0.0.1:5432/bai_bench]
        [--agents 1000] [--sessions 10000] [--users 100] [--rounds 100] [--churn 0.03]
        [--profile]   # cProfile of the fill pass and one steady-state pass

Not part of the test run. Prints its figures and the conditions it ran in.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import os
import platform
import pstats
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DEFAULT_URL = "postgres://bai:bai@127.0.0.1:5432/bai_bench"


def ensure_database(url: str) -> None:
    """Create the benchmark database if it does not exist (needs CREATEDB, else says how)."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return
        try:
            conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege:
            sys.exit(f'cannot create database {name}: run  su postgres -c "createdb -O bai {name}"')


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "false")
    import django

    django.setup()


def fresh_schema() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    call_command("flush", verbosity=0, interactive=False)


class Population:
    """Turns make_snapshot's plain shapes into rows, and keeps the queue topped up."""

    def __init__(self, args: argparse.Namespace) -> None:
        from django.contrib.auth import get_user_model

        from sessions_app.models import Image, ResourceGroup, ResourcePolicy

        self.args = args
        self.rng = random.Random(args.seed)
        self.counter = 0
        self.clock = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
        ResourcePolicy.objects.create(name="default", is_default=True)  # no limits
        self.group = ResourceGroup.objects.create(
            name="default", session_selection="drf", agent_selection="concentrated"
        )
        self.image = Image.objects.create(reference="bai-kernel/minimal:1")
        user_model = get_user_model()
        user_model.objects.bulk_create(
            user_model(username=f"user{u:03d}", password="!") for u in range(args.users)
        )
        self.users = dict(user_model.objects.values_list("username", "pk"))

    def insert_agents(self, agents: tuple) -> None:
        from sessions_app.models import Agent, AgentStatus

        Agent.objects.bulk_create(
            (
                Agent(
                    id=a.agent_id,
                    resource_group=self.group,
                    status=AgentStatus.ALIVE,
                    capacity_slots=a.capacity.to_dict(),
                    token_hash=uuid.uuid4().hex * 2,
                    token_prefix="bench",
                )
                for a in agents
            ),
            batch_size=1000,
        )

    def insert_pending(self, pending: tuple) -> None:
        from sessions_app.models import Kernel, KernelRole, Session

        sessions, kernels = [], []
        for shape in pending:
            self.counter += 1
            self.clock += dt.timedelta(milliseconds=10)
            session = Session(
                id=uuid.uuid4(),
                owner_id=self.users[shape.owner_id],
                name=f"s{self.counter:07d}",
                session_type=shape.session_type,
                cluster_mode=shape.cluster_mode,
                cluster_size=len(shape.kernels),
                requested_slots=shape.kernels[0].slots.to_dict(),
                image=self.image,
                resource_group=self.group,
                created_at=self.clock,
                scheduling_attempts=shape.attempts,
            )
            sessions.append(session)
            for rank, kernel in enumerate(shape.kernels):
                kernels.append(
                    Kernel(
                        id=session.id if rank == 0 else uuid.uuid4(),
                        session=session,
                        cluster_role=KernelRole.MAIN if rank == 0 else KernelRole.SUB,
                        cluster_idx=max(rank, 1),
                        local_rank=rank,
                        cluster_hostname="main1" if rank == 0 else f"sub{rank}",
                        image=self.image.reference,
                        requested_slots=kernel.slots.to_dict(),
                    )
                )
        Session.objects.bulk_create(sessions, batch_size=2000)
        Kernel.objects.bulk_create(kernels, batch_size=2000)

    def churn(self, fraction: float) -> int:
        """End ``fraction`` of the running sessions and queue as many new ones (untimed setup:
        plain bulk updates stand in for the agents' exit reports)."""
        from scheduler_policy import make_snapshot

        from sessions_app.models import Kernel, Session, Status

        running = list(
            Session.objects.filter(resource_group=self.group, status=Status.SCHEDULED).values_list(
                "pk", flat=True
            )
        )
        ended = self.rng.sample(running, int(len(running) * fraction))
        now = dt.datetime.now(dt.UTC)
        gone = {"status": Status.TERMINATED, "status_reason": "bench: ended", "terminated_at": now}
        Kernel.objects.filter(session_id__in=ended).update(**gone)
        Session.objects.filter(pk__in=ended).update(**gone)
        arrivals = make_snapshot(1, len(ended), self.args.users, self.rng.getrandbits(32))
        self.insert_pending(arrivals.pending)
        return len(ended)


def conditions(args: argparse.Namespace) -> str:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    return (
        f"# scheduler dispatcher benchmark -- {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, Django {django.__version__}, PostgreSQL {pg}, "
        f"{os.cpu_count()} CPUs, {platform.machine()} {platform.system()}, "
        f"load average {load()} (other work on the machine slows every figure)\n"
        f"# {args.agents} agents, {args.sessions} pending sessions, {args.users} users, "
        f"seed {args.seed}; group: DRF + concentrated; LOG_LEVEL {os.environ['LOG_LEVEL']}"
    )


def profiled(enabled: bool, label: str, call):
    if not enabled:
        return call()
    profiler = cProfile.Profile()
    result = profiler.runcall(call)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(28)
    print(f"\n## profile: {label}\n{out.getvalue()}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="policy-only repetitions")
    parser.add_argument("--rounds", type=int, default=100, help="steady-state passes")
    parser.add_argument(
        "--churn", type=float, default=0.03, help="share of running ended per round"
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.agents, args.sessions, args.users, args.repeat, args.rounds = 20, 100, 5, 1, 2

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.db import connection, transaction
    from scheduler_policy import make_snapshot

    from scheduler_app import policy, selectors, services
    from sessions_app.models import Kernel, Session, Status

    print(conditions(args))
    t0 = time.perf_counter()
    fresh_schema()
    base = make_snapshot(args.agents, args.sessions, args.users, args.seed)
    population = Population(args)
    population.insert_agents(base.agents)
    population.insert_pending(base.pending)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    kernels = Kernel.objects.count()
    print(
        f"# set-up: {Session.objects.count()} sessions, {kernels} kernels inserted in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    group = population.group

    # 1. Policy alone, on a snapshot built from the database.
    with transaction.atomic():
        pending = list(
            Session.objects.filter(resource_group=group, status=Status.PENDING).order_by(
                "created_at"
            )
        )
        t0 = time.perf_counter()
        snapshot = selectors.build_snapshot(
            group=group, now=dt.datetime.now(dt.UTC), pending=pending
        )
        snapshot_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        decisions = policy.schedule(snapshot)
        times.append(time.perf_counter() - t0)
    placed = len(decisions.placements)
    print(f"\n{'stage':<34} {'placed':>7} {'seconds':>8} {'placements/s':>13}")
    label = f"build_snapshot ({len(pending)} pending)"
    print(f"{label:<34} {'':>7} {snapshot_s:>8.3f} {'':>13}")
    print(
        f"{'policy alone (best of ' + str(args.repeat) + ')':<34} {placed:>7} {min(times):>8.3f} "
        f"{placed / min(times):>13,.0f}"
    )

    # 2. The fill pass.
    fill = profiled(args.profile, "fill pass", lambda: services.schedule_pass(group_id=group.pk))
    print(
        f"{'fill pass (end to end)':<34} {fill.placed_sessions:>7} {fill.seconds:>8.3f} "
        f"{fill.placed_sessions / fill.seconds:>13,.0f}"
    )
    print(
        f"    snapshot {fill.snapshot_seconds:.3f} s, policy {fill.policy_seconds:.3f} s, "
        f"writes {fill.write_seconds:.3f} s, commit+pushes {fill.commit_seconds:.3f} s; "
        f"{fill.placed_kernels} kernels on {len(fill.agents_to_notify)} agents, "
        f"{fill.waiting} waits"
    )

    # 3. Steady state.
    if args.rounds < 1:
        return
    results, queue = [], []
    for round_no in range(args.rounds):
        population.churn(args.churn)
        queue.append(Session.objects.filter(resource_group=group, status=Status.PENDING).count())
        profile = args.profile and round_no == args.rounds // 2
        results.append(
            profiled(profile, "steady pass", lambda: services.schedule_pass(group_id=group.pk))
        )
    latencies = sorted(r.seconds for r in results)
    steady_placed = sum(r.placed_sessions for r in results)
    steady_s = sum(latencies)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"{'steady state (' + str(args.rounds) + ' passes)':<34} {steady_placed:>7} "
        f"{steady_s:>8.3f} {steady_placed / steady_s:>13,.0f}"
    )
    print(
        f"    per pass: {statistics.mean(queue):,.0f} pending read, "
        f"{steady_placed / len(results):,.0f} placed; latency p50 "
        f"{statistics.median(latencies) * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms, "
        f"max {latencies[-1] * 1000:,.0f} ms; of which snapshot "
        f"{statistics.mean(r.snapshot_seconds for r in results) * 1000:,.0f} ms, policy "
        f"{statistics.mean(r.policy_seconds for r in results) * 1000:,.0f} ms, writes "
        f"{statistics.mean(r.write_seconds for r in results) * 1000:,.0f} ms, commit+pushes "
        f"{statistics.mean(r.commit_seconds for r in results) * 1000:,.0f} ms (means)"
    )
    total_placed = fill.placed_sessions + steady_placed
    total_s = fill.seconds + steady_s
    print(
        f"{'all passes (end to end)':<34} {total_placed:>7} {total_s:>8.3f} "
        f"{total_placed / total_s:>13,.0f}"
    )
    print(f"# check: {over_capacity(group)} agents over capacity; load average after: {load()}")


def over_capacity(group) -> int:
    """Agents holding more than their capacity (must be 0)."""
    from scheduler_app import selectors
    from sessions_app.models import Agent
    from sessions_app.slots import from_strings, shortfall

    capacity = dict(Agent.objects.filter(resource_group=group).values_list("pk", "capacity_slots"))
    held = selectors.agent_occupancy(agent_ids=list(capacity))
    return sum(1 for pk, slots in held.items() if shortfall(slots, from_strings(capacity[pk])))


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
