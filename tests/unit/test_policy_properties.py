"""Properties of `schedule` over random snapshots: the invariants the dispatcher relies on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app.policy import (
    AGENT_SELECTIONS,
    BUILTIN_AGENT_SELECTORS,
    SESSION_SELECTIONS,
    AgentSelector,
    AgentState,
    CandidateAgent,
    Decisions,
    DependencyState,
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
T0 = datetime(2025, 3, 1, tzinfo=UTC)
OWNERS = ("u1", "u2", "u3")
DEPENDENCIES = {
    "d-success": DependencyState("TERMINATED", "SUCCESS"),
    "d-running": DependencyState("RUNNING", "UNDEFINED"),
    "d-failed": DependencyState("TERMINATED", "FAILED"),
}

# Most sessions should get through the checks to placement, where the interesting failures are.
# (Hypothesis favours boundary values, so weights are spelled out as repeated choices.)
rarely = st.sampled_from((False,) * 5 + (True,))
quarters = st.integers(0, 24).map(lambda q: Decimal(q) / 4)  # cpu 0..6 in steps of 0.25


@st.composite
def resource_slots(draw: st.DrawFn, *, max_gpu: int = 2) -> ResourceSlots:
    values: dict[str, Decimal | int] = {"cpu": draw(quarters), "mem": draw(st.integers(0, 8)) * GIB}
    if draw(st.booleans()):
        values["cuda.device"] = draw(st.integers(0, max_gpu))
    return ResourceSlots.from_mapping(values)


@st.composite
def agent_states(draw: st.DrawFn, agent_id: str) -> AgentState:
    capacity = {"cpu": draw(st.integers(0, 64)), "mem": draw(st.integers(0, 32)), "gpu": 0}
    if draw(st.integers(0, 3)) == 0:
        capacity["gpu"] = draw(st.integers(1, 4))
    used = {slot: draw(st.integers(0, amount)) for slot, amount in capacity.items()}

    def to_slots(v: dict[str, int]) -> ResourceSlots:
        return ResourceSlots.from_mapping(
            {"cpu": Decimal(v["cpu"]) / 4, "mem": v["mem"] * GIB, "cuda.device": v["gpu"]}
        )

    return AgentState(agent_id, to_slots(capacity), to_slots(used))


@st.composite
def pending_sessions(draw: st.DrawFn, session_id: str) -> PendingSession:
    size = draw(st.integers(1, 4))
    if draw(st.booleans()):
        per_kernel = [draw(resource_slots())] * size
    else:
        per_kernel = [draw(resource_slots()) for _ in range(size)]
    kernels = tuple(
        KernelRequest(session_id if i == 0 else f"{session_id}.{i}", slots)
        for i, slots in enumerate(per_kernel)
    )
    return PendingSession(
        session_id=session_id,
        owner_id=draw(st.sampled_from(OWNERS)),
        created_at=T0 + timedelta(minutes=draw(st.integers(0, 30))),
        session_type=draw(
            st.sampled_from(("interactive",) * 6 + ("batch", "batch", "system", "inference"))
        ),
        cluster_mode=draw(st.sampled_from(("single-node", "multi-node"))),
        kernels=kernels,
        attempts=draw(st.integers(0, 4)),
        depends_on=tuple(draw(st.lists(st.sampled_from([*DEPENDENCIES, "d-missing"]), max_size=2)))
        if draw(rarely)
        else (),
        starts_at=T0 + timedelta(minutes=draw(st.integers(0, 120))) if draw(rarely) else None,
    )


limits = st.sampled_from((None, None, None, 0, 1, 2, 3, 5))
# Large enough that several sessions fit, small enough that a few of them together do not.
quota_slots = st.builds(
    lambda cpu, mem, gpu: ResourceSlots.from_mapping(
        {"cpu": Decimal(cpu) / 4, "mem": mem * GIB, "cuda.device": gpu}
    ),
    st.integers(0, 64),
    st.integers(0, 24),
    st.integers(0, 4),
)
quotas = st.builds(
    Quota,
    total_slots=st.sampled_from((None, None, None)) | quota_slots,
    max_concurrent_sessions=limits,
    max_pending_sessions=limits,
    max_containers_per_session=st.sampled_from((None, None, 1, 2, 4)),
    allowed_resource_groups=st.sampled_from((None,) * 6 + (frozenset({"g"}), frozenset({"other"}))),
    max_concurrent_system_sessions=limits,
)


binding_quotas = st.builds(
    Quota,
    total_slots=quota_slots,
    max_concurrent_sessions=st.sampled_from((None, 1, 2, 3, 5)),
    max_pending_sessions=st.none(),
    max_containers_per_session=st.none(),
    allowed_resource_groups=st.none(),
)


@st.composite
def snapshots(draw: st.DrawFn, *, quota_focus: bool = False, pinning: bool = False) -> Snapshot:
    """Random snapshots; with quota_focus only the owners' quotas hold sessions back; with
    pinning some sessions are pinned to agents (some of which may not exist)."""
    n_agents = 0 if draw(rarely) else draw(st.integers(1, 6))
    agents = tuple(draw(agent_states(f"agent-{i}")) for i in range(n_agents))
    n_sessions = draw(st.integers(0, 14))
    pending = tuple(draw(pending_sessions(f"sess-{i:02d}")) for i in range(n_sessions))
    if pinning:
        agent_ids = [f"agent-{i}" for i in range(7)]
        pending = tuple(
            replace(s, pinned_agents=tuple(draw(st.lists(st.sampled_from(agent_ids), max_size=3))))
            for s in pending
        )
    if quota_focus:
        pending = tuple(
            replace(s, depends_on=(), starts_at=None, session_type="batch") for s in pending
        )
    owner_quotas = binding_quotas if quota_focus else quotas
    group = GroupConfig(
        name="g",
        session_selection=draw(st.sampled_from(SESSION_SELECTIONS)),
        num_retries_to_skip=draw(st.integers(0, 3)),
        agent_selection=draw(st.sampled_from(AGENT_SELECTIONS)),
        allowed_session_types=frozenset({"interactive", "batch", "system"}),
        pending_timeout=timedelta(minutes=draw(st.integers(10, 60)))
        if draw(rarely) and not quota_focus
        else None,
        roundrobin_cursor=draw(st.integers(0, 10)),
    )
    usage = {
        owner: OwnerUsage(
            draw(resource_slots()), draw(st.integers(0, 3)), 0, draw(st.integers(0, 1))
        )
        for owner in OWNERS
        if draw(st.booleans())
    }
    return Snapshot(
        group=group,
        now=T0 + timedelta(minutes=draw(st.integers(0, 90))),
        pending=pending,
        agents=agents,
        usage=usage,
        quotas={owner: draw(owner_quotas) for owner in OWNERS if draw(st.booleans())},
        dependencies=DEPENDENCIES,
        default_quota=draw(owner_quotas),
    )


def free_after(snapshot: Snapshot, decisions: Decisions) -> dict[str, ResourceSlots]:
    """Each agent's free slots once every placement is applied, in exact public arithmetic."""
    free = {a.agent_id: a.capacity - a.occupied for a in snapshot.agents}
    kernels = {k.kernel_id: k.slots for s in snapshot.pending for k in s.kernels}
    for placement in decisions.placements:
        for kernel_id, agent_id in placement.assignments.items():
            free[agent_id] = free[agent_id] - kernels[kernel_id]
    return free


def total(session: PendingSession) -> ResourceSlots:
    block = ResourceSlots.zero()
    for kernel in session.kernels:
        block = block + kernel.slots
    return block


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_no_agent_is_ever_oversubscribed(snapshot: Snapshot) -> None:
    for agent_id, free in free_after(snapshot, schedule(snapshot)).items():
        assert ResourceSlots.zero().fits_in(free), f"{agent_id} is oversubscribed: {free}"


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_placement_is_all_or_nothing(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    sessions = {s.session_id: s for s in snapshot.pending}
    agent_ids = {a.agent_id for a in snapshot.agents}
    for placement in decisions.placements:
        kernel_ids = {k.kernel_id for k in sessions[placement.session_id].kernels}
        assert set(placement.assignments) == kernel_ids
        assert set(placement.assignments.values()) <= agent_ids
        if sessions[placement.session_id].cluster_mode == "single-node":
            assert len(set(placement.assignments.values())) == 1


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_every_pending_session_gets_exactly_one_decision(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    decided = Counter(
        [p.session_id for p in decisions.placements]
        + [w.session_id for w in decisions.waits]
        + [c.session_id for c in decisions.cancellations]
    )
    assert decided == Counter(s.session_id for s in snapshot.pending)
    assert all(w.reason for w in decisions.waits)
    assert all(c.reason for c in decisions.cancellations)


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_a_session_waiting_for_resources_really_does_not_fit_anywhere(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    sessions = {s.session_id: s for s in snapshot.pending}
    free = free_after(snapshot, decisions).values()
    for wait in decisions.waits:
        if wait.counts_as_attempt:
            # Free space only shrinks during a pass, so what did not fit then does not fit now.
            block = total(sessions[wait.session_id])
            assert not any(block.fits_in(f) for f in free), wait


@settings(max_examples=150, deadline=None)
@given(st.one_of(snapshots(), snapshots(quota_focus=True)))
def test_placements_stay_within_the_owners_quota(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    sessions = {s.session_id: s for s in snapshot.pending}
    placed_slots: dict[str, ResourceSlots] = {}
    placed_count: Counter[str] = Counter()
    for placement in decisions.placements:
        s = sessions[placement.session_id]
        quota = snapshot.quotas.get(s.owner_id, snapshot.default_quota)
        assert quota.allowed_resource_groups is None or "g" in quota.allowed_resource_groups
        if quota.max_containers_per_session is not None:
            assert len(s.kernels) <= quota.max_containers_per_session
        if s.session_type == "system":
            continue
        placed_slots[s.owner_id] = placed_slots.get(s.owner_id, ResourceSlots.zero()) + total(s)
        placed_count[s.owner_id] += 1
    for owner, slots in placed_slots.items():
        quota = snapshot.quotas.get(owner, snapshot.default_quota)
        usage = snapshot.usage.get(owner, OwnerUsage(ResourceSlots.zero(), 0, 0))
        if quota.max_concurrent_sessions is not None:
            assert usage.active_sessions + placed_count[owner] <= quota.max_concurrent_sessions
        if quota.total_slots is not None:
            for name, amount in slots.items():
                assert usage.occupied[name] + amount <= quota.total_slots[name], (owner, name)


@settings(max_examples=100, deadline=None)
@given(snapshots(), st.randoms(use_true_random=False))
def test_decisions_do_not_depend_on_the_order_of_the_snapshot(
    snapshot: Snapshot, rng: object
) -> None:
    import random

    assert isinstance(rng, random.Random)
    agents, pending = list(snapshot.agents), list(snapshot.pending)
    rng.shuffle(agents)
    rng.shuffle(pending)
    shuffled = Snapshot(
        snapshot.group,
        snapshot.now,
        tuple(pending),
        tuple(agents),
        snapshot.usage,
        snapshot.quotas,
        snapshot.dependencies,
        snapshot.default_quota,
    )
    assert schedule(shuffled) == schedule(snapshot)


@settings(max_examples=150, deadline=None)
@given(snapshots(pinning=True))
def test_a_pinned_session_is_placed_only_on_its_agents_and_never_oversubscribes(
    snapshot: Snapshot,
) -> None:
    decisions = schedule(snapshot)
    sessions = {s.session_id: s for s in snapshot.pending}
    for placement in decisions.placements:
        pinned = sessions[placement.session_id].pinned_agents
        if pinned:
            assert set(placement.assignments.values()) <= set(pinned)
    for agent_id, free in free_after(snapshot, decisions).items():
        assert ResourceSlots.zero().fits_in(free), f"{agent_id} is oversubscribed: {free}"


class PlainOnly(AgentSelector):
    """A built-in seen only through the plain interface, as the pass sees a plugin."""

    def __init__(self, inner: AgentSelector) -> None:
        super().__init__({})
        self.inner = inner

    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Mapping[str, str] | str:
        return self.inner.select(session, agents, one_agent=one_agent)


class PlainOnlyTurns(PlainOnly):
    advances_cursor = True


@settings(max_examples=200, deadline=None)
@given(st.one_of(snapshots(), snapshots(pinning=True)))
def test_the_built_ins_choose_alike_through_select_and_on_their_fast_path(
    snapshot: Snapshot,
) -> None:
    inner = BUILTIN_AGENT_SELECTORS[snapshot.group.agent_selection]({})
    plain = (PlainOnlyTurns if inner.advances_cursor else PlainOnly)(inner)
    through_select = schedule(
        replace(snapshot, group=replace(snapshot.group, agent_selector=plain))
    )
    fast = schedule(snapshot)
    assert through_select.placements == fast.placements
    assert through_select.roundrobin_cursor == fast.roundrobin_cursor
    # The reasons may be worded differently (a system session that does not fit is cancelled
    # with its placement's reason); who waits or is cancelled, and whether it counts, may not.
    assert [c.session_id for c in through_select.cancellations] == [
        c.session_id for c in fast.cancellations
    ]
    assert [(w.session_id, w.counts_as_attempt) for w in through_select.waits] == [
        (w.session_id, w.counts_as_attempt) for w in fast.waits
    ]
