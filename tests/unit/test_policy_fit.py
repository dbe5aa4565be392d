"""Will it fit now: ``sessions_app.policy.placement_shortage`` on plain slot mappings,
with the scheduler's words for a session that waits."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sessions_app.policy import placement_shortage

GIB = 2**30


def slots(cpu, mem_gib=1, **extra):
    out = {"cpu": Decimal(str(cpu)), "mem": Decimal(mem_gib * GIB)}
    out.update({k.replace("_", "."): Decimal(str(v)) for k, v in extra.items()})
    return out


@pytest.mark.parametrize(
    ("kernels", "single_node", "free", "reason"),
    [
        ([slots(2)], True, [slots(4, 8)], None),
        (
            [slots(8)],
            True,
            [slots(6, 8), slots(2, 8)],
            "needs 8 cpu per container; largest free on an agent: 6",
        ),
        (
            [slots(1, 48)],
            True,
            [slots(8, 32)],
            "needs 48 GiB mem per container; largest free on an agent: 32 GiB",
        ),
        (
            [slots(3)] * 2,
            True,
            [slots(4, 8), slots(4, 8)],
            "single-node cluster of 2 needs 6 cpu on one agent; largest free: 4",
        ),
        ([slots(3)] * 2, False, [slots(4, 8), slots(4, 8)], None),
        (
            [slots(3)] * 3,
            False,
            [slots(4, 8), slots(4, 8)],
            "multi-node cluster of 3 needs 3 cpu and 1 GiB mem per container; only 2 of 3 containers fit on the free agents at once",
        ),
        ([slots(2)] * 3, False, [slots(6, 8)], None),  # all on one agent
        (
            [slots(1, cuda_device=1)],
            True,
            [slots(8, 8)],
            "needs 1 cuda.device per container; largest free on an agent: 0",
        ),
        (
            [slots(2, 2)],
            True,
            [slots(4, 1), slots(1, 4)],
            "needs 2 cpu and 2 GiB mem per container; no agent has all of it free",
        ),
        ([slots(1)], True, [], "no agent alive and schedulable in resource group g"),
    ],
)
def test_the_shortage_names_what_is_missing_in_the_schedulers_words(
    kernels, single_node, free, reason
):
    assert (
        placement_shortage(kernels=kernels, single_node=single_node, free=free, group="g") == reason
    )


def test_an_oversubscribed_agent_counts_as_having_nothing_free():
    free = [{"cpu": Decimal(-2), "mem": Decimal(GIB)}]

    reason = placement_shortage(kernels=[slots(1)], single_node=True, free=free, group="g")

    assert reason == "needs 1 cpu per container; largest free on an agent: 0"
