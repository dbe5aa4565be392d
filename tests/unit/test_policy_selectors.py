"""Agent selectors behind one interface: what a plugin is offered, how the pass checks its answers,
pinned sessions, and a group whose selector could not be loaded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from test_policy_schedule import NOW, agent, agents_of, placed, session, snapshot, wait_of

from scheduler_app.policy import (
    AGENT_SELECTIONS,
    BUILTIN_AGENT_SELECTORS,
    AgentSelector,
    AgentSelectorOptionError,
    Cancellation,
    CandidateAgent,
    GroupConfig,
    PendingSession,
    Snapshot,
    UnavailableAgentSelector,
    Wait,
    place_kernels,
    schedule,
)

Answer = Mapping[str, str] | str


class Scripted(AgentSelector):
    """A plugin whose answer is a function of what it is offered; it records every call."""

    def __init__(self, answer: Callable[[PendingSession, Sequence[CandidateAgent], bool], Any]):
        super().__init__({})
        self.answer = answer
        self.calls: list[tuple[str, list[str], bool]] = []

    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Answer:
        self.calls.append((session.session_id, [a.agent_id for a in agents], one_agent))
        return self.answer(session, agents, one_agent)  # type: ignore[no-any-return]


def last_agent(s: PendingSession, agents: Sequence[CandidateAgent], one_agent: bool) -> Answer:
    """Everything on the last agent offered (agent_id order: the "largest" name)."""
    return {k.kernel_id: agents[-1].agent_id for k in s.kernels}


def with_selector(snap: Snapshot, selector: AgentSelector, name: str = "plugin") -> Snapshot:
    return replace(snap, group=replace(snap.group, agent_selection=name, agent_selector=selector))


AGENTS = [agent("a1", 8, used_cpu=6), agent("a2", 8, used_cpu=2), agent("a3", 8, used_cpu=4)]


# --- the interface ----------------------------------------------------------------------------


def test_the_built_ins_are_registered_under_their_names() -> None:
    assert set(BUILTIN_AGENT_SELECTORS) == set(AGENT_SELECTIONS)
    assert AGENT_SELECTIONS == ("concentrated", "dispersed", "roundrobin")


@pytest.mark.parametrize("name", AGENT_SELECTIONS)
def test_a_built_in_refuses_options_naming_the_first_one(name: str) -> None:
    with pytest.raises(AgentSelectorOptionError, match="option 'colour': unknown option") as caught:
        BUILTIN_AGENT_SELECTORS[name]({"size": 1, "colour": "red"})
    assert caught.value.option == "colour"


@pytest.mark.parametrize(
    ("name", "expected"), [("concentrated", "t1"), ("dispersed", "t3"), ("roundrobin", "t1")]
)
def test_on_a_tie_a_built_in_picks_the_same_agent_through_select_as_on_its_fast_path(
    name: str, expected: str
) -> None:
    twins = [agent("t1", 8, used_cpu=2), agent("t2", 8, used_cpu=2), agent("t3", 8, used_cpu=2)]
    s = session("s", cpu=2)
    selector = BUILTIN_AGENT_SELECTORS[name]({})
    assert place_kernels(s, twins, name) == {"s": expected}
    candidates = [CandidateAgent(a.agent_id, a.capacity, a.capacity - a.occupied) for a in twins]
    assert selector.select(s, candidates, one_agent=True) == {"s": expected}


def test_a_built_ins_select_gives_a_reason_when_nothing_fits() -> None:
    candidates = [CandidateAgent(a.agent_id, a.capacity, a.capacity - a.occupied) for a in AGENTS]
    reason = BUILTIN_AGENT_SELECTORS["concentrated"]({}).select(
        session("s", cpu=7), candidates, one_agent=True
    )
    assert reason == "no candidate agent has 7 cpu and 1 GiB mem free"


def test_a_group_may_name_any_selector_it_is_given() -> None:
    group = GroupConfig("g", "fifo", 0, "my-plugin", frozenset(), None, 0, Scripted(last_agent))
    assert group.agent_selection == "my-plugin"


def test_a_plugins_answer_decides_where_the_kernels_go() -> None:
    selector = Scripted(last_agent)
    decisions = schedule(with_selector(snapshot([session("s", cpu=2)], AGENTS), selector))
    # concentrated would have picked a1 (fewest free); the plugin picks the last offered.
    assert agents_of(decisions, "s") == ["a3"]
    assert selector.calls == [("s", ["a1", "a2", "a3"], True)]


def test_a_plugin_is_offered_only_the_agents_that_can_hold_a_single_node_session() -> None:
    selector = Scripted(last_agent)
    s = session("s", cpu=2, size=2)  # 4 cpu on one agent: a2 (6 free) and a3 (4 free)
    decisions = schedule(with_selector(snapshot([s], AGENTS), selector))
    assert selector.calls == [("s", ["a2", "a3"], True)]
    assert agents_of(decisions, "s") == ["a3", "a3"]


def test_a_plugin_sees_free_slots_that_include_what_the_pass_already_placed() -> None:
    seen: list[dict[str, str]] = []

    def record(s: PendingSession, agents: Sequence[CandidateAgent], one_agent: bool) -> Answer:
        seen.append({a.agent_id: a.free.to_dict()["cpu"] for a in agents})
        return last_agent(s, agents, one_agent)

    pending = [session("first", minute=0, cpu=3), session("second", minute=1, cpu=3)]
    schedule(with_selector(snapshot(pending, AGENTS), Scripted(record)))
    assert seen == [{"a2": "6", "a3": "4"}, {"a2": "6"}]


def test_a_multi_node_session_is_offered_one_agent_first_then_a_spread() -> None:
    agents = [agent("a1", 8, used_cpu=4), agent("a2", 8, used_cpu=5)]
    s = session("s", cpu=2, size=3, mode="multi-node")  # 6 cpu: no agent holds it all

    def spread(s: PendingSession, agents: Sequence[CandidateAgent], one_agent: bool) -> Answer:
        return {"s": "a1", "s-sub1": "a1", "s-sub2": "a2"}

    selector = Scripted(spread)
    decisions = schedule(with_selector(snapshot([s], agents), selector))
    assert selector.calls == [("s", ["a1", "a2"], False)]
    assert agents_of(decisions, "s") == ["a1", "a1", "a2"]

    selector = Scripted(last_agent)
    roomy = [*agents, agent("a3", 8)]
    schedule(with_selector(snapshot([s], roomy), selector))
    assert selector.calls == [("s", ["a3"], True)]


def test_accelerator_agents_are_offered_to_a_cpu_session_only_after_the_cpu_agents() -> None:
    agents = [agent("cpu1", 4, used_cpu=3), agent("gpu1", 32, gpu=4)]
    selector = Scripted(lambda s, agents, one: "not these")
    decisions = schedule(with_selector(snapshot([session("s", cpu=1)], agents), selector))
    assert [call[1] for call in selector.calls] == [["cpu1"], ["gpu1"]]
    assert wait_of(decisions, "s") == Wait("s", "not these", True)

    selector = Scripted(last_agent)
    gpu_session = session("g", cpu=1, gpu=1)
    schedule(with_selector(snapshot([gpu_session], agents), selector))
    assert [call[1] for call in selector.calls] == [["gpu1"]]


def test_a_selector_that_advances_the_cursor_is_offered_agents_from_it() -> None:
    class Turns(Scripted):
        advances_cursor = True

    selector = Turns(lambda s, agents, one: {k.kernel_id: agents[0].agent_id for k in s.kernels})
    snap = with_selector(snapshot([session("s", cpu=1)], AGENTS, cursor=2), selector)
    decisions = schedule(snap)
    assert selector.calls == [("s", ["a3", "a1", "a2"], True)]
    assert agents_of(decisions, "s") == ["a3"]
    assert decisions.roundrobin_cursor == 0


def test_place_kernels_takes_a_plugin_too() -> None:
    s = session("s", cpu=2)
    assert place_kernels(s, AGENTS, "plugin", agent_selector=Scripted(last_agent)) == {"s": "a3"}


# --- the pass checks every answer ---------------------------------------------------------------


def test_an_answer_that_would_oversubscribe_an_agent_is_refused() -> None:
    agents = [agent("a1", 8, used_cpu=6), agent("a2", 8, used_cpu=5)]
    s = session("s", cpu=2, size=2, mode="multi-node")  # 4 cpu: no agent holds both kernels
    selector = Scripted(lambda sess, agents, one: {"s": "a1", "s-sub1": "a1"})
    decisions = schedule(with_selector(snapshot([s], agents), selector))
    assert selector.calls == [("s", ["a1", "a2"], False)]
    assert decisions.waits == [
        Wait(
            "s",
            "agent selector plugin gave an unusable answer: 4 cpu and 2 GiB mem on agent a1, "
            "which has 2 cpu free",
            True,
        )
    ]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"s": "a2"}, "no agent for kernel s-sub1"),
        (
            {"s": "a2", "s-sub1": "a2", "s-sub2": "a2"},
            "an agent for 's-sub2', which is not a kernel of the session",
        ),
        ({"s": "a2", "s-sub1": "a1"}, "agent 'a1' for kernel s-sub1, which was not offered"),
        ({"s": "a2", "s-sub1": "a3"}, "several agents for a session that must stay on one"),
        (None, "NoneType instead of placements or a reason"),
        (["a2"], "list instead of placements or a reason"),
    ],
)
def test_an_unusable_answer_is_a_wait_with_the_reason_and_the_pass_goes_on(
    answer: object, problem: str
) -> None:
    s = session("s", cpu=2, size=2)  # offered a2 and a3, the agents that hold 4 cpu
    selector = Scripted(
        lambda sess, agents, one: (
            answer if sess.session_id == "s" else last_agent(sess, agents, one)
        )
    )
    pending = [s, session("other", minute=1, cpu=1)]
    decisions = schedule(with_selector(snapshot(pending, AGENTS), selector))
    assert wait_of(decisions, "s") == Wait(
        "s", f"agent selector plugin gave an unusable answer: {problem}", True
    )
    assert placed(decisions) == ["other"], "an unusable answer must not hold up the queue"


def test_a_plugin_that_raises_leaves_its_session_waiting_with_the_error() -> None:
    def boom(s: PendingSession, agents: Sequence[CandidateAgent], one_agent: bool) -> Answer:
        raise RuntimeError("label index is empty")

    decisions = schedule(with_selector(snapshot([session("s")], AGENTS), Scripted(boom)))
    assert decisions.waits == [
        Wait("s", "agent selector plugin failed: RuntimeError: label index is empty", True)
    ]


def test_a_plugins_reason_is_shown_and_blocks_the_fifo_queue_like_a_shortage() -> None:
    def picky(s: PendingSession, agents: Sequence[CandidateAgent], one_agent: bool) -> Answer:
        if s.session_id == "head":
            return "no agent with label gpu-model=a100"
        return last_agent(s, agents, one_agent)

    pending = [session("head", minute=0), session("next", minute=1)]
    decisions = schedule(with_selector(snapshot(pending, AGENTS), Scripted(picky)))
    assert wait_of(decisions, "head") == Wait("head", "no agent with label gpu-model=a100", True)
    assert wait_of(decisions, "next").reason == (
        "queued behind session head which waits for resources"
    )


# --- a selector that could not be loaded ---------------------------------------------------------


def test_a_group_whose_selector_is_unavailable_waits_every_session_without_blocking() -> None:
    unavailable = UnavailableAgentSelector("agent selector 'gone' is not installed")
    pending = [
        session("s1", minute=0),
        session("s2", minute=1),
        session("late", minute=-120),
    ]
    snap = with_selector(
        snapshot(pending, AGENTS, pending_timeout=timedelta(minutes=90)), unavailable, "gone"
    )
    decisions = schedule(snap)
    assert decisions.placements == []
    assert decisions.waits == [
        Wait("s1", "agent selector 'gone' is not installed", False),
        Wait("s2", "agent selector 'gone' is not installed", False),
    ]
    # The checks before placement still apply.
    assert decisions.cancellations == [
        Cancellation("late", "pending timeout: waited longer than 1 h 30 min")
    ]


# --- pinned sessions (an admin's designation) ----------------------------------------------------


def pinned(s: PendingSession, *agent_ids: str) -> PendingSession:
    return replace(s, pinned_agents=agent_ids)


@pytest.mark.parametrize("agent_selection", AGENT_SELECTIONS)
def test_a_pinned_session_goes_only_to_its_agents(agent_selection: str) -> None:
    s = pinned(session("s", cpu=2), "a3")
    decisions = schedule(snapshot([s], AGENTS, agent_selection=agent_selection))
    assert agents_of(decisions, "s") == ["a3"]


def test_among_its_agents_a_pinned_session_follows_the_groups_selector() -> None:
    s = pinned(session("s", cpu=1), "a2", "a3")
    assert agents_of(schedule(snapshot([s], AGENTS)), "s") == ["a3"]
    dispersed = snapshot([s], AGENTS, agent_selection="dispersed")
    assert agents_of(schedule(dispersed), "s") == ["a2"]


def test_a_plugin_is_offered_only_the_pinned_agents() -> None:
    selector = Scripted(last_agent)
    s = pinned(session("s", cpu=1), "a1", "a2", "elsewhere")
    decisions = schedule(with_selector(snapshot([s], AGENTS), selector))
    assert selector.calls == [("s", ["a1", "a2"], True)]
    assert agents_of(decisions, "s") == ["a2"]


@pytest.mark.parametrize(
    ("pending_session", "reason"),
    [
        (
            pinned(session("s", cpu=5), "a1", "a3"),
            "pinned to agents a1, a3: none of them has 5 cpu free",
        ),
        (pinned(session("s", cpu=4), "a1"), "pinned to agent a1: it does not have 4 cpu free"),
        (
            pinned(session("s", cpu=3, size=2), "a1", "a3"),
            "pinned to agents a1, a3: none of them has 6 cpu free",
        ),
        (
            pinned(session("s", cpu=3, size=3, mode="multi-node"), "a1", "a3"),
            "pinned to agents a1, a3: its 3 containers do not fit on them at once",
        ),
        (
            pinned(session("s", gpu=1), "a2"),
            "pinned to agent a2: it does not have 1 cuda.device free",
        ),
        (
            pinned(session("s"), "ghost", "gone"),
            "pinned to agents ghost, gone: none of them is alive and schedulable "
            "in resource group default",
        ),
        (
            pinned(session("s"), "ghost"),
            "pinned to agent ghost: it is not alive and schedulable in resource group default",
        ),
    ],
)
def test_a_pinned_session_that_does_not_fit_waits_naming_its_agents(
    pending_session: PendingSession, reason: str
) -> None:
    decisions = schedule(snapshot([pending_session], AGENTS))
    assert decisions.waits == [Wait("s", reason, True)]


def test_a_waiting_pinned_session_does_not_hold_up_the_fifo_queue() -> None:
    pending = [pinned(session("head", minute=0, cpu=4), "a1"), session("next", minute=1, cpu=4)]
    decisions = schedule(snapshot(pending, AGENTS))
    assert placed(decisions) == ["next"]


def test_a_plugins_reason_for_a_pinned_session_names_the_agents() -> None:
    selector = Scripted(lambda s, agents, one: "they are being drained")
    decisions = schedule(with_selector(snapshot([pinned(session("s"), "a2")], AGENTS), selector))
    assert wait_of(decisions, "s").reason == "pinned to agent a2: they are being drained"


# --- pending timeout ---------------------------------------------------------------------------


def test_a_pending_timeout_of_zero_means_no_timeout() -> None:
    old = session("old", minute=-10_000, cpu=64)  # waits for resources, a week long
    for timeout in (timedelta(0), None):
        decisions = schedule(snapshot([old], AGENTS, pending_timeout=timeout))
        assert decisions.cancellations == []
        assert [w.session_id for w in decisions.waits] == ["old"]
    decisions = schedule(snapshot([old], AGENTS, pending_timeout=timedelta(seconds=1)))
    assert [c.session_id for c in decisions.cancellations] == ["old"]
    assert NOW - old.created_at > timedelta(days=6)
