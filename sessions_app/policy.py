"""Rules of sessions that launch validation and the scheduler share, worded once.

Pure Python (no Django): ``sessions_app.launch`` refuses at the API what can
never start, and ``scheduler_app.policy`` (which imports this module) holds a
pending session back with the same checks and the same words. Amounts are
generic numbers (exact decimals at launch, the pass's scaled integers), shown
through the caller's ``amount`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

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
    "dependency_state",
    "pending_refusal",
    "slot_value_refusal",
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
