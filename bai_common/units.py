"""Sizes, durations and slot amounts: parsing what people type, formatting what they read.

One rule, one place: the launch API and the admin (``sessions_app.slots``), the reasons of the
scheduling policy (``scheduler_app.policy``) and of the deadlines (``sessions_app.deadlines``), and
the agent's command line (``agent.config``) all go through these functions, so ``4g`` means the same
number of bytes everywhere and every message reads ``1.5 GiB`` and ``1 h 30 min``.

Standard library only, and clean under ``mypy --strict`` (the policy imports it).

Every input is bounded before any arithmetic is done with it: text longer than ``MAX_TEXT``
characters, numbers with too many digits and results beyond ``MAX_SIZE``, ``MAX_DURATION`` or the
amount bounds are refused with a ``ValueError`` that says what is wrong. Hostile input costs
microseconds and never overflows.

Sizes
    ``parse_size``: a byte count (``1024``), or a number with a binary unit, case-insensitive, with
    an optional ``B`` or ``iB``: ``512m``, ``4g``, ``1.5GiB``, ``2 GiB``. Units k, m, g, t, p are
    powers of 1024; a fraction of a byte rounds half up.
    ``format_size``: the largest binary unit in which the size is exact to two decimal places
    (``1.5 GiB``, ``768 MiB``, ``1000 B``), so parsing the text gives the same size back.
    ``format_size_rounded``: a size as people read it in a sentence, to one decimal place in the
    largest binary unit it reaches (``900.0 MiB``, ``1.1 GiB``, ``512 B``): for usage figures.
    ``format_size_shown``: a size in a table or a form, always in the largest binary unit it
    reaches: ``format_size``'s exact text when it is in that unit (``2 GiB``, ``1.25 GiB``), else
    ``format_size_rounded``'s (``23.5 GiB``, never ``24684092 KiB``). The pages' ``fmtMem``
    (static/js/common.js) writes the same text.
Slot amounts
    ``parse_amount``: an exact, finite, non-negative decimal (``2``, ``"0.5"``) with at most
    ``MAX_AMOUNT_DIGITS`` digits before the point and ``MAX_AMOUNT_PLACES`` after it.
    ``format_amount``: an amount for people -- ``mem`` as a size, other slots as a plain exact
    decimal; ``format_slot`` adds the slot name (``4 cpu``, ``2 GiB mem``).
Durations
    ``parse_duration``: a number of seconds (``90``), or numbers with units, largest first and each
    at most once: ``90s``, ``30m``, ``8h``, ``1d``, ``1h30m``, ``1d 2h``, ``1 h 30 min``. Units:
    d/day/days, h/hr/hrs/hour/hours, m/min/mins/minute/minutes, s/sec/secs/second/seconds.
    ``format_duration``: ``30 s``, ``2 min``, ``1 h 30 min``, ``1 d 2 h`` -- the wording of every
    reason shown to users; parsing it gives the duration back.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "MAX_AMOUNT_DIGITS",
    "MAX_AMOUNT_PLACES",
    "MAX_DURATION",
    "MAX_SIZE",
    "MAX_TEXT",
    "format_amount",
    "format_decimal",
    "format_duration",
    "format_size",
    "format_size_rounded",
    "format_size_shown",
    "format_slot",
    "parse_amount",
    "parse_duration",
    "parse_size",
]

# Longest text any parser here reads; longer input is refused before it is looked at.
MAX_TEXT = 64
# 1024 PiB: far beyond any node's memory or any quota, far below anything that could overflow.
MAX_SIZE = 2**60
# Ten years: longer than any timeout or lifetime limit that means something.
MAX_DURATION = timedelta(days=3650)
# Slot amounts: at most 40 digits before the point (an "unlimited" quota is stored as 10**30)
# and 18 after it.
MAX_AMOUNT_DIGITS = 40
MAX_AMOUNT_PLACES = 18

_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
# Largest first: format_size picks the first one that is exact.
_SIZE_LABELS = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
# A number, then an optional unit letter with an optional "b"/"ib", or just "b" (bytes).
_SIZE = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,20}))?\s*(?:([kmgtp])(?:i?b)?|b)?", re.I | re.A)

_DAY, _HOUR, _MINUTE = 86400, 3600, 60
# unit word -> (seconds, rank); a text names its units in falling rank, each at most once.
_DURATION_UNITS = {
    **dict.fromkeys(("d", "day", "days"), (_DAY, 4)),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), (_HOUR, 3)),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), (_MINUTE, 2)),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), (1, 1)),
}
_DURATION_LABELS = ((_DAY, "d"), (_HOUR, "h"), (_MINUTE, "min"), (1, "s"))
_DURATION_PART = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,6}))?\s*([a-z]*)\s*", re.A)
_MICROSECONDS = 10**6
_MAX_DURATION_SECONDS = MAX_DURATION.days * _DAY + MAX_DURATION.seconds

# Wide enough for every bounded number here to be exact (at most 20 + 20 digits times 2**50).
_WIDE = Context(prec=100)
# Beyond this exponent a plain decimal would be a wall of zeros: show scientific notation instead.
_PLAIN_EXPONENT = 60


def _refuse_long_text(text: str, what: str) -> None:
    if len(text) > MAX_TEXT:
        raise ValueError(f"too long for {what} ({len(text)} characters; at most {MAX_TEXT})")


def _shown(value: object) -> str:
    """The value as an error message shows it: never longer than a line, never costly."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_TEXT:
        # repr() of a huge int costs quadratic time (and fails past 4300 digits).
        return f"{'-' if value < 0 else ''}a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= MAX_TEXT else f"{text[: MAX_TEXT - 3]}..."


def _finite_number(value: object, what: str) -> int | Decimal:
    """An int or Decimal from a number (bool, NaN and infinities refused); text is the caller's."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"{_shown(value)} is not {what}")
    if isinstance(value, int):
        return value
    number = Decimal(value)
    if not number.is_finite():
        raise ValueError(f"{_shown(value)} is not a finite number")
    return number


# --- sizes --------------------------------------------------------------------------------------


def parse_size(value: object) -> int:
    """Bytes from ``"512m"``, ``"4g"``, ``"1.5GiB"``, ``"2 GiB"``, ``"1024"`` or a number of bytes.

    Raises ValueError for anything else, for a negative or non-finite number and for a size above
    ``MAX_SIZE``.
    """
    number: int | Decimal
    if isinstance(value, str):
        _refuse_long_text(value, "a size")
        text = value.strip()
        match = _SIZE.fullmatch(text)
        if match is None:
            if text.startswith("-"):
                raise ValueError(f"must not be negative (got {text})")
            raise ValueError(
                f"{value!r} is not a size (use bytes or a binary unit, e.g. 512m, 4g, 1.5GiB)"
            )
        whole, fraction, unit = match.groups()
        number = _WIDE.multiply(
            Decimal(f"{whole}.{fraction or 0}"), Decimal(_SIZE_UNITS[(unit or "").lower()])
        )
    else:
        number = _finite_number(value, "a size")
    if number < 0:
        raise ValueError(f"must not be negative (got {_shown(value)})")
    if number > MAX_SIZE:
        raise ValueError(f"{_shown(value)} is too large (at most {format_size(MAX_SIZE)})")
    if isinstance(number, int):
        return number
    return int(number.to_integral_value(rounding=ROUND_HALF_UP, context=_WIDE))


def format_size(size: int | Decimal) -> str:
    """``1610612736`` -> ``1.5 GiB``; ``1000`` -> ``1000 B``: exact, in the largest binary unit
    that needs at most two decimal places."""
    if isinstance(size, int) and size.bit_length() > 256:  # past every bound: not worth converting
        return f"{_shown(size)} B"
    value = Decimal(size)
    if not value.is_finite() or value.adjusted() > _PLAIN_EXPONENT:
        return f"{format_decimal(value)} B"
    if value < 0:
        return f"-{format_size(-value)}"
    if value >= _SIZE_LABELS[-1][1]:
        if value == value.to_integral_value():
            # Whole bytes (the usual case, and a hot one in the scheduler's reasons):
            # exact integer arithmetic, no Fraction.
            whole = int(value)
            for label, unit in _SIZE_LABELS:
                if whole >= unit and whole * 100 % unit == 0:
                    shown = Decimal(whole * 100 // unit).scaleb(-2)
                    return f"{format_decimal(shown)} {label}"
            return f"{format_decimal(value)} B"
        exact = Fraction(value)
        for label, unit in _SIZE_LABELS:
            if exact >= unit:
                hundredths = exact * 100 / unit
                if hundredths.denominator == 1:
                    return f"{format_decimal(Decimal(hundredths.numerator).scaleb(-2))} {label}"
    return f"{format_decimal(value)} B"


def format_size_rounded(size: int) -> str:
    """``943718400`` -> ``900.0 MiB``; ``1181116006`` -> ``1.1 GiB``; ``512`` -> ``512 B``
    (rounded half up; not meant to be parsed back)."""
    if size < 0:
        return f"-{format_size_rounded(-size)}"
    for label, unit in _SIZE_LABELS:
        if size >= unit:
            tenths = (size * 10 + unit // 2) // unit
            return f"{tenths // 10}.{tenths % 10} {label}"
    return f"{size} B"


def format_size_shown(size: int | Decimal) -> str:
    """``2147483648`` -> ``2 GiB``; ``25276510208`` -> ``23.5 GiB``; ``200000`` -> ``195.3 KiB``:
    in the largest binary unit the size reaches, exact when two decimal places say it exactly."""
    exact = format_size(size)
    value = Decimal(size)
    if not value.is_finite() or value.adjusted() > _PLAIN_EXPONENT or abs(value) < 1024:
        return exact
    whole = int(abs(value))
    largest = next(label for label, unit in _SIZE_LABELS if whole >= unit)
    if exact.endswith(f" {largest}"):
        return exact
    return format_size_rounded(int(value.to_integral_value(rounding=ROUND_HALF_UP)))


# --- slot amounts -------------------------------------------------------------------------------


def parse_amount(value: object) -> Decimal:
    """An exact slot amount from ``2``, ``0.5``, ``"0.25"`` or a Decimal.

    Raises ValueError for anything that is not a finite, non-negative decimal within
    ``MAX_AMOUNT_DIGITS`` digits before the point and ``MAX_AMOUNT_PLACES`` after it.
    """
    out_of_range = ValueError(
        f"{_shown(value)} is out of range (at most {MAX_AMOUNT_DIGITS} digits before the point "
        f"and {MAX_AMOUNT_PLACES} after it)"
    )
    if isinstance(value, str):
        _refuse_long_text(value, "a number")
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a number") from None
        if not number.is_finite():
            raise ValueError(f"{value!r} is not a finite number")
    elif isinstance(value, float):
        # A JSON number: 0.1 means what it says, not its nearest binary fraction.
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        number = Decimal(repr(value))
    else:
        whole = _finite_number(value, "a number")
        if isinstance(whole, int) and abs(whole) >= 10**MAX_AMOUNT_DIGITS:
            raise out_of_range
        number = Decimal(whole)
    if number < 0:
        raise ValueError(f"must not be negative (got {_shown(value)})")
    if number.is_zero():
        return Decimal(0)
    # Both bounds are checked on the exponent before the digits are touched.
    if not -MAX_AMOUNT_PLACES <= number.adjusted() < MAX_AMOUNT_DIGITS:
        raise out_of_range
    exponent = number.normalize(Context(prec=len(number.as_tuple().digits))).as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > MAX_AMOUNT_PLACES:
        raise out_of_range
    return number


def format_decimal(value: Decimal) -> str:
    """The exact value without trailing zeros or exponent: ``Decimal("2.50")`` -> ``2.5``.

    Beyond 60 digits either side of the point it falls back to scientific notation, so the text
    stays short whatever the value.
    """
    if not value.is_finite():
        return str(value)
    if value.is_zero():
        return "0"
    if abs(value.adjusted()) > _PLAIN_EXPONENT:
        return str(value)
    return format(value.normalize(Context(prec=len(value.as_tuple().digits))), "f")


def format_amount(slot: str, value: Decimal) -> str:
    """An amount of one slot for people: ``mem`` as a size (``2 GiB``), others plain (``0.5``)."""
    if slot == "mem":
        return format_size(value)
    return format_decimal(value)


def format_slot(slot: str, value: Decimal) -> str:
    """An amount with its slot's name: ``4 cpu``, ``2 GiB mem``, ``1 cuda.device``."""
    return f"{format_amount(slot, value)} {slot}"


# --- durations ----------------------------------------------------------------------------------


def parse_duration(value: object) -> timedelta:
    """A duration from seconds (``90``, ``"90"``) or text with units (``"1h30m"``, ``"1 d 2 h"``).

    Raises ValueError for junk, a unit out of order or repeated, a negative duration and one longer
    than ``MAX_DURATION``. Precision: one microsecond (half up).
    """
    seconds: int | Decimal
    if isinstance(value, str):
        seconds = _duration_text_seconds(value)
    else:
        seconds = _finite_number(value, "a duration")
    if seconds < 0:
        raise ValueError(f"must not be negative (got {_shown(value)})")
    # Compared before any arithmetic: a huge number or exponent never reaches it.
    if seconds > _MAX_DURATION_SECONDS:
        raise ValueError(f"{_shown(value)} is too long (at most {format_duration(MAX_DURATION)})")
    microseconds = _WIDE.multiply(Decimal(seconds), Decimal(_MICROSECONDS))
    return timedelta(microseconds=int(microseconds.to_integral_value(rounding=ROUND_HALF_UP)))


def _duration_text_seconds(value: str) -> Decimal:
    _refuse_long_text(value, "a duration")
    text = value.strip().lower()
    if text.startswith("-"):
        raise ValueError(f"must not be negative (got {value.strip()})")
    junk = ValueError(
        f"{value!r} is not a duration (use seconds or e.g. 90s, 30m, 8h, 1d, 1h30m, 1d 2h)"
    )
    if not text:
        raise junk
    total = Decimal(0)
    position, last_rank = 0, 5
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        if match is None:
            raise junk
        whole, fraction, unit = match.groups()
        if unit == "":
            # A bare number means seconds, and only on its own ("90", not "1m30").
            if position != 0 or match.end() != len(text):
                raise junk
            size, rank = 1, 0
        elif unit in _DURATION_UNITS:
            size, rank = _DURATION_UNITS[unit]
        else:
            raise junk
        if rank >= last_rank:  # largest unit first, each at most once
            raise junk
        part = _WIDE.multiply(Decimal(f"{whole}.{fraction or 0}"), Decimal(size))
        total = _WIDE.add(total, part)
        position, last_rank = match.end(), rank
    return total


def format_duration(delta: timedelta) -> str:
    """``timedelta(minutes=2)`` -> ``2 min``; 90 minutes -> ``1 h 30 min``; 26 hours -> ``1 d 2 h``.

    Whole seconds, except below one second (``0.5 s``, ``0 s``).
    """
    microseconds = (delta.days * _DAY + delta.seconds) * _MICROSECONDS + delta.microseconds
    sign = "-" if microseconds < 0 else ""
    seconds, rest = divmod(abs(microseconds), _MICROSECONDS)
    if seconds == 0:
        return f"{sign}{format_decimal(Decimal(rest).scaleb(-6))} s"
    parts = []
    for size, label in _DURATION_LABELS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {label}")
    return sign + " ".join(parts)
