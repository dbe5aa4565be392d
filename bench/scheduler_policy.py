"""Benchmark of the pure scheduling policy (no database).

Builds a seeded synthetic resource group -- 1,000 agents (some with GPUs), 10,000 pending sessions
of ~100 users with cluster sizes 1-4, per-container shapes of cpu 1/2/4/8 and mem 1-32 GiB, some
GPU sessions, demand about 1.5x capacity -- and times `schedule()` on it for each session-selection
and agent-selection policy. Prints the figures and the conditions.

    python bench/scheduler_policy.py [--agents 1000] [--sessions 10000] [--users 100] [--repeat 3]

`make_snapshot()` is the reusable part: the database benchmark (bench/scheduler.py) builds its rows
from the same shapes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_app.policy import (  # noqa: E402
    AgentState,
    GroupConfig,
    KernelRequest,
    OwnerUsage,
    PendingSession,
    Quota,
    ResourceSlots,
    Snapshot,
    schedule,
)

GIB = 2**30
EPOCH = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)

# (weight, per-container cpu); (weight, per-container mem GiB); (weight, cluster size)
CPU_SHAPES = ((40, 1), (30, 2), (20, 4), (10, 8))
MEM_SHAPES = ((15, 1), (25, 2), (25, 4), (20, 8), (10, 16), (5, 32))
CLUSTER_SIZES = ((60, 1), (20, 2), (10, 3), (10, 4))
GPU_SESSION_SHARE = 0.05
GPU_AGENT_SHARE = 0.10
DEMAND_OVER_CAPACITY = 1.5


def _pick(rng: random.Random, table: tuple[tuple[int, int], ...]) -> int:
    return rng.choices([v for _, v in table], weights=[w for w, _ in table])[0]


def make_snapshot(
    n_agents: int = 1000,
    n_sessions: int = 10000,
    n_users: int = 100,
    seed: int = 1,
    *,
    session_selection: str = "drf",
    agent_selection: str = "concentrated",
    num_retries_to_skip: int = 0,
) -> Snapshot:
    """A seeded synthetic snapshot of one resource group named "default" (plain data only)."""
    rng = random.Random(seed)
    slot_cache: dict[tuple[int, int, int], ResourceSlots] = {}

    def slots(cpu: int, mem_gib: int, gpus: int = 0) -> ResourceSlots:
        key = (cpu, mem_gib, gpus)
        if key not in slot_cache:
            values: dict[str, int] = {"cpu": cpu, "mem": mem_gib * GIB}
            if gpus:
                values["cuda.device"] = gpus
            slot_cache[key] = ResourceSlots.from_mapping(values)
        return slot_cache[key]

    pending: list[PendingSession] = []
    demand_cpu = demand_gpu = 0
    for i in range(n_sessions):
        size = _pick(rng, CLUSTER_SIZES)
        cpu = _pick(rng, CPU_SHAPES)
        mem = _pick(rng, MEM_SHAPES)
        gpus = rng.choice((1, 1, 2)) if rng.random() < GPU_SESSION_SHARE else 0
        demand_cpu += cpu * size
        demand_gpu += gpus * size
        session_id = f"s{i:07d}-{rng.getrandbits(32):08x}"
        kernels = tuple(
            KernelRequest(session_id if k == 0 else f"{session_id}-k{k}", slots(cpu, mem, gpus))
            for k in range(size)
        )
        pending.append(
            PendingSession(
                session_id=session_id,
                owner_id=f"user{rng.randrange(n_users):03d}",
                created_at=EPOCH + dt.timedelta(seconds=i),
                session_type="batch" if rng.random() < 0.3 else "interactive",
                cluster_mode="multi-node" if rng.random() < 0.5 else "single-node",
                kernels=kernels,
                attempts=rng.choice((0, 0, 0, 1, 2, 5)),
            )
        )

    # Size the agents so that the demand is about DEMAND_OVER_CAPACITY times the capacity.
    n_gpu_agents = max(1, int(n_agents * GPU_AGENT_SHARE))
    mean_cpu = demand_cpu / DEMAND_OVER_CAPACITY / n_agents
    gpus_per_agent = max(1, round(demand_gpu / DEMAND_OVER_CAPACITY / n_gpu_agents))
    agents: list[AgentState] = []
    for a in range(n_agents):
        cpu = max(8, round(mean_cpu * rng.choice((0.5, 1.0, 1.5))))
        capacity = {"cpu": cpu, "mem": cpu * 4 * GIB}
        if a < n_gpu_agents:
            capacity["cuda.device"] = gpus_per_agent
        agents.append(
            AgentState(
                agent_id=f"agent{a:05d}",
                capacity=ResourceSlots.from_mapping(capacity),
                occupied=ResourceSlots.zero(),
            )
        )
    rng.shuffle(agents)

    usage = {
        f"user{u:03d}": OwnerUsage(
            occupied=slots(rng.choice((0, 2, 8, 32)), rng.choice((0, 8, 64))),
            active_sessions=rng.randrange(4),
            pending_sessions=0,
        )
        for u in range(n_users)
    }
    group = GroupConfig(
        name="default",
        session_selection=session_selection,
        num_retries_to_skip=num_retries_to_skip,
        agent_selection=agent_selection,
        allowed_session_types=frozenset({"interactive", "batch", "inference"}),
        pending_timeout=dt.timedelta(days=7),
    )
    generous = Quota(
        total_slots=ResourceSlots.from_mapping(
            {"cpu": 100000, "mem": 400000 * GIB, "cuda.device": 10000}
        ),
        max_concurrent_sessions=10000,
        max_pending_sessions=None,
        max_containers_per_session=8,
        allowed_resource_groups=None,
    )
    return Snapshot(
        group=group,
        now=EPOCH + dt.timedelta(seconds=n_sessions + 60),
        pending=tuple(pending),
        agents=tuple(agents),
        usage=usage,
        quotas={},
        dependencies={},
        default_quota=generous,
    )


def run(snapshot: Snapshot, repeat: int) -> dict[str, float]:
    times: list[float] = []
    decisions = schedule(snapshot)
    for _ in range(repeat):
        start = time.perf_counter()
        decisions = schedule(snapshot)
        times.append(time.perf_counter() - start)
    best = min(times)
    sessions = len(decisions.placements)
    kernels = sum(len(p.assignments) for p in decisions.placements)
    return {
        "placed": sessions,
        "kernels": kernels,
        "waits": len(decisions.waits),
        "cancelled": len(decisions.cancellations),
        "best_s": best,
        "median_s": sorted(times)[len(times) // 2],
        "sessions_per_s": sessions / best,
        "kernels_per_s": kernels / best,
        "decided_per_s": len(snapshot.pending) / best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    print(
        f"# scheduler policy benchmark -- {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{os.cpu_count()} CPUs, {platform.machine()} {platform.system()}"
    )
    base = make_snapshot(args.agents, args.sessions, args.users, args.seed)
    kernels = sum(len(s.kernels) for s in base.pending)
    print(
        f"# {args.agents} agents, {args.sessions} pending sessions ({kernels} kernels), "
        f"{args.users} users, seed {args.seed}; best and median of {args.repeat} passes"
    )
    header = (
        f"{'sessions':>10} {'agents':>12} {'placed':>6} {'kernels':>7} {'waits':>6} "
        f"{'best s':>7} {'median s':>8} {'sess/s':>8} {'kern/s':>8} {'decided/s':>9}"
    )
    print(header)
    configs = [
        ("drf", "concentrated", 0),
        ("drf", "dispersed", 0),
        ("drf", "roundrobin", 0),
        ("lifo", "concentrated", 0),
        ("fifo", "concentrated", 0),
        ("fifo", "concentrated", 1),
    ]
    for selection, agent_selection, skip in configs:
        group = replace(
            base.group,
            session_selection=selection,
            agent_selection=agent_selection,
            num_retries_to_skip=skip,
        )
        figures = run(replace(base, group=group), args.repeat)
        label = selection if not skip else f"fifo/skip{skip}"
        print(
            f"{label:>10} {agent_selection:>12} {figures['placed']:>6.0f} "
            f"{figures['kernels']:>7.0f} {figures['waits']:>6.0f} {figures['best_s']:>7.3f} "
            f"{figures['median_s']:>8.3f} {figures['sessions_per_s']:>8.0f} "
            f"{figures['kernels_per_s']:>8.0f} {figures['decided_per_s']:>9.0f}"
        )


if __name__ == "__main__":
    main()
