"""ResourceSlots: the exact-decimal value type the scheduler computes with."""

import pickle
from decimal import Decimal

import pytest

from scheduler_app.policy import ResourceSlots

GIB = 2**30


def rs(**values: str | int) -> ResourceSlots:
    return ResourceSlots.from_mapping({k.replace("_", "."): v for k, v in values.items()})


def test_it_parses_strings_ints_and_decimals_into_normalized_strings() -> None:
    slots = ResourceSlots.from_mapping(
        {"cpu": "2.50", "mem": GIB, "cuda.shares": Decimal("0.10"), "cuda.device": 0}
    )
    assert slots.to_dict() == {"cpu": "2.5", "cuda.shares": "0.1", "mem": "1073741824"}


def test_a_missing_slot_counts_as_zero() -> None:
    assert rs(cpu=2)["mem"] == 0
    assert rs(cpu=2) == rs(cpu="2.0", mem=0)
    assert ResourceSlots.zero().to_dict() == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "slot cpu: '-1' is negative"),
        ("NaN", "slot cpu: 'NaN' is not a finite number"),
        ("Infinity", "slot cpu: 'Infinity' is not a finite number"),
        ("two", "slot cpu: 'two' is not a decimal number"),
        (1.5, "slot cpu: 1.5 is not a decimal number"),
        (True, "slot cpu: True is not a decimal number"),
        ("1e-40", "slot cpu: '1e-40' is out of range"),
        ("1e41", "slot cpu: '1e41' is out of range"),
    ],
)
def test_it_rejects_a_bad_value_naming_the_slot(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResourceSlots.from_mapping({"cpu": value})  # type: ignore[dict-item]


def test_arithmetic_is_exact() -> None:
    total = ResourceSlots.zero()
    for _ in range(10):
        total = total + rs(cpu="0.1")
    assert total == rs(cpu=1)
    assert rs(cpu=4, mem=GIB) - rs(cpu="0.5") == rs(cpu="3.5", mem=GIB)
    assert rs(cpu="1.5", mem=GIB) * 3 == rs(cpu="4.5", mem=3 * GIB)
    assert 3 * rs(cpu=1) == rs(cpu=3)
    assert rs(cpu=1) * 0 == ResourceSlots.zero()


def test_subtracting_more_than_there_is_gives_a_negative_amount_that_fits_nowhere() -> None:
    overdrawn = rs(cpu=2) - rs(cpu=3)
    assert overdrawn["cpu"] == -1
    assert not ResourceSlots.zero().fits_in(overdrawn)


def test_fits_in_compares_every_slot() -> None:
    agent = rs(cpu=4, mem=8 * GIB)
    assert rs(cpu=4, mem=8 * GIB).fits_in(agent)
    assert rs(cpu=1).fits_in(agent)
    assert not rs(cpu="4.001").fits_in(agent)
    assert not rs(cpu=1, cuda_device=1).fits_in(agent)


def test_shortfall_names_what_is_missing() -> None:
    request = rs(cpu=8, mem=4 * GIB, cuda_device=1)
    free = rs(cpu=6, mem=16 * GIB)
    assert request.shortfall(free) == {"cpu": Decimal(2), "cuda.device": Decimal(1)}
    assert request.shortfall(request) == {}


def test_dominant_share_is_the_largest_share_of_any_resource() -> None:
    total = rs(cpu=100, mem=1000 * GIB)
    assert rs(cpu=10, mem=400 * GIB).dominant_share(total) == Decimal("0.4")
    assert rs(cpu=30, mem=100 * GIB).dominant_share(total) == Decimal("0.3")
    # A slot the total does not have is not part of this group's share.
    assert rs(cuda_device=2).dominant_share(total) == 0


def test_only_slots_other_than_cpu_and_mem_are_accelerators() -> None:
    assert rs(cuda_device=1).has_accelerator
    assert rs(cpu=1, cuda_shares="0.5").has_accelerator
    assert not rs(cpu=64, mem=GIB).has_accelerator


def test_equal_values_hash_alike_and_survive_pickling() -> None:
    assert hash(rs(cpu="1.0")) == hash(rs(cpu=1))
    assert len({rs(cpu="1.0"), rs(cpu=1), rs(cpu=2)}) == 2
    assert pickle.loads(pickle.dumps(rs(cpu="1.5"))) == rs(cpu="1.5")


def test_it_is_immutable() -> None:
    slots = rs(cpu=1)
    with pytest.raises(AttributeError):
        slots._items = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        ResourceSlots()


def test_a_huge_amount_stands_for_unlimited_and_stays_exact() -> None:
    unlimited = Decimal(10) ** 30
    quota = ResourceSlots.from_mapping({"cpu": 8, "mem": unlimited})
    # (Python's default decimal context would round this sum to 28 digits.)
    assert (quota + rs(mem=1))["mem"] == Decimal("1" + "0" * 29 + "1")
    assert rs(cpu=8, mem=512 * GIB).fits_in(quota)
