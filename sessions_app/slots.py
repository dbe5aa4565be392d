"""Parsing and arithmetic of resource slots at the edges (API input, admin).

Pure Python. Slots are a mapping of slot name to an exact Decimal; a missing
slot counts as 0. ``mem`` accepts byte counts or sizes with a binary unit
("512m", "4g", "1.5GiB"). The scheduler has its own fast value type for the
hot path; this module is for validating and presenting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


class SlotError(ValueError):
    def __init__(self, slot: str, message: str) -> None:
        super().__init__(f"{slot}: {message}")
        self.slot = slot
        self.message = message


def parse_slot_value(slot: str, raw: object) -> Decimal:
    if isinstance(raw, bool) or raw is None:
        raise SlotError(slot, f"{raw!r} is not a number")
    if slot == "mem" and isinstance(raw, str):
        match = _SIZE.match(raw)
        if not match:
            raise SlotError(slot, f"{raw!r} is not a size (use bytes or e.g. 512m, 4g)")
        value = Decimal(match.group(1)) * _UNITS[match.group(2).lower()]
        value = value.to_integral_value()
    else:
        try:
            value = Decimal(str(raw).strip())
        except InvalidOperation:
            raise SlotError(slot, f"{raw!r} is not a number") from None
    if not value.is_finite():
        raise SlotError(slot, f"{raw!r} is not a finite number")
    if value < 0:
        raise SlotError(slot, f"must not be negative (got {raw})")
    return value


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
    return {k: _normal(v) for k, v in slots.items() if v != 0}


def from_strings(slots: Mapping[str, object]) -> dict[str, Decimal]:
    return {k: Decimal(str(v)) for k, v in slots.items()}


def add(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in set(a) | set(b)}


def scale(a: Mapping[str, Decimal], n: int) -> dict[str, Decimal]:
    return {k: v * n for k, v in a.items()}


def shortfall(need: Mapping[str, Decimal], have: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Slots of ``need`` that ``have`` cannot cover, with the amount missing."""
    return {k: v - have.get(k, Decimal(0)) for k, v in need.items() if v > have.get(k, Decimal(0))}


def fmt(slot: str, value: Decimal) -> str:
    """Human form: ``4 cpu``, ``2 GiB mem``."""
    if slot == "mem":
        for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= size:
                return f"{_normal(value / size, places=2)} {unit} mem"
        return f"{_normal(value)} B mem"
    return f"{_normal(value)} {slot}"


def _normal(value: Decimal, places: int | None = None) -> str:
    if places is not None:
        value = value.quantize(Decimal(1).scaleb(-places))
    text = format(value.normalize(), "f")
    return text
