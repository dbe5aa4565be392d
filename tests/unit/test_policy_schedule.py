"""The scheduling policy, one behaviour per table: order, checks, placement, reasons."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from scheduler_app.policy import (
    AgentState,
    Cancellation,
    Decisions,
    DependencyState,
    GroupConfig,
    KernelRequest,
    OwnerUsage,
    PendingSession,
    Quota,
    ResourceSlots,
    Snapshot,
    Wait,
    check_session,
    order_sessions,
    place_kernels,
    schedule,
)

GIB = 2**30
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
UNLIMITED = Quota(None, None, None, None, None)


def slots(cpu: float | str = 0, mem_gib: int = 0, gpu: int = 0) -> ResourceSlots:
    return ResourceSlots.from_mapping({"cpu": str(cpu), "mem": mem_gib * GIB, "cuda.device": gpu})


def agent(
    agent_id: str, cpu: int, *, used_cpu: int = 0, mem_gib: int = 256, gpu: int = 0
) -> AgentState:
    return AgentState(agent_id, slots(cpu, mem_gib, gpu), slots(used_cpu))


def session(
    sid: str,
    *,
    owner: str = "alice",
    minute: int = 0,
    cpu: float | str = 1,
    mem_gib: int = 1,
    gpu: int = 0,
    size: int = 1,
    mode: str = "single-node",
    attempts: int = 0,
    session_type: str = "interactive",
    depends_on: tuple[str, ...] = (),
    starts_at: datetime | None = None,
) -> PendingSession:
    per_kernel = slots(cpu, mem_gib, gpu)
    kernels = tuple(
        KernelRequest(sid if i == 0 else f"{sid}-sub{i}", per_kernel) for i in range(size)
    )
    return PendingSession(
        session_id=sid,
        owner_id=owner,
        created_at=T0 + timedelta(minutes=minute),
        session_type=session_type,
        cluster_mode=mode,
        kernels=kernels,
        attempts=attempts,
        depends_on=depends_on,
        starts_at=starts_at,
    )


def snapshot(
    pending: Sequence[PendingSession],
    agents: Sequence[AgentState],
    *,
    selection: str = "fifo",
    skip: int = 0,
    agent_selection: str = "concentrated",
    cursor: int = 0,
    usage: Mapping[str, OwnerUsage] | None = None,
    quotas: Mapping[str, Quota] | None = None,
    dependencies: Mapping[str, DependencyState] | None = None,
    default_quota: Quota = UNLIMITED,
    pending_timeout: timedelta | None = None,
) -> Snapshot:
    group = GroupConfig(
        name="default",
        session_selection=selection,
        num_retries_to_skip=skip,
        agent_selection=agent_selection,
        allowed_session_types=frozenset({"interactive", "batch"}),
        pending_timeout=pending_timeout,
        roundrobin_cursor=cursor,
    )
    return Snapshot(
        group=group,
        now=NOW,
        pending=tuple(pending),
        agents=tuple(agents),
        usage=usage or {},
        quotas=quotas or {},
        dependencies=dependencies or {},
        default_quota=default_quota,
    )


def placed(decisions: Decisions) -> list[str]:
    return [p.session_id for p in decisions.placements]


def agents_of(decisions: Decisions, sid: str) -> list[str]:
    for p in decisions.placements:
        if p.session_id == sid:
            return sorted(p.assignments.values())
    raise AssertionError(f"{sid} was not placed")


def wait_of(decisions: Decisions, sid: str) -> Wait:
    [found] = [w for w in decisions.waits if w.session_id == sid]
    return found


# --- session order and head-of-line blocking ---------------------------------------------------


def test_fifo_without_hol_avoidance_blocks_behind_a_large_head() -> None:
    pending = [session("big00000-1", minute=0, cpu=8), session("small000-2", minute=1, cpu=1)]
    decisions = schedule(snapshot(pending, [agent("a1", 8, used_cpu=4)]))
    assert placed(decisions) == []
    assert wait_of(decisions, "big00000-1") == Wait(
        "big00000-1", "needs 8 cpu per container; largest free on an agent: 4", True
    )
    assert wait_of(decisions, "small000-2") == Wait(
        "small000-2", "queued behind session big00000 which waits for resources", False
    )


@pytest.mark.parametrize(
    ("skip", "head_attempts", "small_starts"),
    [
        (0, 10, False),  # avoidance off: the head blocks however often it failed
        (2, 2, False),  # failed only N times: still at the head
        (2, 3, True),  # failed more than N times: pushed behind, the small one starts
    ],
)
def test_hol_avoidance_pushes_back_a_head_that_failed_more_than_n_times(
    skip: int, head_attempts: int, small_starts: bool
) -> None:
    pending = [
        session("big", minute=0, cpu=8, attempts=head_attempts),
        session("small", minute=1, cpu=1),
    ]
    decisions = schedule(snapshot(pending, [agent("a1", 8, used_cpu=4)], skip=skip))
    assert placed(decisions) == (["small"] if small_starts else [])
    assert wait_of(decisions, "big").counts_as_attempt


def test_order_sessions_puts_sessions_past_their_retries_last_in_fifo_order() -> None:
    pending = [
        session("s3", minute=3),
        session("s1", minute=1, attempts=5),
        session("s2", minute=2),
        session("s0", minute=0, attempts=3),
    ]
    order = order_sessions(snapshot(pending, [], skip=2))
    assert [s.session_id for s in order] == ["s2", "s3", "s0", "s1"]


@pytest.mark.parametrize(
    "held_head",
    [
        session("head", minute=0, depends_on=("dep",)),
        session("head", minute=0, starts_at=NOW + timedelta(hours=1)),
        session("head", minute=0, owner="capped"),
    ],
    ids=["dependencies", "start-time", "quota"],
)
def test_a_session_held_by_a_check_waits_alone_without_blocking(held_head: PendingSession) -> None:
    dependencies = {"dep": DependencyState("RUNNING", "UNDEFINED")}
    capped = Quota(None, 0, None, None, None)
    decisions = schedule(
        snapshot(
            [held_head, session("next", minute=1)],
            [agent("a1", 4)],
            dependencies=dependencies,
            quotas={"capped": capped},
        )
    )
    assert placed(decisions) == ["next"]
    assert not wait_of(decisions, "head").counts_as_attempt


def test_a_session_larger_than_any_agent_does_not_block_the_queue() -> None:
    pending = [session("huge", minute=0, cpu=64), session("next", minute=1)]
    decisions = schedule(snapshot(pending, [agent("a1", 8)]))
    assert placed(decisions) == ["next"]
    assert wait_of(decisions, "huge").reason == (
        "needs 64 cpu per container; no agent in resource group default has that much "
        "(the largest agent has 8 cpu)"
    )


def test_lifo_takes_the_newest_first_and_does_not_block() -> None:
    pending = [session(f"s{i}", minute=i) for i in range(3)] + [session("big", minute=9, cpu=4)]
    decisions = schedule(snapshot(pending, [agent("a1", 4, used_cpu=2)], selection="lifo"))
    assert placed(decisions) == ["s2", "s1"]
    assert (
        wait_of(decisions, "s0").reason == "needs 1 cpu per container; largest free on an agent: 0"
    )
    assert wait_of(decisions, "big").counts_as_attempt


def test_drf_lets_the_owner_with_the_smallest_dominant_share_go_first() -> None:
    # The group has 10 cpu; alice already holds 2 (share 0.2), bob nothing.
    pending = [session(f"a{i}", owner="alice", minute=i) for i in range(1, 4)] + [
        session(f"b{i}", owner="bob", minute=10 + i) for i in range(1, 4)
    ]
    usage = {"alice": OwnerUsage(slots(2), active_sessions=1, pending_sessions=3)}
    decisions = schedule(
        snapshot(pending, [agent("a1", 10, mem_gib=100)], selection="drf", usage=usage)
    )
    # bob 0 -> b1, 0.1 -> b2, tie at 0.2 goes to the older head (a1), then b3 at 0.2, then alice.
    assert placed(decisions) == ["b1", "b2", "a1", "b3", "a2", "a3"]


def test_drf_skips_a_session_that_does_not_fit_without_blocking_its_owner() -> None:
    pending = [
        session("a-big", owner="alice", minute=0, cpu=6),
        session("a-small", owner="alice", minute=1),
    ]
    decisions = schedule(snapshot(pending, [agent("a1", 8, used_cpu=4)], selection="drf"))
    assert placed(decisions) == ["a-small"]


def test_order_sessions_under_drf_serves_the_smallest_share_first() -> None:
    pending = [session("a1", owner="alice", minute=0), session("b1", owner="bob", minute=1)]
    usage = {"alice": OwnerUsage(slots(1), active_sessions=1, pending_sessions=1)}
    order = order_sessions(snapshot(pending, [agent("x", 10)], selection="drf", usage=usage))
    assert [s.session_id for s in order] == ["b1", "a1"]


# --- agent selection --------------------------------------------------------------------------

SPREAD_AGENTS = [agent("a1", 8, used_cpu=6), agent("a2", 8, used_cpu=2), agent("a3", 8, used_cpu=4)]


@pytest.mark.parametrize(
    ("agent_selection", "cursor", "expected_agent", "expected_cursor"),
    [
        ("concentrated", 0, "a1", 0),  # fewest free that still fit (2 free)
        ("dispersed", 0, "a2", 0),  # most free (6 free)
        ("roundrobin", 0, "a1", 1),  # the next one from the cursor
        ("roundrobin", 1, "a2", 2),
        ("roundrobin", 2, "a3", 0),
        ("roundrobin", 7, "a2", 2),  # a cursor past the end wraps around
    ],
)
def test_agent_selection_picks_the_agent_its_policy_names(
    agent_selection: str, cursor: int, expected_agent: str, expected_cursor: int
) -> None:
    decisions = schedule(
        snapshot(
            [session("s", cpu=2)], SPREAD_AGENTS, agent_selection=agent_selection, cursor=cursor
        )
    )
    assert agents_of(decisions, "s") == [expected_agent]
    assert decisions.roundrobin_cursor == expected_cursor


def test_roundrobin_keeps_its_cursor_when_a_cluster_fails_to_place() -> None:
    agents = [agent("a1", 8, used_cpu=6), agent("a2", 8, used_cpu=6), agent("a3", 8, used_cpu=7)]
    pending = [
        session("one", minute=0),
        session("three", minute=1, cpu=2, size=3, mode="multi-node"),
    ]
    decisions = schedule(snapshot(pending, agents, selection="lifo", agent_selection="roundrobin"))
    assert placed(decisions) == ["one"]
    assert agents_of(decisions, "one") == ["a1"]
    assert decisions.roundrobin_cursor == 1


def test_roundrobin_skips_agents_that_do_not_fit() -> None:
    decisions = schedule(
        snapshot([session("s", cpu=3)], SPREAD_AGENTS, agent_selection="roundrobin")
    )
    assert agents_of(decisions, "s") == ["a2"]
    assert decisions.roundrobin_cursor == 2


@pytest.mark.parametrize(
    ("agent_selection", "expected"),
    [("concentrated", ["a1", "a1", "a1", "a2"]), ("dispersed", ["a2", "a2", "a2", "a1"])],
)
def test_concentrated_packs_and_dispersed_spreads(
    agent_selection: str, expected: list[str]
) -> None:
    pending = [session(f"s{i}", minute=i, cpu=1) for i in range(4)]
    agents = [agent("a1", 8, used_cpu=5), agent("a2", 8, used_cpu=2)]
    decisions = schedule(snapshot(pending, agents, agent_selection=agent_selection))
    assert [agents_of(decisions, f"s{i}")[0] for i in range(4)] == expected


def test_place_kernels_returns_the_assignment_or_none() -> None:
    s = session("s", cpu=2, size=2, mode="multi-node")
    assert place_kernels(s, SPREAD_AGENTS, "concentrated") == {"s": "a3", "s-sub1": "a3"}
    assert place_kernels(s, [agent("a1", 8, used_cpu=7)], "concentrated") is None


# --- cluster modes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent_selection", "expected"), [("concentrated", ["a2", "a2"]), ("dispersed", ["a3", "a3"])]
)
def test_multi_node_prefers_one_agent_that_holds_every_kernel(
    agent_selection: str, expected: list[str]
) -> None:
    agents = [agent("a1", 8, used_cpu=5), agent("a2", 8, used_cpu=4), agent("a3", 8)]
    s = session("s", cpu=2, size=2, mode="multi-node")
    decisions = schedule(snapshot([s], agents, agent_selection=agent_selection))
    assert agents_of(decisions, "s") == expected


def test_multi_node_spreads_when_no_agent_holds_the_whole_cluster() -> None:
    agents = [agent("a1", 8, used_cpu=4), agent("a2", 8, used_cpu=5), agent("a3", 8, used_cpu=7)]
    s = session("s", cpu=2, size=3, mode="multi-node")
    decisions = schedule(snapshot([s], agents))
    # Kernel by kernel on the fullest agent that still fits: a2 (3 free), then a1 (4), a1 (2).
    assert agents_of(decisions, "s") == ["a1", "a1", "a2"]
    assert set(decisions.placements[0].assignments) == {"s", "s-sub1", "s-sub2"}


def test_single_node_stays_pending_with_the_reason_when_no_agent_holds_the_cluster() -> None:
    agents = [agent("a1", 8, used_cpu=5), agent("a2", 8, used_cpu=5)]
    decisions = schedule(snapshot([session("s", cpu=2, size=2)], agents))
    assert placed(decisions) == []
    assert wait_of(decisions, "s") == Wait(
        "s", "single-node cluster of 2 needs 4 cpu on one agent; largest free: 3", True
    )


def test_a_multi_node_cluster_that_does_not_fit_takes_nothing() -> None:
    agents = [agent("a1", 8, used_cpu=6), agent("a2", 8, used_cpu=6)]
    pending = [
        session("three", minute=0, cpu=2, size=3, mode="multi-node"),
        session("two", minute=1, cpu=2, size=2, mode="multi-node"),
    ]
    decisions = schedule(snapshot(pending, agents, selection="lifo"))
    # "two" goes first under LIFO; then "three" finds nothing left.
    assert placed(decisions) == ["two"]
    decisions = schedule(snapshot(pending, agents, selection="drf"))
    assert placed(decisions) == ["two"], (
        "the failed attempt for 'three' must give back what it took"
    )
    assert wait_of(decisions, "three").reason == (
        "multi-node cluster of 3 needs 2 cpu and 1 GiB mem per container; "
        "only 2 of 3 containers fit on the free agents at once"
    )


# --- accelerators -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_cpu", "request_gpu", "expected"),
    [
        (2, 0, "cpu1"),  # fits on the CPU-only agent: the GPU agent stays free
        (8, 0, "gpu1"),  # only the GPU agent is large enough
        (1, 1, "gpu1"),  # asks for a GPU
    ],
)
@pytest.mark.parametrize("agent_selection", ["concentrated", "dispersed", "roundrobin"])
def test_accelerator_agents_are_kept_for_sessions_that_need_them(
    agent_selection: str, request_cpu: int, request_gpu: int, expected: str
) -> None:
    agents = [agent("cpu1", 4), agent("gpu1", 32, gpu=4)]
    s = session("s", cpu=request_cpu, gpu=request_gpu)
    decisions = schedule(snapshot([s], agents, agent_selection=agent_selection))
    assert agents_of(decisions, "s") == [expected]


def test_a_multi_node_cpu_session_spreads_over_cpu_agents_before_taking_a_gpu_agent() -> None:
    agents = [agent("cpu1", 4), agent("cpu2", 4), agent("gpu1", 32, gpu=4)]
    s = session("s", cpu=4, size=2, mode="multi-node")
    assert agents_of(schedule(snapshot([s], agents)), "s") == ["cpu1", "cpu2"]


def test_a_gpu_session_waits_with_the_reason_when_the_group_has_no_gpu() -> None:
    decisions = schedule(snapshot([session("s", gpu=1)], [agent("cpu1", 4)]))
    assert wait_of(decisions, "s").reason == (
        "needs 1 cuda.device per container; no agent in resource group default has that much "
        "(the largest agent has 0 cuda.device)"
    )


# --- checks and their reasons -----------------------------------------------------------------

DEPENDENCIES = {
    "okdep-0001": DependencyState("TERMINATED", "SUCCESS"),
    "running-02": DependencyState("RUNNING", "UNDEFINED"),
    "pending-03": DependencyState("PENDING", "UNDEFINED"),
    "failed-004": DependencyState("TERMINATED", "FAILED"),
    "error-0005": DependencyState("ERROR", "UNDEFINED"),
    "cancel-006": DependencyState("CANCELLED", "UNDEFINED"),
    "nores-0007": DependencyState("TERMINATED", "UNDEFINED"),
}


@pytest.mark.parametrize(
    ("pending_session", "expected"),
    [
        (
            session("s", session_type="inference"),
            Wait("s", "session type inference is not allowed in resource group default", False),
        ),
        (
            session("s", owner="elsewhere"),
            Wait("s", "quota: resource group default is not allowed for this user", False),
        ),
        (session("s", depends_on=("okdep-0001",)), None),
        (
            session("s", depends_on=("okdep-0001", "running-02", "pending-03")),
            Wait("s", "waiting for dependencies: running-, pending-", False),
        ),
        (
            session("s", depends_on=("running-02", "failed-004")),
            Cancellation(
                "s", "dependency failed-0 ended FAILED; dependency running- had not finished"
            ),
        ),
        (
            session("s", depends_on=("error-0005",)),
            Cancellation("s", "dependency error-00 ended ERROR without success"),
        ),
        (
            session("s", depends_on=("cancel-006",)),
            Cancellation("s", "dependency cancel-0 cancelled"),
        ),
        (
            session("s", depends_on=("nores-0007",)),
            Cancellation("s", "dependency nores-00 ended TERMINATED without success"),
        ),
        (
            session("s", depends_on=("ghost-0008",)),
            Cancellation("s", "dependency ghost-00 does not exist"),
        ),
        (
            session("s", starts_at=datetime(2025, 3, 1, 12, 30, tzinfo=UTC)),
            Wait("s", "starts at 2025-03-01T12:30:00+00:00", False),
        ),
        (
            session("s", minute=-31),
            Cancellation("s", "pending timeout: waited longer than 1 h 30 min"),
        ),
        (session("s", minute=-29), None),
        (
            session("s", size=5, mode="multi-node"),
            Wait("s", "quota: at most 4 containers per session; this one has 5 (1 over)", False),
        ),
        (
            session("s", owner="busy"),
            Wait("s", "quota: 3 concurrent sessions allowed; 3 already active", False),
        ),
        (
            session("s", cpu=4, size=3),
            Wait("s", "quota: total cpu would be 12 of 8 allowed (4 over)", False),
        ),
        (
            session("s", cpu=1, mem_gib=20, size=2),
            Wait("s", "quota: total mem would be 40 GiB of 32 GiB allowed (8 GiB over)", False),
        ),
        (
            session("s", gpu=1),
            Wait("s", "quota: total cuda.device would be 1 of 0 allowed (1 over)", False),
        ),
    ],
)
def test_each_check_gives_its_decision_and_reason(
    pending_session: PendingSession, expected: Wait | Cancellation | None
) -> None:
    quota = Quota(slots(8, 32), 3, None, 4, frozenset({"default"}))
    snap = snapshot(
        [pending_session],
        [agent("a1", 64)],
        quotas={"elsewhere": Quota(None, None, None, None, frozenset({"gpu"}))},
        usage={"busy": OwnerUsage(slots(), active_sessions=3, pending_sessions=1)},
        dependencies=DEPENDENCIES,
        default_quota=quota,
        pending_timeout=timedelta(minutes=90),
    )
    assert check_session(snap, pending_session) == expected
    decisions = schedule(snap)
    decided = [*decisions.waits, *decisions.cancellations]
    if expected is None:
        assert placed(decisions) == ["s"]
    else:
        assert decided == [expected]


def test_a_batch_session_with_a_start_time_times_out_only_after_it_could_start() -> None:
    s = session("s", minute=-600, session_type="batch", starts_at=NOW - timedelta(minutes=10))
    decisions = schedule(snapshot([s], [agent("a1", 4)], pending_timeout=timedelta(minutes=30)))
    assert placed(decisions) == ["s"]


def test_quotas_count_what_the_same_pass_already_placed() -> None:
    quota = Quota(slots(5, 100), 10, None, None, None)
    usage = {"alice": OwnerUsage(slots(1), active_sessions=1, pending_sessions=3)}
    pending = [session(f"s{i}", minute=i, cpu=2) for i in range(3)]
    decisions = schedule(
        snapshot(pending, [agent("a1", 64)], usage=usage, default_quota=quota, selection="lifo")
    )
    assert placed(decisions) == ["s2", "s1"]
    assert wait_of(decisions, "s0").reason == "quota: total cpu would be 7 of 5 allowed (2 over)"

    quota = Quota(None, 2, None, None, None)
    decisions = schedule(snapshot(pending, [agent("a1", 64)], usage=usage, default_quota=quota))
    assert placed(decisions) == ["s0"]
    assert (
        wait_of(decisions, "s2").reason == "quota: 2 concurrent sessions allowed; 2 already active"
    )


def test_a_quota_slot_set_to_a_huge_amount_does_not_limit() -> None:
    quota = Quota(
        ResourceSlots.from_mapping({"cpu": 8, "mem": Decimal(10) ** 30}), None, None, None, None
    )
    decisions = schedule(
        snapshot([session("s", cpu=2, mem_gib=64)], [agent("a1", 8)], default_quota=quota)
    )
    assert placed(decisions) == ["s"]


def test_system_sessions_are_exempt_from_normal_quotas_but_have_their_own_limit() -> None:
    quota = Quota(slots(1), 0, None, None, None, max_concurrent_system_sessions=1)
    pending = [
        session("sftp1", session_type="system", cpu=1),
        session("sftp2", minute=1, session_type="system"),
    ]
    snap = snapshot(pending, [agent("a1", 8)], default_quota=quota)
    snap = Snapshot(
        group=GroupConfig("default", "fifo", 0, "concentrated", frozenset({"system"}), None),
        now=snap.now,
        pending=snap.pending,
        agents=snap.agents,
        usage={},
        quotas={},
        dependencies={},
        default_quota=quota,
    )
    decisions = schedule(snap)
    assert placed(decisions) == ["sftp1"]
    # A system session never waits: over its limit it is cancelled, with the quota's words.
    assert decisions.waits == []
    assert [(c.session_id, c.reason) for c in decisions.cancellations] == [
        ("sftp2", "quota: 1 concurrent system sessions allowed; 1 already active")
    ]


@pytest.mark.parametrize(
    ("pending_session", "agents", "reason"),
    [
        (
            session("s", cpu=8),
            [agent("a1", 8, used_cpu=2)],
            "needs 8 cpu per container; largest free on an agent: 6",
        ),
        (
            session("s", cpu=4, size=3),
            [agent("a1", 16, used_cpu=10), agent("a2", 16, used_cpu=12)],
            "single-node cluster of 3 needs 12 cpu on one agent; largest free: 6",
        ),
        (
            session("s", cpu=1, mem_gib=48),
            [agent("a1", 8, mem_gib=16), AgentState("a2", slots(8, 64), slots(0, 32))],
            "needs 48 GiB mem per container; largest free on an agent: 32 GiB",
        ),
        (
            session("s", cpu="0.5", mem_gib=4),
            [
                AgentState("a1", slots(8, 64), slots(8, 0)),
                AgentState("a2", slots(8, 64), slots(0, 62)),
            ],
            "needs 0.5 cpu and 4 GiB mem per container; no agent has all of it free",
        ),
        (session("s"), [], "no agent alive and schedulable in resource group default"),
        (
            session("s", cpu=4, size=3),
            [agent("a1", 8)],
            "single-node cluster of 3 needs 12 cpu on one agent; no agent in resource group default "
            "has that much (the largest agent has 8 cpu)",
        ),
    ],
)
def test_a_session_short_of_resources_waits_with_what_is_missing(
    pending_session: PendingSession, agents: list[AgentState], reason: str
) -> None:
    decisions = schedule(snapshot([pending_session], agents))
    assert decisions.waits == [Wait("s", reason, True)]


def test_every_session_behind_a_blocked_head_still_gets_its_own_cancellation() -> None:
    pending = [session("big", minute=0, cpu=8), session("orphan", minute=1, depends_on=("ghost",))]
    decisions = schedule(snapshot(pending, [agent("a1", 8, used_cpu=4)]))
    assert decisions.cancellations == [Cancellation("orphan", "dependency ghost does not exist")]


def test_unknown_policy_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown session selection"):
        GroupConfig("g", "random", 0, "concentrated", frozenset(), None)
    with pytest.raises(ValueError, match="unknown agent selection"):
        GroupConfig("g", "fifo", 0, "binpack", frozenset(), None)
    with pytest.raises(ValueError, match="unknown cluster mode"):
        session("s", mode="multi")


# --- system (SFTP) sessions never wait ---------------------------------------------------------


def _with_system(snap: Snapshot) -> Snapshot:
    from dataclasses import replace

    allowed = frozenset({"interactive", "batch", "system"})
    return replace(snap, group=replace(snap.group, allowed_session_types=allowed))


def test_a_system_session_over_its_limit_is_cancelled_at_once_with_the_reason() -> None:
    sftp = session("sftp-2", session_type="system", cpu="0.25")
    usage = {"alice": OwnerUsage(slots(0.25), 0, 0, 1)}
    quota = Quota(None, None, None, None, None, max_concurrent_system_sessions=1)
    decisions = schedule(
        _with_system(snapshot([sftp], [agent("a", 8)], usage=usage, default_quota=quota))
    )
    assert decisions.waits == []
    [cancelled] = decisions.cancellations
    assert cancelled.session_id == "sftp-2"
    assert "concurrent system sessions" in cancelled.reason
    # An interactive session held back by its own limit waits instead.
    held = session("busy")
    decisions = schedule(
        snapshot(
            [held],
            [agent("a", 8)],
            usage={"alice": OwnerUsage(slots(1), 1, 0, 0)},
            default_quota=Quota(None, 1, None, None, None),
        )
    )
    assert wait_of(decisions, "busy") and decisions.cancellations == []


def test_a_system_session_that_fits_nowhere_is_cancelled_and_never_queues_behind_a_head() -> None:
    head = session("big", cpu=16, minute=0)  # blocks the FIFO queue: no agent has 16 cpu free
    too_big = session("sftp-big", session_type="system", cpu=64, minute=1)
    small = session("sftp-small", session_type="system", cpu="0.25", minute=2)
    decisions = schedule(
        _with_system(snapshot([head, too_big, small], [agent("a", 8, used_cpu=4)]))
    )
    assert placed(decisions) == ["sftp-small"]
    assert [c.session_id for c in decisions.cancellations] == ["sftp-big"]
    assert wait_of(decisions, "big")
    # A type the group does not allow cancels it too, with that reason.
    decisions = schedule(snapshot([session("sftp-x", session_type="system")], [agent("a", 8)]))
    [cancelled] = decisions.cancellations
    assert "not allowed" in cancelled.reason
