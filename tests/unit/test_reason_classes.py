"""Why a session waits, in classes: the label of ``bai_sessions_pending``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessions_app import policy as P


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("", "new"),
        (P.total_slots_refusal(slot="cpu", held=1, wanted=2, allowed=2, amount=str) or "", "quota"),
        (P.concurrent_refusal(3, 3) or "", "quota"),
        (P.containers_refusal(4, 2) or "", "quota"),
        (P.dependencies_wait(["a"]), "dependencies"),
        (P.start_time_wait(datetime(2030, 1, 1, tzinfo=UTC)), "start_time"),
        (P.queued_behind("0123456789"), "queued_behind"),
        (P.no_live_agent("default"), "no_agent"),
        (
            P.capacity_refusal(need="needs 16 cpu", where=" per container", group="g", largest="8"),
            "too_big",
        ),
        ("needs 9 cpu per container; no agent in resource group g is big enough", "too_big"),
        (
            P.free_shortage(
                need="needs 8 cpu",
                where=" per container",
                label="largest free on an agent",
                largest="2",
            ),
            "resources",
        ),
        ("needs 1 cpu per container; no agent has all of it free", "resources"),
        (
            "multi-node cluster of 3 needs 1 cpu per container; only 1 of 3 containers fit on the free agents at once",
            "resources",
        ),
        (
            "pinned to agent a1: it is not alive and schedulable in resource group g",
            "pinned_agents",
        ),
        ("session type batch is not allowed in resource group g", "session_type"),
        ("my selector declined", "other"),
    ],
)
def test_every_pending_reason_falls_in_its_class(reason, expected):
    assert P.reason_class(reason) == expected
