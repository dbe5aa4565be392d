"""Parsing and arithmetic of resource slots at the edges (API input, admin).

Pure Python. Slots are a mapping of slot name to an exact Decimal; a missing
slot counts as 0. ``mem`` accepts byte counts or sizes with a binary unit
("512m", "4g", "1.5GiB"). The rules for reading and showing amounts live in
``bai_common.units``; this module applies them slot by slot. The scheduler has
its own fast value type for the hot path; this module is for validating and
presenting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from bai_common import units


class SlotError(ValueError):
    def __init__(self, slot: str, message: str) -> None:
        super().__init__(f"{slot}: {message}")
        self.slot = slot
        self.message = message


def parse_slot_value(slot: str, raw: object) -> Decimal:
    """One slot's amount: ``mem`` as a size (``units.parse_size``), others as an exact decimal."""
    try:
        if slot == "mem":
            return Decimal(units.parse_size(raw))
        return units.parse_amount(raw)
    except ValueError as exc:
        raise SlotError(slot, str(exc)) from None


def parse_slots(raw: object, known: Iterable[str]) -> dict[str, Decimal]:
    """Validate user input; raises SlotError naming the first bad slot."""
    if not isinstance(raw, Mapping):
        raise SlotError("resources", 'must be an object like {"cpu": 1, "mem": "1g"}')
    known = set(known)
    out: dict[str, Decimal] = {}
    for slot, value in raw.items():
        if slot not in known:
            raise SlotError(str(slot), f"unknown resource slot (known: {', '.join(sorted(known))})")
        out[slot] = parse_slot_value(slot, value)
    return out


def to_strings(slots: Mapping[str, Decimal]) -> dict[str, str]:
    return {k: units.format_decimal(v) for k, v in slots.items() if v != 0}


def from_strings(slots: Mapping[str, object]) -> dict[str, Decimal]:
    return {k: Decimal(str(v)) for k, v in slots.items()}


def add(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in set(a) | set(b)}


def shortfall(need: Mapping[str, Decimal], have: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Slots of ``need`` that ``have`` cannot cover, with the amount missing."""
    return {k: v - have.get(k, Decimal(0)) for k, v in need.items() if v > have.get(k, Decimal(0))}


def fmt(slot: str, value: Decimal) -> str:
    """Human form: ``4 cpu``, ``2 GiB mem`` (``units.format_slot``)."""
    return units.format_slot(slot, value)
