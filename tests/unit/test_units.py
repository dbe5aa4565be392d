"""bai_common.units: the one place sizes, durations and slot amounts are read and shown."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest

from bai_common.units import (
    MAX_DURATION,
    MAX_SIZE,
    MAX_TEXT,
    format_amount,
    format_decimal,
    format_duration,
    format_size,
    format_size_shown,
    format_slot,
    parse_amount,
    parse_duration,
    parse_size,
)

KIB, MIB, GIB, TIB, PIB = 2**10, 2**20, 2**30, 2**40, 2**50

# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("1024", 1024),
        ("0", 0),
        (" 512m ", 512 * MIB),
        ("4g", 4 * GIB),
        ("4G", 4 * GIB),
        ("4gb", 4 * GIB),
        ("4GiB", 4 * GIB),
        ("1.5GiB", GIB * 3 // 2),
        ("2 GiB", 2 * GIB),
        ("1.5k", 1536),
        ("3 KiB", 3 * KIB),
        ("2t", 2 * TIB),
        ("1p", PIB),
        ("10 B", 10),
        ("0.3k", 307),  # a fraction of a byte rounds half up
        ("0.5", 1),
        ("1024p", MAX_SIZE),
        (4096, 4096),
        (1.5, 2),
        (Decimal("2048"), 2048),
    ],
)
def test_sizes_parse_as_binary_units(given, size):
    assert parse_size(given) == size


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("four gigs", "is not a size"),
        ("", "is not a size"),
        ("4 x", "is not a size"),
        ("4gig", "is not a size"),
        ("ib", "is not a size"),
        ("4ib", "is not a size"),
        (".5g", "is not a size"),
        ("1e9", "is not a size"),
        ("0x10", "is not a size"),
        ("١٢", "is not a size"),  # digits of another script are not digits here
        ("nan", "is not a size"),
        ("inf", "is not a size"),
        ("-5g", "must not be negative"),
        (-5, "must not be negative"),
        (Decimal("-1"), "must not be negative"),
        (float("nan"), "is not a finite number"),
        (float("inf"), "is not a finite number"),
        (Decimal("Infinity"), "is not a finite number"),
        (None, "is not a size"),
        (True, "is not a size"),
        ([4], "is not a size"),
        ("1025p", "too large (at most 1024 PiB)"),
        (MAX_SIZE + 1, "too large"),
        pytest.param(10**5000, "too large", id="a-5000-digit-int"),
        (Decimal("1e999999"), "too large"),
        ("1" * 21, "is not a size"),
        ("1" * (MAX_TEXT + 1), f"at most {MAX_TEXT}"),
    ],
)
def test_a_bad_size_is_refused_with_the_reason(given, words):
    with pytest.raises(ValueError) as refused:
        parse_size(given)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1000, "1000 B"),
        (KIB, "1 KiB"),
        (1536, "1.5 KiB"),
        (768 * MIB, "768 MiB"),
        (GIB, "1 GiB"),
        (GIB * 3 // 2, "1.5 GiB"),
        (GIB + GIB // 4, "1.25 GiB"),
        (40 * GIB, "40 GiB"),
        (3 * TIB, "3 TiB"),
        (MAX_SIZE, "1024 PiB"),
        # not exact to two places in GiB, so the next unit down that is
        (GIB + KIB, "1048577 KiB"),
        (GIB + 1, "1073741825 B"),
        (Decimal("1.5"), "1.5 B"),
        (-2 * GIB, "-2 GiB"),
    ],
)
def test_sizes_format_exactly_in_the_largest_binary_unit_that_fits(size, text):
    assert format_size(size) == text


@pytest.mark.parametrize(
    "size", [0, 1, 999, KIB, 1536, 5 * MIB + 1, GIB * 3 // 2, GIB + KIB, 7 * TIB + 3, MAX_SIZE]
)
def test_a_formatted_size_parses_back_to_the_same_size(size):
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize("size", [10**30, 10**70, 2**1000])
def test_a_size_beyond_every_bound_still_formats_briefly(size):
    assert len(format_size(size)) < 2 * MAX_TEXT


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1000, "1000 B"),
        (GIB, "1 GiB"),
        (GIB + GIB // 4, "1.25 GiB"),
        # a node's memory as a machine reports it: not "24684092 KiB"
        (24684092 * KIB, "23.5 GiB"),
        (GIB + KIB, "1.0 GiB"),
        (200000, "195.3 KiB"),
        (5 * PIB + 1, "5.0 PiB"),
        (-24684092 * KIB, "-23.5 GiB"),
    ],
)
def test_a_shown_size_is_always_in_the_largest_unit_it_reaches(size, text):
    assert format_size_shown(size) == text


# --- slot amounts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "amount"),
    [
        ("2", Decimal(2)),
        (" 0.5 ", Decimal("0.5")),
        (4, Decimal(4)),
        (0.1, Decimal("0.1")),  # a JSON number means its decimal text
        (Decimal("2.50"), Decimal("2.5")),
        ("0", Decimal(0)),
        ("0E-1000000", Decimal(0)),
        ("1e39", Decimal("1e39")),
        ("0.000000000000000001", Decimal("1e-18")),
        ("1.500000000000000000000000", Decimal("1.5")),  # trailing zeros are not places
    ],
)
def test_amounts_parse_exactly(given, amount):
    assert parse_amount(given) == amount


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("lots", "is not a number"),
        ("", "is not a number"),
        (None, "is not a number"),
        (True, "is not a number"),
        ({}, "is not a number"),
        ("NaN", "is not a finite number"),
        ("-Infinity", "is not a finite number"),
        (float("inf"), "is not a finite number"),
        (-1, "must not be negative"),
        ("-0.5", "must not be negative"),
        ("1e40", "out of range"),
        ("1e-19", "out of range"),
        ("1.0000000000000000001", "out of range"),
        (10**40, "out of range"),
        pytest.param(10**5000, "out of range", id="a-5000-digit-int"),
        (Decimal("1e999999999"), "out of range"),
        (Decimal("1e-999999999"), "out of range"),
        ("1" * (MAX_TEXT + 1), f"at most {MAX_TEXT}"),
    ],
)
def test_a_bad_amount_is_refused_with_the_reason(given, words):
    with pytest.raises(ValueError) as refused:
        parse_amount(given)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("slot", "amount", "text", "with_slot"),
    [
        ("cpu", Decimal("4"), "4", "4 cpu"),
        ("cpu", Decimal("0.50"), "0.5", "0.5 cpu"),
        ("cpu", Decimal("1E+2"), "100", "100 cpu"),
        ("cpu", Decimal(0), "0", "0 cpu"),
        ("cuda.shares", Decimal("0.25"), "0.25", "0.25 cuda.shares"),
        ("mem", Decimal(2 * GIB), "2 GiB", "2 GiB mem"),
        ("mem", Decimal(768 * MIB), "768 MiB", "768 MiB mem"),
        ("mem", Decimal(0), "0 B", "0 B mem"),
    ],
)
def test_amounts_are_shown_plainly_and_mem_as_a_size(slot, amount, text, with_slot):
    assert format_amount(slot, amount) == text
    assert format_slot(slot, amount) == with_slot


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (Decimal("2.50"), "2.5"),
        (Decimal("-0"), "0"),
        (Decimal("1.0000000000000000000000000000001"), "1.0000000000000000000000000000001"),
        (Decimal("1e100"), "1E+100"),  # a wall of zeros would help no one
    ],
)
def test_decimals_are_shown_exactly_and_briefly(amount, text):
    assert format_decimal(amount) == text


@pytest.mark.parametrize("text", ["0", "2", "0.5", "1e39", "123.000000000000000001"])
def test_a_formatted_amount_parses_back_to_the_same_amount(text):
    amount = parse_amount(text)
    assert parse_amount(format_decimal(amount)) == amount


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "duration"),
    [
        ("90", timedelta(seconds=90)),
        ("0", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("8h", timedelta(hours=8)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d 2h", timedelta(days=1, hours=2)),
        ("1 h 30 min", timedelta(hours=1, minutes=30)),
        ("2 days 3 hours 4 minutes 5 seconds", timedelta(days=2, hours=3, minutes=4, seconds=5)),
        ("1 D 2 Hrs", timedelta(days=1, hours=2)),
        ("1.5h", timedelta(hours=1, minutes=30)),
        ("0.5 s", timedelta(milliseconds=500)),
        ("0.000001s", timedelta(microseconds=1)),
        ("3650d", MAX_DURATION),
        (90, timedelta(seconds=90)),
        (0.25, timedelta(milliseconds=250)),
        (Decimal("1.5"), timedelta(seconds=1.5)),
    ],
)
def test_durations_parse_from_seconds_or_units(given, duration):
    assert parse_duration(given) == duration


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("", "is not a duration"),
        ("   ", "is not a duration"),
        ("soon", "is not a duration"),
        ("1 fortnight", "is not a duration"),
        ("1h30", "is not a duration"),  # a bare number only on its own
        ("30m 1h", "is not a duration"),  # largest unit first
        ("1m 1m", "is not a duration"),  # each unit once
        ("1e5", "is not a duration"),
        ("1.5.5s", "is not a duration"),
        (".5s", "is not a duration"),
        ("0.0000001s", "is not a duration"),  # finer than a microsecond
        ("١٢s", "is not a duration"),
        ("-5m", "must not be negative"),
        (-5, "must not be negative"),
        (float("nan"), "is not a finite number"),
        (float("-inf"), "is not a finite number"),
        (None, "is not a duration"),
        (True, "is not a duration"),
        ("3651d", "too long (at most 3650 d)"),
        ("9999999999999d", "is not a duration"),  # more digits than any duration needs
        ("87600h 1s", "too long"),
        pytest.param(10**5000, "too long", id="a-5000-digit-int"),
        (Decimal("1e999999999"), "too long"),
        ("1" + "0" * MAX_TEXT, f"at most {MAX_TEXT}"),
    ],
)
def test_a_bad_duration_is_refused_with_the_reason(given, words):
    with pytest.raises(ValueError) as refused:
        parse_duration(given)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(0), "0 s"),
        (timedelta(milliseconds=500), "0.5 s"),
        (timedelta(microseconds=1), "0.000001 s"),
        (timedelta(seconds=30), "30 s"),
        (timedelta(seconds=90.7), "1 min 30 s"),  # whole seconds from one second up
        (timedelta(minutes=2), "2 min"),
        (timedelta(hours=1), "1 h"),
        (timedelta(hours=1, minutes=30), "1 h 30 min"),
        (timedelta(days=1, hours=2), "1 d 2 h"),
        (timedelta(days=7), "7 d"),
        (-timedelta(minutes=2), "-2 min"),
        (timedelta.max, "999999999 d 23 h 59 min 59 s"),
        (timedelta.min, "-999999999 d"),
    ],
)
def test_durations_format_in_the_words_users_read(duration, text):
    assert format_duration(duration) == text


@pytest.mark.parametrize(
    "duration",
    [
        timedelta(0),
        timedelta(microseconds=1),
        timedelta(milliseconds=250),
        timedelta(seconds=59),
        timedelta(minutes=2),
        timedelta(hours=1, minutes=30, seconds=5),
        timedelta(days=1, hours=2),
        MAX_DURATION,
    ],
)
def test_a_formatted_duration_parses_back_to_the_same_duration(duration):
    assert parse_duration(format_duration(duration)) == duration


# --- bounds -------------------------------------------------------------------------------------


HUGE_INT = 10**100000


@pytest.mark.parametrize(
    ("parse", "hostile"),
    [
        (parse_size, "9" * 10**6),
        (parse_size, "1" * 20 + "." + "1" * 20 + "p"),
        (parse_size, HUGE_INT),
        (parse_amount, "9" * 10**6),
        (parse_amount, "1e" + "9" * 50),
        (parse_amount, HUGE_INT),
        (parse_duration, "1" * 10**6),
        (parse_duration, "1d " * 10**5),
        (parse_duration, HUGE_INT),
    ],
    ids=[
        "size-a-million-digits",
        "size-longest-numbers-in-pib",
        "size-huge-int",
        "amount-a-million-digits",
        "amount-huge-exponent",
        "amount-huge-int",
        "duration-a-million-digits",
        "duration-many-parts",
        "duration-huge-int",
    ],
)
def test_hostile_input_is_refused_quickly(parse, hostile):
    started = time.process_time()  # CPU time: a busy machine must not fail the bound
    with pytest.raises(ValueError) as refused:
        parse(hostile)
    assert time.process_time() - started < 0.05
    assert len(str(refused.value)) < 4 * MAX_TEXT  # the message never echoes the whole input
