"""Benchmark of the pure scheduling policy (no database).

Builds a seeded synthetic resource group -- 1,000 agents (some with GPUs), 10,000 pending sessions
of ~100 users with cluster sizes 1-4, per-container shapes of cpu 1/2/4/8 and mem 1-32 GiB, some
GPU sessions, demand about 1.5x capacity -- and times `schedule()` on it for each session-selection
and agent-selection policy. Prints the figures and the conditions.

    python bench/scheduler_policy.py [--agents 1000] [--sessions 10000] [--users 100] [--repeat 3]
        [--compare REV]   # also time scheduler_app/policy.py as of git revision REV, alternating

With ``--compare`` both policies run on the same snapshot shapes, one pass of each in turn (the order
alternating, garbage collected before each), timed in
CPU seconds of this process (other load on a shared machine disturbs that far less than wall time),
and must decide alike; the table shows both best times and their ratio.

`make_snapshot()` is the reusable part: the database benchmark (bench/scheduler.py) builds its rows
from the same shapes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler_app import policy as current_policy  # noqa: E402

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
    policy: ModuleType = current_policy,
) -> Any:
    """A seeded synthetic snapshot of one resource group named "default" (plain data only),
    built from ``policy``'s types (another revision's module, to compare)."""
    AgentState = policy.AgentState
    GroupConfig = policy.GroupConfig
    KernelRequest = policy.KernelRequest
    OwnerUsage = policy.OwnerUsage
    PendingSession = policy.PendingSession
    Quota = policy.Quota
    ResourceSlots = policy.ResourceSlots
    Snapshot = policy.Snapshot
    rng = random.Random(seed)
    slot_cache: dict[tuple[int, int, int], ResourceSlots] = {}

    def slots(cpu: int, mem_gib: int, gpus: int = 0) -> Any:
        key = (cpu, mem_gib, gpus)
        if key not in slot_cache:
            values: dict[str, int] = {"cpu": cpu, "mem": mem_gib * GIB}
            if gpus:
                values["cuda.device"] = gpus
            slot_cache[key] = ResourceSlots.from_mapping(values)
        return slot_cache[key]

    pending: list[Any] = []
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
    agents: list[Any] = []
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


def load_policy(revision: str) -> ModuleType:
    """scheduler_app/policy.py as of a git revision, as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:scheduler_app/policy.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = ModuleType(f"policy_at_{revision}")
    module.__file__ = f"{revision}:scheduler_app/policy.py"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
    return module


def timed(
    schedule: Callable[[Any], Any], snapshot: Any, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, Any]:
    start = clock()
    decisions = schedule(snapshot)
    return clock() - start, decisions


def figures(snapshot: Any, decisions: Any, times: list[float]) -> dict[str, float]:
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


def run(snapshot: Any, repeat: int, policy: ModuleType = current_policy) -> dict[str, float]:
    _, decisions = timed(policy.schedule, snapshot)  # warm-up
    times = []
    for _ in range(repeat):
        seconds, decisions = timed(policy.schedule, snapshot)
        times.append(seconds)
    return figures(snapshot, decisions, times)


def compare(
    snapshots: dict[str, Any], repeat: int, policies: dict[str, ModuleType]
) -> dict[str, dict[str, float]]:
    """One pass of each policy in turn, ``repeat`` times: the figures of each."""
    times: dict[str, list[float]] = {label: [] for label in policies}
    decisions: dict[str, Any] = {}
    for label, policy in policies.items():
        _, decisions[label] = timed(policy.schedule, snapshots[label])  # warm-up
    order = list(policies.items())
    for _ in range(repeat):
        for label, policy in order:
            gc.collect()  # so neither pays for the other's garbage
            seconds, decisions[label] = timed(policy.schedule, snapshots[label], time.process_time)
            times[label].append(seconds)
        order.reverse()  # and neither always goes first
    # The same decisions (placements, who waits and whether it counts as an
    # attempt, who is cancelled); the words of a reason may differ between
    # revisions that reworded them, and are only counted.
    outcomes = [
        (
            [(p.session_id, p.assignments) for p in d.placements],
            [(w.session_id, w.counts_as_attempt) for w in d.waits],
            [c.session_id for c in d.cancellations],
            d.roundrobin_cursor,
        )
        for d in decisions.values()
    ]
    assert all(o == outcomes[0] for o in outcomes), "the policies decided differently"
    worded = [{w.session_id: w.reason for w in d.waits} for d in decisions.values()]
    reworded = sum(1 for sid, text in worded[0].items() if any(w[sid] != text for w in worded[1:]))
    if reworded:
        print(f"#   ({reworded} wait reasons are worded differently; the decisions are the same)")
    return {label: figures(snapshots[label], decisions[label], times[label]) for label in policies}


CONFIGS = [
    ("drf", "concentrated", 0),
    ("drf", "dispersed", 0),
    ("drf", "roundrobin", 0),
    ("lifo", "concentrated", 0),
    ("fifo", "concentrated", 0),
    ("fifo", "concentrated", 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", metavar="REV", help="also time policy.py of this git revision")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.agents, args.sessions, args.users, args.repeat = 20, 100, 5, 1

    print(
        f"# scheduler policy benchmark -- {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{os.cpu_count()} CPUs, {platform.machine()} {platform.system()}"
    )
    policies = {"this tree": current_policy}
    if args.compare:
        policies = {args.compare: load_policy(args.compare), **policies}
    bases = {
        label: make_snapshot(args.agents, args.sessions, args.users, args.seed, policy=policy)
        for label, policy in policies.items()
    }
    base = bases["this tree"]
    kernels = sum(len(s.kernels) for s in base.pending)
    print(
        f"# {args.agents} agents, {args.sessions} pending sessions ({kernels} kernels), "
        f"{args.users} users, seed {args.seed}; best and median of {args.repeat} passes"
        + (f"; {args.compare} and this tree in turn" if args.compare else "")
    )
    if args.compare:
        print(
            f"{'sessions':>10} {'agents':>12} {'placed':>6} "
            f"{args.compare[:10]:>10} {'this tree':>10} {'ratio':>6}   (best CPU s)"
        )
    else:
        print(
            f"{'sessions':>10} {'agents':>12} {'placed':>6} {'kernels':>7} {'waits':>6} "
            f"{'best s':>7} {'median s':>8} {'sess/s':>8} {'kern/s':>8} {'decided/s':>9}"
        )
    for selection, agent_selection, skip in CONFIGS:
        snapshots = {
            label: replace(
                snapshot,
                group=replace(
                    snapshot.group,
                    session_selection=selection,
                    agent_selection=agent_selection,
                    num_retries_to_skip=skip,
                ),
            )
            for label, snapshot in bases.items()
        }
        label = selection if not skip else f"fifo/skip{skip}"
        if args.compare:
            both = compare(snapshots, args.repeat, policies)
            old, new = both[args.compare], both["this tree"]
            print(
                f"{label:>10} {agent_selection:>12} {new['placed']:>6.0f} "
                f"{old['best_s']:>10.3f} {new['best_s']:>10.3f} "
                f"{new['best_s'] / old['best_s']:>6.3f}"
            )
            continue
        result = run(snapshots["this tree"], args.repeat)
        print(
            f"{label:>10} {agent_selection:>12} {result['placed']:>6.0f} "
            f"{result['kernels']:>7.0f} {result['waits']:>6.0f} {result['best_s']:>7.3f} "
            f"{result['median_s']:>8.3f} {result['sessions_per_s']:>8.0f} "
            f"{result['kernels_per_s']:>8.0f} {result['decided_per_s']:>9.0f}"
        )


if __name__ == "__main__":
    main()
