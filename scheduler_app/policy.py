"""Pure scheduling policy for one resource group: a snapshot in, decisions out.

This module imports nothing from Django. The dispatcher builds a `Snapshot` from the database (pending
sessions of one resource group, its live agents, per-owner usage and quotas, the states of the
sessions they depend on, and `now`), calls `schedule()`, and applies the returned `Decisions` in one
transaction, re-checking `occupied + requested <= capacity` when it writes.

One pass, in order:

1. Sessions are taken in the group's session-selection order:
   - ``fifo``: oldest first (``created_at``, then ``session_id``). A session that does not fit for
     lack of resources blocks every session behind it in this pass (head-of-line blocking, the
     documented trade-off). With ``num_retries_to_skip = N > 0`` the sessions that already failed
     more than N times (``attempts > N``) are moved behind the others, so later sessions that fit
     can start; among the moved sessions the same rule applies.
   - ``lifo``: newest first. A session that does not fit does not block the others.
   - ``drf``: the owner with the smallest dominant share goes first (their usage in every group plus
     what this pass placed for them, against this group's total agent capacity; ties go to the owner
     whose next session is oldest), FIFO within an owner, re-evaluated after every placement. A
     session that does not fit does not block the others.
   ``num_retries_to_skip`` only matters for ``fifo``. Only a shortage of resources blocks: a session
   held back by a check (quota, dependencies, start time, ...) waits alone.
   A session that could not fit even on an empty agent of this group does not block either: waiting
   cannot help it, so it must not hold up everyone behind it.
2. Checks, the first failure decides: session type allowed in the group; resource group allowed by
   the owner's quota; dependencies (cancelled when one ended without success or does not exist);
   requested start time; pending timeout (cancelled; a timeout of 0 means none); quota (containers per session, concurrent
   sessions, total slots -- counting what this pass already placed for the owner). ``system``
   sessions are exempt from the concurrency and total-slot quotas and are counted against
   ``max_concurrent_system_sessions`` instead. A ``system`` session never waits: a failed
   check or a placement that does not fit cancels it at once with the reason (an SFTP session
   is asked for now; starting it minutes later, unannounced, would help nobody), and it never
   queues behind a blocked head.
3. Placement, all-or-nothing, never oversubscribing: single-node needs one agent that holds the sum of
   all kernels; multi-node puts all kernels on one agent when one holds the sum, otherwise places
   them kernel by kernel (several per agent allowed). Agents with an accelerator are used for
   sessions that request none only when no CPU-only agent will do. A session pinned to agents
   (``pinned_agents``, an admin's designation) goes only there, and otherwise waits, naming them.
   These rules are the pass's; which agent is chosen is the group's `AgentSelector`'s. Built in:
   ``concentrated`` (the fitting agent with the least free cpu, then mem), ``dispersed`` (the most
   free), ``roundrobin`` (the next fitting agent, in ``agent_id`` order, from the cursor; the new
   cursor is returned). Any other selector is a plugin behind the same interface; the pass checks
   its every answer and treats an unusable one as "did not fit", with the reason.

Every pending session gets exactly one decision: a `Placement`, a `Wait` (with a human reason; it
counts as a scheduling attempt only when the session itself was short of resources) or a
`Cancellation`.

Speed: decimal slot values are scaled to integers once per pass (exactly: each slot is scaled by
10 ** its largest number of decimal places in the snapshot), agents are kept in two indexes (CPU-only
and with accelerators) sorted by free cpu and mem, and a request shape that did not fit is remembered
for the rest of the pass -- nothing is freed during a pass, so the same shape cannot fit later. The
built-in selectors choose on those integer indexes directly; the plain interface (exact slots) is
used for plugins and for pinned sessions.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Context, Decimal, DivisionByZero, Inexact, InvalidOperation, Overflow
from fractions import Fraction
from functools import partial
from itertools import chain
from typing import ClassVar

from bai_common.units import (
    MAX_AMOUNT_DIGITS,
    MAX_AMOUNT_PLACES,
    format_amount,
    format_duration,
    format_slot,
)
from sessions_app.policy import (
    DependencyState,
    capacity_refusal,
    concurrent_refusal,
    containers_refusal,
    dependencies_verdict,
    dependencies_wait,
    free_shortage,
    no_live_agent,
    queued_behind,
    start_time_wait,
    total_slots_refusal,
)

__all__ = [
    "AGENT_SELECTIONS",
    "BUILTIN_AGENT_SELECTORS",
    "CLUSTER_MODES",
    "SESSION_SELECTIONS",
    "AgentSelector",
    "AgentSelectorOptionError",
    "AgentState",
    "CandidateAgent",
    "ConcentratedSelector",
    "DispersedSelector",
    "Cancellation",
    "Decisions",
    "DependencyState",
    "GroupConfig",
    "KernelRequest",
    "OwnerUsage",
    "PendingSession",
    "Placement",
    "Quota",
    "ResourceSlots",
    "RoundRobinSelector",
    "Snapshot",
    "UnavailableAgentSelector",
    "Wait",
    "check_session",
    "order_sessions",
    "place_kernels",
    "schedule",
]

SESSION_SELECTIONS = ("fifo", "lifo", "drf")
CLUSTER_MODES = ("single-node", "multi-node")
SYSTEM_SESSION_TYPE = "system"

# Slot arithmetic is exact: an operation that would round raises instead.
_EXACT = Context(prec=80, traps=[Inexact, InvalidOperation, Overflow, DivisionByZero])
# Ratios (dominant shares) are reported, not accumulated, so rounding them is fine.
_RATIO = Context(prec=28)
_ZERO = Decimal(0)
_NON_ACCELERATOR_SLOTS = frozenset({"cpu", "mem"})


def _decimal_text(value: Decimal) -> str:
    return format(_EXACT.normalize(value), "f")


class ResourceSlots:
    """An immutable amount of resources per slot name, with exact decimal arithmetic.

    A missing slot counts as 0 and zero slots are not stored. Values built with `from_mapping` are
    finite and non-negative; subtraction may produce negative values (e.g. free = capacity - occupied
    on an overcommitted agent), which never fit anywhere.
    """

    __slots__ = ("_hash", "_items")
    _items: tuple[tuple[str, Decimal], ...]
    _hash: int

    def __init__(self) -> None:
        raise TypeError("use ResourceSlots.from_mapping() or ResourceSlots.zero()")

    @classmethod
    def _make(cls, items: Iterable[tuple[str, Decimal]]) -> ResourceSlots:
        kept = tuple(sorted((name, _EXACT.normalize(value)) for name, value in items if value))
        obj = object.__new__(cls)
        object.__setattr__(obj, "_items", kept)
        object.__setattr__(obj, "_hash", hash(kept))
        return obj

    @classmethod
    def zero(cls) -> ResourceSlots:
        return _ZERO_SLOTS

    @classmethod
    def from_mapping(cls, values: Mapping[str, str | int | Decimal]) -> ResourceSlots:
        """Parse ``{"cpu": "2", "mem": 1073741824}``; raise ValueError naming the bad slot."""
        items: list[tuple[str, Decimal]] = []
        for name, raw in values.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"slot name {name!r} must be a non-empty string")
            if isinstance(raw, bool) or not isinstance(raw, str | int | Decimal):
                # One exception type for every bad value: callers parse JSON and admin input.
                raise ValueError(f"slot {name}: {raw!r} is not a decimal number")  # noqa: TRY004
            try:
                value = Decimal(raw.strip()) if isinstance(raw, str) else Decimal(raw)
            except InvalidOperation:
                raise ValueError(f"slot {name}: {raw!r} is not a decimal number") from None
            if not value.is_finite():
                raise ValueError(f"slot {name}: {raw!r} is not a finite number")
            if value < 0:
                raise ValueError(f"slot {name}: {raw!r} is negative")
            if value:
                value = _EXACT.normalize(value)
                exponent = value.as_tuple().exponent
                assert isinstance(exponent, int)
                if -exponent > MAX_AMOUNT_PLACES or value.adjusted() >= MAX_AMOUNT_DIGITS:
                    raise ValueError(f"slot {name}: {raw!r} is out of range")
            items.append((name, value))
        return cls._make(items)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ResourceSlots is immutable")

    def __reduce__(self) -> tuple[object, tuple[tuple[tuple[str, Decimal], ...]]]:
        return (_slots_from_items, (self._items,))

    def __getitem__(self, name: str) -> Decimal:
        for slot, value in self._items:
            if slot == name:
                return value
        return _ZERO

    def items(self) -> tuple[tuple[str, Decimal], ...]:
        """The non-zero slots, sorted by name."""
        return self._items

    def to_dict(self) -> dict[str, str]:
        return {name: _decimal_text(value) for name, value in self._items}

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        return self._hash == other._hash and self._items == other._items

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"ResourceSlots({self.to_dict()!r})"

    def _combine(self, other: ResourceSlots, sign: int) -> ResourceSlots:
        acc = dict(self._items)
        for name, value in other._items:
            current = acc.get(name, _ZERO)
            acc[name] = _EXACT.add(current, value) if sign > 0 else _EXACT.subtract(current, value)
        return ResourceSlots._make(acc.items())

    def __add__(self, other: ResourceSlots) -> ResourceSlots:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        return self._combine(other, 1)

    def __sub__(self, other: ResourceSlots) -> ResourceSlots:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        return self._combine(other, -1)

    def __mul__(self, factor: int) -> ResourceSlots:
        if isinstance(factor, bool) or not isinstance(factor, int):
            return NotImplemented
        if factor < 0:
            raise ValueError(f"cannot multiply resource slots by a negative number ({factor})")
        return ResourceSlots._make(
            (name, _EXACT.multiply(value, Decimal(factor))) for name, value in self._items
        )

    __rmul__ = __mul__

    def fits_in(self, other: ResourceSlots) -> bool:
        """True when every slot of self is <= the same slot of other."""
        return all(self[name] <= other[name] for name in self.names() | other.names())

    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self._items)

    def shortfall(self, free: ResourceSlots) -> dict[str, Decimal]:
        """What is missing from ``free`` to hold self: slot -> amount, only slots that are short."""
        missing: dict[str, Decimal] = {}
        for name in sorted(self.names() | free.names()):
            gap = _EXACT.subtract(self[name], free[name])
            if gap > 0:
                missing[name] = _EXACT.normalize(gap)
        return missing

    def dominant_share(self, total: ResourceSlots) -> Decimal:
        """The largest ratio self[slot] / total[slot] over the slots that total has (0 if none)."""
        best = _ZERO
        for name, value in self._items:
            available = total[name]
            if available > 0:
                best = max(best, _RATIO.divide(value, available))
        return best

    @property
    def has_accelerator(self) -> bool:
        """True when any slot other than cpu and mem is positive."""
        return any(value > 0 for name, value in self._items if name not in _NON_ACCELERATOR_SLOTS)


_ZERO_SLOTS = ResourceSlots._make(())


def _slots_from_items(items: tuple[tuple[str, Decimal], ...]) -> ResourceSlots:
    # A plain function for pickle: some libraries (twisted) break pickling of bound classmethods.
    return ResourceSlots._make(items)


# --- snapshot ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KernelRequest:
    kernel_id: str
    slots: ResourceSlots


@dataclass(frozen=True, slots=True)
class PendingSession:
    """A pending session. ``attempts``: how many passes it already failed for lack of resources;
    ``pinned_agents``: when not empty, the only agents it may go to (an admin's designation)."""

    session_id: str
    owner_id: str
    created_at: datetime
    session_type: str
    cluster_mode: str
    kernels: tuple[KernelRequest, ...]
    attempts: int
    depends_on: tuple[str, ...] = ()
    starts_at: datetime | None = None
    pinned_agents: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cluster_mode not in CLUSTER_MODES:
            raise ValueError(
                f"session {self.session_id}: unknown cluster mode {self.cluster_mode!r}"
            )
        if not self.kernels:
            raise ValueError(f"session {self.session_id} has no kernels")


@dataclass(frozen=True, slots=True)
class AgentState:
    agent_id: str
    capacity: ResourceSlots
    occupied: ResourceSlots


@dataclass(frozen=True, slots=True)
class OwnerUsage:
    """What an owner holds now, in every resource group.

    ``occupied``: slots of their sessions from SCHEDULED up to RUNNING; ``active_sessions``: their
    non-pending, non-terminal sessions (system sessions excluded, they are counted in
    ``active_system_sessions``); ``pending_sessions``: their PENDING sessions.
    """

    occupied: ResourceSlots
    active_sessions: int
    pending_sessions: int
    active_system_sessions: int = 0


@dataclass(frozen=True, slots=True)
class Quota:
    """A resource policy; None means unlimited. In ``total_slots`` a missing slot allows 0."""

    total_slots: ResourceSlots | None
    max_concurrent_sessions: int | None
    max_pending_sessions: int | None
    max_containers_per_session: int | None
    allowed_resource_groups: frozenset[str] | None
    max_concurrent_system_sessions: int | None = None


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A resource group's scheduler settings.

    ``agent_selection`` names the agent selector; ``agent_selector`` is that selector, built with the
    group's options (None: the built-in of that name, without options). ``pending_timeout``: None
    or zero means no timeout.
    """

    name: str
    session_selection: str
    num_retries_to_skip: int
    agent_selection: str
    allowed_session_types: frozenset[str]
    pending_timeout: timedelta | None
    roundrobin_cursor: int = 0
    agent_selector: AgentSelector | None = None

    def __post_init__(self) -> None:
        if self.session_selection not in SESSION_SELECTIONS:
            raise ValueError(f"unknown session selection {self.session_selection!r}")
        if self.agent_selector is None and self.agent_selection not in AGENT_SELECTIONS:
            raise ValueError(f"unknown agent selection {self.agent_selection!r}")
        if self.num_retries_to_skip < 0:
            raise ValueError("num_retries_to_skip must be >= 0")


@dataclass(frozen=True, slots=True)
class Snapshot:
    group: GroupConfig
    now: datetime
    pending: tuple[PendingSession, ...]
    agents: tuple[AgentState, ...]
    usage: Mapping[str, OwnerUsage]
    quotas: Mapping[str, Quota]
    dependencies: Mapping[str, DependencyState]
    default_quota: Quota


# --- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    session_id: str
    assignments: dict[str, str]  # kernel_id -> agent_id


@dataclass(frozen=True, slots=True)
class Wait:
    session_id: str
    reason: str
    counts_as_attempt: bool


@dataclass(frozen=True, slots=True)
class Cancellation:
    session_id: str
    reason: str


@dataclass(slots=True)
class Decisions:
    """Placements in the order they were made; one Wait or Cancellation per other session."""

    placements: list[Placement] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    cancellations: list[Cancellation] = field(default_factory=list)
    roundrobin_cursor: int = 0


# --- formatting -------------------------------------------------------------------------------


def _short(session_id: str) -> str:
    return session_id[:8]


def _fifo_key(session: PendingSession) -> tuple[datetime, str]:
    return (session.created_at, session.session_id)


# --- agent selectors --------------------------------------------------------------------------


class AgentSelectorOptionError(ValueError):
    """A selector refused one of its options; the message names the option and says why."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"option {option!r}: {problem}")
        self.option = option
        self.problem = problem


@dataclass(frozen=True, slots=True)
class CandidateAgent:
    """An agent a selector may choose: its capacity and what is free on it at this point of the
    pass (capacity minus what it held and what the pass already placed there; exact)."""

    agent_id: str
    capacity: ResourceSlots
    free: ResourceSlots


class AgentSelector(ABC):
    """Chooses the agents for the kernels of one session.

    A selector is registered by name (entry point group ``backendai_web.agent_selectors``) and built
    once per pass with the resource group's options: ``__init__`` validates them and raises
    `AgentSelectorOptionError` naming a bad one (this base class accepts none).

    The cluster rules stay the pass's. It calls `select` once per stage, with only the candidates
    of that stage, in ``agent_id`` order (starting at the group's round-robin cursor when
    ``advances_cursor`` is set; the pass then moves the cursor past the agent of the last entry of
    each answer it uses):

    - ``one_agent=True``: every kernel must go to the same agent, and every candidate can hold them
      all. Asked for single-node sessions, and first for multi-node ones.
    - ``one_agent=False``: a multi-node session that no single candidate holds; kernels may go to
      different agents, several to one agent.

    CPU-only agents are offered first; agents with accelerators come in a later stage for a session
    that requests none. A session pinned to agents is offered only those.

    Returns kernel_id -> agent_id for every kernel of the session, or a human reason why not (shown
    to the user while the session waits). The pass checks every answer -- each kernel once, only
    candidates, one agent when asked, never more than an agent has free -- and treats an unusable
    answer or an exception as "did not fit", with the reason.
    """

    advances_cursor: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, object]) -> None:
        if options:
            raise AgentSelectorOptionError(min(options), "unknown option; this selector takes none")

    @abstractmethod
    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Mapping[str, str] | str:
        """Where each kernel of ``session`` goes among ``agents``, or why it cannot go."""


class UnavailableAgentSelector(AgentSelector):
    """Stands in for a selector the dispatcher could not load or build: every session that gets
    to placement waits with ``reason``, without counting an attempt (the fault is the group's)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Mapping[str, str] | str:
        return self.reason


def _fits(demand: ResourceSlots, free: ResourceSlots) -> bool:
    """The pass's rule in exact slots: cpu and mem always, other slots where demanded."""
    if demand["cpu"] > free["cpu"] or demand["mem"] > free["mem"]:
        return False
    return all(
        free[name] >= value for name, value in demand.items() if name not in _NON_ACCELERATOR_SLOTS
    )


def _describe_slots(slots: ResourceSlots) -> str:
    parts = [format_slot(name, value) for name, value in slots.items()]
    return " and ".join(parts) if parts else "nothing"


def _total(session: PendingSession) -> ResourceSlots:
    block = session.kernels[0].slots
    for kernel in session.kernels[1:]:
        block = block + kernel.slots
    return block


class _BuiltinSelector(AgentSelector):
    """A built-in selector. Besides the plain `select`, it has a fast path that the pass calls
    directly on its integer vectors and sorted pools (`find`); both choose alike, which a property
    test holds them to."""

    def find(self, state: _Pass, vector: _Vec, pool: _Pool) -> int:
        """The position of the agent this policy picks in pool for vector, or -1."""
        raise NotImplementedError

    def pick(
        self,
        demand: ResourceSlots,
        free: Sequence[ResourceSlots],
        indices: Sequence[int],
        start: int,
    ) -> int:
        """The agent this policy picks for demand among ``indices`` (positions in the candidates,
        in their order), or -1 when none fits; ``start``: where a round-robin scan begins."""
        raise NotImplementedError

    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Mapping[str, str] | str:
        if not agents:
            return "no candidate agent"
        free = [agent.free for agent in agents]
        plain = [i for i, agent in enumerate(agents) if not agent.capacity.has_accelerator]
        accelerated = [i for i, agent in enumerate(agents) if agent.capacity.has_accelerator]
        demands: list[tuple[Sequence[KernelRequest], ResourceSlots]]
        if one_agent:
            demands = [(session.kernels, _total(session))]
        else:
            extras = sorted(
                {name for k in session.kernels for name in k.slots.names()} - _NON_ACCELERATOR_SLOTS
            )

            def size(kernel: KernelRequest) -> tuple[Decimal, ...]:
                # The pass's order: largest first, comparing cpu, mem, then the others by name.
                slots = kernel.slots
                return (slots["cpu"], slots["mem"], *(slots[name] for name in extras))

            ordered = sorted(session.kernels, key=size, reverse=True)
            demands = [((kernel,), kernel.slots) for kernel in ordered]
        assignments: dict[str, str] = {}
        start = 0
        for kernels, demand in demands:
            # CPU-only agents first for a demand without accelerators, as the pass's pools do.
            index = -1 if demand.has_accelerator else self.pick(demand, free, plain, start)
            if index < 0:
                index = self.pick(demand, free, accelerated, start)
            if index < 0:
                return f"no candidate agent has {_describe_slots(demand)} free"
            free[index] = free[index] - demand
            start = (index + 1) % len(agents)
            for kernel in kernels:
                assignments[kernel.kernel_id] = agents[index].agent_id
        return assignments


def _free_key(free: ResourceSlots) -> tuple[Decimal, Decimal]:
    return (free["cpu"], free["mem"])


def _first_fitting(
    state: _Pass, keys: list[tuple[int, int, int]], order: Iterable[int], vector: _Vec
) -> int:
    """The position of the first agent, in ``order`` over a pool's sorted keys, whose
    free mem and accelerators (its cpu the order already holds) take ``vector``; -1 if none."""
    mem = vector[1]
    extras = [(j, a) for j in range(2, state.width) if (a := vector[j]) > 0]
    free = state.free
    for i in order:
        key = keys[i]
        if key[1] >= mem:
            pos = key[2]
            if not extras or all(free[j][pos] >= a for j, a in extras):
                return pos
    return -1


class ConcentratedSelector(_BuiltinSelector):
    """Packs: the fitting agent with the least free cpu, then mem (keeps whole agents free)."""

    def find(self, state: _Pass, vector: _Vec, pool: _Pool) -> int:
        keys = pool.keys
        if not keys or keys[-1][0] < vector[0]:
            return -1
        # Least free cpu first: from the first key that holds the cpu and mem, upwards.
        order = range(bisect_left(keys, (vector[0], vector[1])), len(keys))
        return _first_fitting(state, keys, order, vector)

    def pick(
        self,
        demand: ResourceSlots,
        free: Sequence[ResourceSlots],
        indices: Sequence[int],
        start: int,
    ) -> int:
        fitting = [i for i in indices if _fits(demand, free[i])]
        return min(fitting, key=lambda i: (*_free_key(free[i]), i), default=-1)


class DispersedSelector(_BuiltinSelector):
    """Spreads: the fitting agent with the most free cpu, then mem."""

    def find(self, state: _Pass, vector: _Vec, pool: _Pool) -> int:
        keys = pool.keys
        if not keys or keys[-1][0] < vector[0]:
            return -1
        # Most free cpu first: from the top key down to the first that holds the cpu.
        order = range(len(keys) - 1, bisect_left(keys, (vector[0],)) - 1, -1)
        return _first_fitting(state, keys, order, vector)

    def pick(
        self,
        demand: ResourceSlots,
        free: Sequence[ResourceSlots],
        indices: Sequence[int],
        start: int,
    ) -> int:
        fitting = [i for i in indices if _fits(demand, free[i])]
        return max(fitting, key=lambda i: (*_free_key(free[i]), i), default=-1)


class RoundRobinSelector(_BuiltinSelector):
    """Takes turns: the next fitting agent in agent_id order from the group's cursor."""

    advances_cursor = True

    def find(self, state: _Pass, vector: _Vec, pool: _Pool) -> int:
        keys = pool.keys
        if not keys or keys[-1][0] < vector[0]:
            return -1
        cpu, mem = vector[0], vector[1]
        extras = [(j, a) for j in range(2, state.width) if (a := vector[j]) > 0]
        free = state.free
        member = pool.member
        free_cpu, free_mem = free[0], free[1]
        cursor = state.cursor
        for pos in chain(range(cursor, len(member)), range(cursor)):
            if (
                member[pos]
                and free_cpu[pos] >= cpu
                and free_mem[pos] >= mem
                and (not extras or all(free[j][pos] >= a for j, a in extras))
            ):
                return pos
        return -1

    def pick(
        self,
        demand: ResourceSlots,
        free: Sequence[ResourceSlots],
        indices: Sequence[int],
        start: int,
    ) -> int:
        after = [i for i in indices if i >= start]
        before = [i for i in indices if i < start]
        return next((i for i in chain(after, before) if _fits(demand, free[i])), -1)


BUILTIN_AGENT_SELECTORS: Mapping[str, type[AgentSelector]] = {
    "concentrated": ConcentratedSelector,
    "dispersed": DispersedSelector,
    "roundrobin": RoundRobinSelector,
}
AGENT_SELECTIONS = tuple(BUILTIN_AGENT_SELECTORS)
# Built-ins hold no state, so one of each serves every pass.
_BUILTIN_INSTANCES = {name: cls({}) for name, cls in BUILTIN_AGENT_SELECTORS.items()}


# --- one pass ---------------------------------------------------------------------------------

_Vec = tuple[int, ...]


def _scaled_int(value: Decimal, places: int) -> int:
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number = int("".join(map(str, digits))) * int(10 ** (exponent + places))
    return -number if sign else number


class _Request:
    """One session's demand in the pass's integer units."""

    __slots__ = ("accel", "block", "kernels", "single")

    def __init__(self, session: PendingSession, vectors: Mapping[ResourceSlots, _Vec]) -> None:
        self.kernels: list[_Vec] = [vectors[k.slots] for k in session.kernels]
        if len(self.kernels) == 1:
            self.block: _Vec = self.kernels[0]
        else:
            self.block = tuple(map(sum, zip(*self.kernels, strict=True)))
        self.accel = any(self.block[2:])
        self.single = len(self.kernels) == 1 or session.cluster_mode == "single-node"


class _Pool:
    """Agents of one kind (CPU-only or with accelerators) sorted by (free cpu, free mem, position)."""

    __slots__ = ("keys", "member")

    def __init__(self, n_agents: int) -> None:
        self.keys: list[tuple[int, int, int]] = []
        self.member = [False] * n_agents


class _Owner:
    __slots__ = ("active", "active_system", "occupied", "share", "share_stale")

    def __init__(self, occupied: list[int], active: int, active_system: int) -> None:
        self.occupied = occupied
        self.active = active
        self.active_system = active_system
        self.share = Fraction(0)
        self.share_stale = True


class _Pass:
    """The mutable state of one scheduling pass, in integer units."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.group = snapshot.group
        distinct: set[ResourceSlots] = set()
        for agent in snapshot.agents:
            distinct.add(agent.capacity)
            distinct.add(agent.occupied)
        for session in snapshot.pending:
            for kernel in session.kernels:
                distinct.add(kernel.slots)
        for usage in snapshot.usage.values():
            distinct.add(usage.occupied)
        for quota in chain(snapshot.quotas.values(), (snapshot.default_quota,)):
            if quota.total_slots is not None:
                distinct.add(quota.total_slots)
        places: dict[str, int] = {"cpu": 0, "mem": 0}
        for slots in distinct:
            for name, value in slots.items():
                exponent = value.as_tuple().exponent
                assert isinstance(exponent, int)
                places[name] = max(places.get(name, 0), -exponent)
        self.names = ["cpu", "mem", *sorted(set(places) - _NON_ACCELERATOR_SLOTS)]
        self.places = [places[name] for name in self.names]
        self.width = len(self.names)
        index = {name: i for i, name in enumerate(self.names)}
        self.vectors: dict[ResourceSlots, _Vec] = {}
        for slots in distinct:
            vector = [0] * self.width
            for name, value in slots.items():
                j = index[name]
                vector[j] = _scaled_int(value, self.places[j])
            self.vectors[slots] = tuple(vector)

        agents = sorted(snapshot.agents, key=lambda a: a.agent_id)
        self.agent_ids = [a.agent_id for a in agents]
        n = len(agents)
        self.capacity = [self.vectors[a.capacity] for a in agents]
        # Column-major free amounts: free[j][pos].
        self.free = [[0] * n for _ in range(self.width)]
        for pos, agent in enumerate(agents):
            occupied = self.vectors[agent.occupied]
            for j in range(self.width):
                self.free[j][pos] = self.capacity[pos][j] - occupied[j]
        self.plain_pool = _Pool(n)
        self.accel_pool = _Pool(n)
        self.pool_of: list[_Pool] = []
        for pos in range(n):
            pool = self.accel_pool if any(self.capacity[pos][2:]) else self.plain_pool
            pool.member[pos] = True
            pool.keys.append((self.free[0][pos], self.free[1][pos], pos))
            self.pool_of.append(pool)
        self.plain_pool.keys.sort()
        self.accel_pool.keys.sort()
        self.cursor = self.group.roundrobin_cursor % n if n else self.group.roundrobin_cursor
        self.selector = self.group.agent_selector or _BUILTIN_INSTANCES[self.group.agent_selection]
        self.advances_cursor = self.selector.advances_cursor
        # Built-ins choose on the integer pools directly; anything else goes through `select`.
        self.finder = self.selector.find if isinstance(self.selector, _BuiltinSelector) else None
        timeout = self.group.pending_timeout
        self.pending_timeout = timeout if timeout is not None and timeout > timedelta(0) else None
        self.total = (
            [sum(column) for column in zip(*self.capacity, strict=True)] if n else [0] * self.width
        )

        # Keep the number of attributes under 30: past that CPython stops sharing the keys of
        # instance dicts, and every attribute read in the loops below gets slower.
        # Memos valid for this pass only: nothing frees during a pass.
        self.fits_nowhere: set[_Vec] = set()
        # multi-node shape -> how many of its kernels the last spreading attempt could place
        self.multi_failed: dict[tuple[_Vec, ...], int] = {}
        self.fits_some_capacity: dict[_Vec, bool] = {}
        self.last_spread_count = 0
        self.version = 0
        self.max_free_cache: tuple[int, list[int]] = (-1, [])
        self.owners: dict[str, _Owner] = {}
        self.quota_totals: dict[int, _Vec] = {}
        # The plain path: candidates as exact slots, rebuilt for an agent when its free slots change.
        self.candidates: dict[int, CandidateAgent] = {}
        # Why the last plain placement failed, when the pass's own shortage does not say it:
        # (reason, counts as an attempt, blocks the queue under FIFO).
        self.failure: tuple[str, bool, bool] | None = None

    # -- helpers --

    def amount(self, j: int, value: int) -> str:
        return format_amount(self.names[j], Decimal(value).scaleb(-self.places[j], _EXACT))

    def amount_with_slot(self, j: int, value: int) -> str:
        return format_slot(self.names[j], Decimal(value).scaleb(-self.places[j], _EXACT))

    def describe(self, vector: _Vec) -> str:
        parts = [self.amount_with_slot(j, v) for j, v in enumerate(vector) if v > 0]
        return " and ".join(parts) if parts else "nothing"

    def owner(self, owner_id: str) -> _Owner:
        state = self.owners.get(owner_id)
        if state is None:
            usage = self.snapshot.usage.get(owner_id)
            if usage is None:
                state = _Owner([0] * self.width, 0, 0)
            else:
                state = _Owner(
                    list(self.vectors[usage.occupied]),
                    usage.active_sessions,
                    usage.active_system_sessions,
                )
            self.owners[owner_id] = state
        return state

    def quota(self, owner_id: str) -> Quota:
        return self.snapshot.quotas.get(owner_id, self.snapshot.default_quota)

    def dominant_share(self, owner: _Owner) -> Fraction:
        if owner.share_stale:
            best_num, best_den = 0, 1
            for used, total in zip(owner.occupied, self.total, strict=True):
                if total > 0 and used * best_den > best_num * total:
                    best_num, best_den = used, total
            owner.share = Fraction(best_num, best_den)
            owner.share_stale = False
        return owner.share

    # -- order --

    def sessions_in_order(self) -> Iterator[PendingSession]:
        group = self.group
        if group.session_selection != "drf":
            yield from order_sessions_static(self.snapshot.pending, group)
            return
        queues: dict[str, deque[PendingSession]] = {}
        for session in sorted(self.snapshot.pending, key=_fifo_key):
            queues.setdefault(session.owner_id, deque()).append(session)
        heap: list[tuple[Fraction, datetime, str, str]] = []
        for owner_id, queue in queues.items():
            head = queue[0]
            share = self.dominant_share(self.owner(owner_id))
            heap.append((share, head.created_at, head.session_id, owner_id))
        heapq.heapify(heap)
        while heap:
            owner_id = heapq.heappop(heap)[3]
            queue = queues[owner_id]
            yield queue.popleft()
            if queue:
                head = queue[0]
                share = self.dominant_share(self.owner(owner_id))
                heapq.heappush(heap, (share, head.created_at, head.session_id, owner_id))

    # -- checks --

    def check(self, session: PendingSession, request: _Request) -> Wait | Cancellation | None:
        group = self.group
        sid = session.session_id
        if session.session_type not in group.allowed_session_types:
            return Wait(
                sid,
                f"session type {session.session_type} is not allowed in resource group {group.name}",
                False,
            )
        quota = self.quota(session.owner_id)
        if quota.allowed_resource_groups is not None and (
            group.name not in quota.allowed_resource_groups
        ):
            return Wait(
                sid, f"quota: resource group {group.name} is not allowed for this user", False
            )
        if session.depends_on:
            verdict = self.check_dependencies(session)
            if verdict is not None:
                return verdict
        now = self.snapshot.now
        if session.starts_at is not None and session.starts_at > now:
            return Wait(sid, start_time_wait(session.starts_at), False)
        timeout = self.pending_timeout
        if timeout is not None:
            since = session.created_at
            if session.starts_at is not None and session.starts_at > since:
                since = session.starts_at
            if now - since > timeout:
                return Cancellation(
                    sid, f"pending timeout: waited longer than {format_duration(timeout)}"
                )
        return self.check_quota(session, request, quota)

    def check_dependencies(self, session: PendingSession) -> Wait | Cancellation | None:
        deps = self.snapshot.dependencies
        labelled = []
        for dep_id in session.depends_on:
            dep = deps.get(dep_id)
            labelled.append((dep.name if dep is not None and dep.name else _short(dep_id), dep))
        reason, waiting = dependencies_verdict(labelled)
        if reason is not None:
            return Cancellation(session.session_id, reason)
        if waiting:
            return Wait(session.session_id, dependencies_wait(waiting), False)
        return None

    def check_quota(self, session: PendingSession, request: _Request, quota: Quota) -> Wait | None:
        """The quota rules of ``sessions_app.policy``, against what the owner holds
        now plus what this pass already placed for them.

        This runs for every pending session of every pass, so each rule is asked
        only when a cheap integer test says it may refuse; the rule decides and
        words the refusal.
        """
        sid = session.session_id
        limit = quota.max_containers_per_session
        if limit is not None and len(session.kernels) > limit:
            refusal = containers_refusal(len(session.kernels), limit)
            if refusal is not None:
                return Wait(sid, refusal, False)
        owner = self.owner(session.owner_id)
        if session.session_type == SYSTEM_SESSION_TYPE:
            limit = quota.max_concurrent_system_sessions
            if limit is None or owner.active_system < limit:
                return None
            refusal = concurrent_refusal(owner.active_system, limit, system=True)
            return None if refusal is None else Wait(sid, refusal, False)
        limit = quota.max_concurrent_sessions
        if limit is not None and owner.active >= limit:
            refusal = concurrent_refusal(owner.active, limit)
            if refusal is not None:
                return Wait(sid, refusal, False)
        if quota.total_slots is not None:
            allowed = self.quota_totals.get(id(quota))
            if allowed is None:
                allowed = self.vectors[quota.total_slots]
                self.quota_totals[id(quota)] = allowed
            occupied = owner.occupied
            for j, wanted in enumerate(request.block):
                if wanted > 0 and occupied[j] + wanted > allowed[j]:
                    refusal = total_slots_refusal(
                        slot=self.names[j],
                        held=occupied[j],
                        wanted=wanted,
                        allowed=allowed[j],
                        amount=partial(self.amount, j),
                    )
                    if refusal is not None:
                        return Wait(sid, refusal, False)
        return None

    def commit(self, session: PendingSession, request: _Request) -> None:
        owner = self.owner(session.owner_id)
        if session.session_type == SYSTEM_SESSION_TYPE:
            owner.active_system += 1
        else:
            owner.active += 1
        for j, amount in enumerate(request.block):
            if amount:
                owner.occupied[j] += amount
        owner.share_stale = True

    # -- placement --

    def take(self, pos: int, vector: _Vec, sign: int = 1) -> None:
        keys = self.pool_of[pos].keys
        free = self.free
        del keys[bisect_left(keys, (free[0][pos], free[1][pos], pos))]
        for j, amount in enumerate(vector):
            if amount:
                free[j][pos] -= sign * amount
        insort(keys, (free[0][pos], free[1][pos], pos))
        self.version += 1
        if self.candidates:
            self.candidates.pop(pos, None)
        if sign > 0 and self.advances_cursor:
            self.cursor = (pos + 1) % len(self.agent_ids)

    def find_in(self, vector: _Vec, pools: Sequence[_Pool]) -> int:
        finder = self.finder
        assert finder is not None
        for pool in pools:
            pos = finder(self, vector, pool)
            if pos >= 0:
                return pos
        return -1

    def place(self, session: PendingSession, request: _Request) -> dict[str, str] | None:
        """Place every kernel of session or none; on success the agents' free slots are taken."""
        if self.finder is None or session.pinned_agents:
            return self.place_plain(session, request)
        if not self.agent_ids:
            return None
        plain, accel = self.plain_pool, self.accel_pool
        block = request.block
        if request.single:
            if block in self.fits_nowhere:
                return None
            pos = self.find_in(block, (accel,) if request.accel else (plain, accel))
            if pos < 0:
                self.fits_nowhere.add(block)
                return None
            self.take(pos, block)
            agent_id = self.agent_ids[pos]
            return {kernel.kernel_id: agent_id for kernel in session.kernels}
        shape = tuple(sorted(request.kernels))
        placed_before = self.multi_failed.get(shape)
        if placed_before is not None:
            self.last_spread_count = placed_before
            return None
        stages: list[tuple[bool, tuple[_Pool, ...]]]
        if request.accel:
            stages = [(True, (accel,)), (False, (plain, accel))]
        else:
            stages = [(True, (plain,)), (False, (plain,))]
            if accel.keys:
                stages += [(True, (accel,)), (False, (plain, accel))]
        for whole, pools in stages:
            if whole:
                if block in self.fits_nowhere:
                    continue
                pos = self.find_in(block, pools)
                if pos >= 0:
                    self.take(pos, block)
                    agent_id = self.agent_ids[pos]
                    return {kernel.kernel_id: agent_id for kernel in session.kernels}
            else:
                assignments = self.spread(session, request, pools)
                if assignments is not None:
                    return assignments
        # Every whole-block stage failed, and together they covered every agent that could hold it.
        self.fits_nowhere.add(block)
        self.multi_failed[shape] = self.last_spread_count
        return None

    def spread(
        self, session: PendingSession, request: _Request, pools: tuple[_Pool, ...]
    ) -> dict[str, str] | None:
        """Kernel by kernel, largest first, on any agents of pools; all or none."""
        order = sorted(range(len(request.kernels)), key=lambda i: request.kernels[i], reverse=True)
        taken: list[tuple[int, _Vec]] = []
        assignments: dict[str, str] = {}
        accel_only = (self.accel_pool,)
        cursor = self.cursor
        for i in order:
            vector = request.kernels[i]
            pos = -1
            if vector not in self.fits_nowhere:
                pos = self.find_in(vector, accel_only if any(vector[2:]) else pools)
            if pos < 0:
                self.last_spread_count = len(taken)
                for undo_pos, undo_vector in reversed(taken):
                    self.take(undo_pos, undo_vector, sign=-1)
                self.cursor = cursor
                return None
            self.take(pos, vector)
            taken.append((pos, vector))
            assignments[session.kernels[i].kernel_id] = self.agent_ids[pos]
        return assignments

    # -- the plain path: plugins and pinned sessions --

    def slots(self, vector: Iterable[int]) -> ResourceSlots:
        """Integer units back to exact slots."""
        places = self.places
        return ResourceSlots._make(
            (self.names[j], Decimal(value).scaleb(-places[j], _EXACT))
            for j, value in enumerate(vector)
            if value
        )

    def candidate(self, pos: int) -> CandidateAgent:
        agent = self.candidates.get(pos)
        if agent is None:
            free = self.slots(column[pos] for column in self.free)
            agent = CandidateAgent(self.agent_ids[pos], self.slots(self.capacity[pos]), free)
            self.candidates[pos] = agent
        return agent

    def offer(
        self, request: _Request, pools: tuple[_Pool, ...], whole: bool, allowed: set[int] | None
    ) -> list[int]:
        """The positions a stage offers: members of pools (and of allowed) with at least the
        smallest demand of every slot free, in agent_id order or from the cursor."""
        vectors = [request.block] if whole else request.kernels
        low = [min(column) for column in zip(*vectors, strict=True)]
        extras = [(j, a) for j in range(2, self.width) if (a := low[j]) > 0]
        free = self.free
        if allowed is not None:
            scan: Iterable[int] = (
                pos for pos in allowed if any(pool.member[pos] for pool in pools)
            )
        else:
            scan = (
                key[2] for pool in pools for key in pool.keys[bisect_left(pool.keys, (low[0],)) :]
            )
        positions = sorted(
            pos
            for pos in scan
            if free[0][pos] >= low[0]
            and free[1][pos] >= low[1]
            and all(free[j][pos] >= a for j, a in extras)
        )
        if self.advances_cursor:
            cursor = self.cursor
            positions.sort(key=lambda pos: (pos < cursor, pos))
        return positions

    def place_plain(self, session: PendingSession, request: _Request) -> dict[str, str] | None:
        """`place` through the selector's plain interface, checking every answer; on failure
        ``self.failure`` may hold the reason (else the pass's shortage explains it)."""
        self.failure = None
        self.last_spread_count = 0
        selector = self.selector
        if isinstance(selector, UnavailableAgentSelector):
            self.failure = (selector.reason, False, False)
            return None
        allowed: set[int] | None = None
        if session.pinned_agents:
            at = {agent_id: pos for pos, agent_id in enumerate(self.agent_ids)}
            allowed = {at[a] for a in session.pinned_agents if a in at}
            if not allowed:
                self.failure = (self.pinned_reason(session, request, allowed, None), True, False)
                return None
        plain, accel = self.plain_pool, self.accel_pool
        stages: list[tuple[bool, tuple[_Pool, ...]]]
        if request.single:
            stages = [(True, (accel,))] if request.accel else [(True, (plain,)), (True, (accel,))]
        elif request.accel:
            stages = [(True, (accel,)), (False, (plain, accel))]
        else:
            stages = [
                (True, (plain,)),
                (False, (plain,)),
                (True, (accel,)),
                (False, (plain, accel)),
            ]
        declined: str | None = None
        for whole, pools in stages:
            offered = self.offer(request, pools, whole, allowed)
            if not offered:
                continue
            try:
                answer = selector.select(
                    session, [self.candidate(pos) for pos in offered], one_agent=whole
                )
                if not isinstance(answer, str) and isinstance(answer, Mapping):
                    answer = dict(answer)
            except Exception as exc:  # noqa: BLE001 - a plugin's bug must not stop the pass
                self.failure = (self.unusable(f"failed: {type(exc).__name__}: {exc}"), True, False)
                return None
            if isinstance(answer, str):
                declined = answer or f"agent selector {self.group.agent_selection} found no agent"
                continue
            problem = self.check_answer(session, request, answer, offered, whole)
            if problem is not None:
                self.failure = (self.unusable(f"gave an unusable answer: {problem}"), True, False)
                return None
            at = {self.agent_ids[pos]: pos for pos in offered}
            vectors = {
                k.kernel_id: v for k, v in zip(session.kernels, request.kernels, strict=True)
            }
            for kernel_id, agent_id in answer.items():
                self.take(at[agent_id], vectors[kernel_id])
            return {k.kernel_id: answer[k.kernel_id] for k in session.kernels}
        if allowed is not None:
            self.failure = (self.pinned_reason(session, request, allowed, declined), True, False)
        elif declined is not None:
            self.failure = (declined, True, self.shortage(session, request)[1])
        return None

    def unusable(self, problem: str) -> str:
        return f"agent selector {self.group.agent_selection} {problem}"

    def check_answer(
        self,
        session: PendingSession,
        request: _Request,
        answer: object,
        offered: list[int],
        one_agent: bool,
    ) -> str | None:
        """What is wrong with a selector's answer, or None when the pass may apply it."""
        if not isinstance(answer, dict):
            return f"{type(answer).__name__} instead of placements or a reason"
        kernel_ids = [k.kernel_id for k in session.kernels]
        for kernel_id in kernel_ids:
            if kernel_id not in answer:
                return f"no agent for kernel {kernel_id}"
        if len(answer) != len(kernel_ids):
            extra = next(k for k in answer if k not in set(kernel_ids))
            return f"an agent for {extra!r}, which is not a kernel of the session"
        at = {self.agent_ids[pos]: pos for pos in offered}
        held: dict[int, list[int]] = {}
        for kernel_id, vector in zip(kernel_ids, request.kernels, strict=True):
            agent_id = answer[kernel_id]
            pos = at.get(agent_id) if isinstance(agent_id, str) else None
            if pos is None:
                return f"agent {agent_id!r} for kernel {kernel_id}, which was not offered"
            total = held.setdefault(pos, [0] * self.width)
            for j, amount in enumerate(vector):
                total[j] += amount
        if one_agent and len(held) > 1:
            return "several agents for a session that must stay on one"
        for pos, total in held.items():
            for j, amount in enumerate(total):
                if (j < 2 or amount > 0) and self.free[j][pos] < amount:
                    return (
                        f"{self.describe(tuple(total))} on agent {self.agent_ids[pos]}, "
                        f"which has {self.amount_with_slot(j, self.free[j][pos])} free"
                    )
        return None

    def pinned_reason(
        self, session: PendingSession, request: _Request, allowed: set[int], declined: str | None
    ) -> str:
        pinned = session.pinned_agents
        many = len(pinned) > 1
        head = f"pinned to agent{'s' if many else ''} {', '.join(pinned)}: "
        if not allowed:
            return head + (
                f"{'none of them is' if many else 'it is not'} alive and schedulable "
                f"in resource group {self.group.name}"
            )
        if declined is not None and self.finder is None:
            return head + declined
        subject = "none of them has" if many else "it does not have"
        vectors = [request.block] if request.single else request.kernels
        for vector in vectors:
            for j, wanted in enumerate(vector):
                if wanted > max(self.free[j][pos] for pos in allowed):
                    return f"{head}{subject} {self.amount_with_slot(j, wanted)} free"
        if request.single:
            return f"{head}{subject} {self.describe(request.block)} free at once"
        where = "them" if many else "it"
        return f"{head}its {len(request.kernels)} containers do not fit on {where} at once"

    # -- reasons --

    def max_free(self) -> list[int]:
        version, values = self.max_free_cache
        if version != self.version:
            values = [max(column) for column in self.free]
            self.max_free_cache = (self.version, values)
        return values

    def fits_any_capacity(self, vector: _Vec) -> bool:
        known = self.fits_some_capacity.get(vector)
        if known is None:
            known = any(
                all(c >= v for c, v in zip(cap, vector, strict=True)) for cap in self.capacity
            )
            self.fits_some_capacity[vector] = known
        return known

    def shortage(self, session: PendingSession, request: _Request) -> tuple[str, bool]:
        """Why session did not fit, and whether that should block the sessions behind it (FIFO)."""
        group = self.group.name
        if not self.agent_ids:
            return no_live_agent(group), False
        size = len(request.kernels)
        cluster_block = request.single and size > 1
        if cluster_block:
            vectors = [request.block]
            prefix, where = f"single-node cluster of {size} needs ", " on one agent"
        else:
            vectors = request.kernels
            prefix, where = "needs ", " per container"
            if size > 1:
                prefix = f"multi-node cluster of {size} needs "
        for vector in vectors:
            if not self.fits_any_capacity(vector):
                biggest = [max(column) for column in zip(*self.capacity, strict=True)]
                for j, wanted in enumerate(vector):
                    if wanted > biggest[j]:
                        reason = capacity_refusal(
                            need=f"{prefix}{self.amount_with_slot(j, wanted)}",
                            where=where,
                            group=group,
                            largest=self.amount_with_slot(j, max(biggest[j], 0)),
                        )
                        return reason, False
                reason = f"{prefix}{self.describe(vector)}{where}; no agent in resource group {group} is big enough"
                return reason, False
        largest = self.max_free()
        for vector in vectors:
            for j, wanted in enumerate(vector):
                if wanted > largest[j]:
                    reason = free_shortage(
                        need=f"{prefix}{self.amount_with_slot(j, wanted)}",
                        where=where,
                        label="largest free" if cluster_block else "largest free on an agent",
                        largest=self.amount(j, max(largest[j], 0)),
                    )
                    return reason, True
        if size > 1 and not request.single:
            reason = (
                f"{prefix}{self.describe(vectors[0])}{where}; only {self.last_spread_count} of "
                f"{size} containers fit on the free agents at once"
            )
            return reason, True
        return f"{prefix}{self.describe(vectors[0])}{where}; no agent has all of it free", True


# --- public pieces ----------------------------------------------------------------------------


def order_sessions_static(
    pending: Sequence[PendingSession], group: GroupConfig
) -> list[PendingSession]:
    """FIFO (with HoL avoidance) or LIFO order; DRF falls back to FIFO here (see order_sessions)."""
    if group.session_selection == "lifo":
        return sorted(pending, key=_fifo_key, reverse=True)
    ordered = sorted(pending, key=_fifo_key)
    skip = group.num_retries_to_skip
    if group.session_selection == "fifo" and skip > 0:
        fresh = [s for s in ordered if s.attempts <= skip]
        stale = [s for s in ordered if s.attempts > skip]
        return fresh + stale
    return ordered


def order_sessions(snapshot: Snapshot) -> list[PendingSession]:
    """The order in which `schedule` considers the pending sessions if none of them gets placed.

    For FIFO and LIFO this is the order of the pass. For DRF, placements change the owners' shares,
    so `schedule` re-evaluates after each one; without placements the smallest share's owner
    comes first with all of their sessions (FIFO), then the next owner.
    """
    return list(_Pass(snapshot).sessions_in_order())


def check_session(snapshot: Snapshot, session: PendingSession) -> Wait | Cancellation | None:
    """The checks before placement (type, resource group, dependencies, start time, pending
    timeout, quota), against the snapshot as it is: the first failing check's decision, or None."""
    state = _Pass(snapshot)
    return state.check(session, _Request(session, state.vectors))


def place_kernels(
    session: PendingSession,
    agents: Sequence[AgentState],
    agent_selection: str,
    roundrobin_cursor: int = 0,
    agent_selector: AgentSelector | None = None,
) -> dict[str, str] | None:
    """Where the kernels of session go on agents (kernel_id -> agent_id), or None if not all fit.
    ``agent_selector``: the selector named ``agent_selection`` (None: that built-in)."""
    group = GroupConfig(
        name="",
        session_selection="fifo",
        num_retries_to_skip=0,
        agent_selection=agent_selection,
        allowed_session_types=frozenset({session.session_type}),
        pending_timeout=None,
        roundrobin_cursor=roundrobin_cursor,
        agent_selector=agent_selector,
    )
    snapshot = Snapshot(
        group=group,
        now=session.created_at,
        pending=(session,),
        agents=tuple(agents),
        usage={},
        quotas={},
        dependencies={},
        default_quota=Quota(None, None, None, None, None),
    )
    state = _Pass(snapshot)
    return state.place(session, _Request(session, state.vectors))


def schedule(snapshot: Snapshot) -> Decisions:
    """One scheduling pass over a resource group; see the module docstring for the rules."""
    state = _Pass(snapshot)
    decisions = Decisions()
    hol_blocking = snapshot.group.session_selection == "fifo"
    blocked_by: str | None = None
    for session in state.sessions_in_order():
        request = _Request(session, state.vectors)
        verdict = state.check(session, request)
        never_waits = session.session_type == SYSTEM_SESSION_TYPE
        if isinstance(verdict, Cancellation):
            decisions.cancellations.append(verdict)
            continue
        if verdict is not None:
            if never_waits:
                decisions.cancellations.append(Cancellation(session.session_id, verdict.reason))
            else:
                decisions.waits.append(verdict)
            continue
        if blocked_by is not None and not never_waits:
            decisions.waits.append(Wait(session.session_id, queued_behind(blocked_by), False))
            continue
        assignments = state.place(session, request)
        if assignments is not None:
            state.commit(session, request)
            decisions.placements.append(Placement(session.session_id, assignments))
            continue
        failure = state.failure
        if failure is None:
            reason, blocking = state.shortage(session, request)
            counts = True
        else:
            state.failure = None
            reason, counts, blocking = failure
        if never_waits:
            decisions.cancellations.append(Cancellation(session.session_id, reason))
            continue
        decisions.waits.append(Wait(session.session_id, reason, counts))
        if hol_blocking and blocking:
            blocked_by = session.session_id
    decisions.roundrobin_cursor = state.cursor
    return decisions
