"""Rules of sessions that launch validation and the scheduler share, worded once.

Pure Python (no Django): ``sessions_app.launch`` refuses at the API what can
never start, ``sessions_app.preview`` tells what would wait, and
``scheduler_app.policy`` (which imports this module) holds a pending session
back with the same checks and the same words. Amounts are generic numbers
(exact decimals at launch, the pass's scaled integers), shown through the
caller's ``amount`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

from bai_common.units import format_amount, format_slot

N = TypeVar("N", int, Decimal)

__all__ = [
    "DEFAULT_SLOT_PLACES",
    "MAX_SLOT_VALUE",
    "SLOT_PLACES",
    "DependencyState",
    "capacity_refusal",
    "concurrent_refusal",
    "containers_refusal",
    "dependencies_verdict",
    "dependencies_wait",
    "dependency_state",
    "free_shortage",
    "no_live_agent",
    "pending_refusal",
    "placement_shortage",
    "queued_behind",
    "reason_class",
    "slot_order",
    "slot_value_refusal",
    "start_time_wait",
    "total_slots_refusal",
]


# --- slot values ---------------------------------------------------------------

# Slots carry a fixed precision: mem in whole bytes, every other slot in
# thousandths (millicores for cpu), up to MAX_SLOT_VALUE. Launch validation and
# the agent gateway refuse anything finer or larger, so every stored amount is
# exact in the scheduler's integer arithmetic.
SLOT_PLACES = {"mem": 0}
DEFAULT_SLOT_PLACES = 3
MAX_SLOT_VALUE = Decimal(10) ** 15


def slot_value_refusal(slot: str, value: Decimal) -> str | None:
    """Why ``value`` is not a valid amount of ``slot``, or None."""
    if not value.is_finite():
        return f"{slot}: {value} is not a finite number"
    if value < 0:
        return f"{slot}: must not be negative"
    if value > MAX_SLOT_VALUE:
        return f"{slot}: at most {MAX_SLOT_VALUE:,}"
    places = SLOT_PLACES.get(slot, DEFAULT_SLOT_PLACES)
    exponent = value.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        if places == 0:
            return f"{slot}: must be a whole number"
        return f"{slot}: at most {places} decimal places"
    return None


# --- quotas ------------------------------------------------------------------


def containers_refusal(size: int, limit: int | None) -> str | None:
    """Containers per session (cluster size) against the quota."""
    if limit is None or size <= limit:
        return None
    return (
        f"quota: at most {limit} containers per session; this one has {size} ({size - limit} over)"
    )


def concurrent_refusal(active: int, limit: int | None, *, system: bool = False) -> str | None:
    """One more running session against the concurrency quota (``active`` already run)."""
    if limit is None or active < limit:
        return None
    kind = "concurrent system sessions" if system else "concurrent sessions"
    return f"quota: {limit} {kind} allowed; {active} already active"


def pending_refusal(pending: int, limit: int | None) -> str | None:
    """One more pending session against the pending quota (``pending`` already wait)."""
    if limit is None or pending < limit:
        return None
    return (
        f"quota: at most {limit} pending sessions; you have {pending} pending "
        f"({pending + 1 - limit} over with this one)"
    )


def total_slots_refusal(
    *, slot: str, held: N, wanted: N, allowed: N, amount: Callable[[N], str]
) -> str | None:
    """One slot of the owner's total (``held`` + ``wanted``) against ``allowed``."""
    would = held + wanted
    if not wanted > 0 or not would > allowed:
        return None
    return (
        f"quota: total {slot} would be {amount(would)} of {amount(allowed)} allowed "
        f"({amount(would - allowed)} over)"
    )


# --- capacity ----------------------------------------------------------------


def capacity_refusal(*, need: str, where: str, group: str, largest: str) -> str:
    """A request that no agent of the group could hold even when empty.

    ``need``: "needs 16 cpu" (with the cluster prefix); ``where``: " per container"
    or " on one agent"; ``largest``: the biggest agent's amount of the short slot.
    """
    return f"{need}{where}; no agent in resource group {group} has that much (the largest agent has {largest})"


def no_live_agent(group: str) -> str:
    """A group with no agent that could take a kernel now."""
    return f"no agent alive and schedulable in resource group {group}"


def free_shortage(*, need: str, where: str, label: str, largest: str) -> str:
    """A request that fits an agent of the group, but not what is free now.

    ``need``: "needs 8 cpu" (with the cluster prefix); ``where``: " per container" or
    " on one agent"; ``label``: "largest free on an agent" or "largest free".
    """
    return f"{need}{where}; {label}: {largest}"


def queued_behind(session_id: str) -> str:
    """FIFO: a session behind one that waits for resources waits too."""
    return f"queued behind session {session_id[:8]} which waits for resources"


def start_time_wait(starts_at: datetime) -> str:
    return f"starts at {starts_at.isoformat()}"


# Why a session waits, as a few classes (the metrics' label): each wording above
# begins with words no other begins with, so its class is read from its start.
REASON_CLASSES = (
    ("quota: ", "quota"),
    ("waiting for dependencies", "dependencies"),
    ("starts at ", "start_time"),
    ("queued behind session ", "queued_behind"),
    ("no agent alive and schedulable", "no_agent"),
    ("pinned to agent", "pinned_agents"),
    ("session type ", "session_type"),
)


def reason_class(reason: str) -> str:
    """The class of a pending session's reason: one of ``REASON_CLASSES``'s, ``new``
    (no pass has looked at it yet), ``too_big`` (no agent of its group could hold it
    even empty), ``resources`` (it fits, but not in what is free now) or ``other``
    (an agent selector's own words)."""
    if not reason:
        return "new"
    for prefix, name in REASON_CLASSES:
        if reason.startswith(prefix):
            return name
    if "has that much (the largest agent has" in reason or reason.endswith("is big enough"):
        return "too_big"
    if "needs " in reason and ("free" in reason or "containers fit on the free agents" in reason):
        return "resources"
    return "other"


def slot_order(names: Iterable[str]) -> list[str]:
    """cpu, mem, then the others by name: the order in which shortages are named."""
    rest = sorted(set(names) - {"cpu", "mem"})
    return ["cpu", "mem", *rest]


def _fits(need: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> bool:
    return all(value <= free.get(slot, Decimal(0)) for slot, value in need.items() if value > 0)


def _sum(vectors: Sequence[Mapping[str, Decimal]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for vector in vectors:
        for slot, value in vector.items():
            total[slot] = total.get(slot, Decimal(0)) + value
    return total


def _describe(need: Mapping[str, Decimal]) -> str:
    parts = [format_slot(s, need[s]) for s in slot_order(need) if need.get(s, Decimal(0)) > 0]
    return " and ".join(parts) if parts else "nothing"


def placement_shortage(
    *,
    kernels: Sequence[Mapping[str, Decimal]],
    single_node: bool,
    free: Sequence[Mapping[str, Decimal]],
    group: str,
) -> str | None:
    """Why ``kernels`` cannot all be placed on the agents' ``free`` slots now, in the
    scheduler's words; None when they can.

    A rule of thumb, not the pass: single-node needs one agent that holds the sum;
    multi-node fits when one agent holds the sum or when the kernels, largest first,
    each find an agent with room (most free first). What is free is only what the
    agents have now; sessions that go first may take it.
    """
    if not free:
        return no_live_agent(group)
    size = len(kernels)
    total = _sum(kernels)
    if any(_fits(total, room) for room in free):
        return None
    block = single_node and size > 1
    needs: list[Mapping[str, Decimal]]
    if block:
        needs, prefix = [total], f"single-node cluster of {size} needs "
        where, label = " on one agent", "largest free"
    else:
        needs = list(kernels)
        prefix = f"multi-node cluster of {size} needs " if size > 1 else "needs "
        where, label = " per container", "largest free on an agent"
    slots = slot_order({slot for room in free for slot in room} | set(total))
    largest = {slot: max(room.get(slot, Decimal(0)) for room in free) for slot in slots}
    for need in needs:
        for slot in slots:
            wanted = need.get(slot, Decimal(0))
            if wanted > largest[slot]:
                return free_shortage(
                    need=f"{prefix}{format_slot(slot, wanted)}",
                    where=where,
                    label=label,
                    largest=format_amount(slot, max(largest[slot], Decimal(0))),
                )
    if block or size == 1:
        return f"{prefix}{_describe(needs[0])}{where}; no agent has all of it free"
    rooms = [dict(room) for room in free]
    order = sorted(
        range(size),
        key=lambda i: tuple(kernels[i].get(s, Decimal(0)) for s in slots),
        reverse=True,
    )
    placed = 0
    for i in order:
        fitting = [room for room in rooms if _fits(kernels[i], room)]
        if not fitting:
            continue
        room = max(fitting, key=lambda r: tuple(r.get(s, Decimal(0)) for s in slots))
        for slot, value in kernels[i].items():
            room[slot] = room.get(slot, Decimal(0)) - value
        placed += 1
    if placed == size:
        return None
    return (
        f"{prefix}{_describe(kernels[0])}{where}; only {placed} of "
        f"{size} containers fit on the free agents at once"
    )


# --- dependencies --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DependencyState:
    """What a dependant knows of one dependency.

    ``status``: PENDING .. TERMINATED, ERROR, CANCELLED; ``result``: UNDEFINED/SUCCESS/FAILED;
    ``name``: the session's name (the id is shown when empty); ``detail``: why it ended,
    e.g. "exit code 1".
    """

    status: str
    result: str
    name: str = ""
    detail: str = ""


def dependency_state(
    *, status: str, result: str, name: str, exit_code: int | None, status_reason: str
) -> DependencyState:
    """A dependency as its dependants see it; ``detail`` says why it ended."""
    detail = f"exit code {exit_code}" if result == "FAILED" and exit_code is not None else ""
    return DependencyState(status, result, name, detail or status_reason)


def _outcome(dep: DependencyState) -> str | None:
    """How a dependency ended without success, in words; None while it may still succeed."""
    if dep.result == "SUCCESS":
        return None
    if dep.result == "FAILED":
        return f"ended FAILED ({dep.detail})" if dep.detail else "ended FAILED"
    if dep.status == "CANCELLED":
        return f"cancelled: {dep.detail}" if dep.detail else "cancelled"
    if dep.status in ("ERROR", "TERMINATED"):
        detail = f": {dep.detail}" if dep.detail else ""
        return f"ended {dep.status} without success{detail}"
    return None


def dependencies_verdict(
    deps: Sequence[tuple[str, DependencyState | None]],
) -> tuple[str | None, list[str]]:
    """(why the dependant can never start, the dependencies still running).

    ``deps``: (label, state or None when it does not exist). The reason names
    every dependency that was not satisfied: those that failed and those that
    had not finished yet.
    """
    failed: list[str] = []
    waiting: list[str] = []
    for label, dep in deps:
        if dep is None:
            failed.append(f"dependency {label} does not exist")
            continue
        outcome = _outcome(dep)
        if outcome is not None:
            failed.append(f"dependency {label} {outcome}")
        elif dep.result != "SUCCESS":
            waiting.append(label)
    if not failed:
        return None, waiting
    unfinished = [f"dependency {label} had not finished" for label in waiting]
    return "; ".join(failed + unfinished), waiting


def dependencies_wait(waiting: Sequence[str]) -> str:
    """A dependant whose dependencies (labels) have not finished yet."""
    return f"waiting for dependencies: {', '.join(waiting)}"
