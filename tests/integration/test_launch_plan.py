"""Launch validation as a plan (sessions_app.launch): rules the issue changed.

Personas (tests/conftest.py): ``alice`` launches as a plain user; ``admin`` may
pin a session to agents.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.utils import timezone
from session_steps import exit_main, launch, place, run

from sessions_app import launch as launching
from sessions_app import services
from sessions_app.errors import Forbidden, InvalidInput
from sessions_app.models import Session, Status

pytestmark = pytest.mark.django_db


def _refused(excinfo: pytest.ExceptionInfo, field: str) -> str:
    assert field in excinfo.value.extra["fields"], excinfo.value.extra
    return " ".join(excinfo.value.extra["fields"][field])


def test_a_plan_is_frozen_and_holds_one_entry_per_kernel(alice, image, agent):
    plan = launching.plan_launch(
        owner=alice,
        spec={
            "image": image.reference,
            "cluster_size": 3,
            "cluster_mode": "multi-node",
            "resources": {"cpu": "1", "mem": "1g"},
            "roles": {"sub": {"resources": {"cpu": "2"}}},
        },
    )
    assert [str(s["cpu"]) for s in plan.kernel_slots] == ["1", "2", "2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("field", ["starts_at", "batch_timeout"])
def test_a_start_time_or_batch_timeout_on_an_interactive_session_is_refused(
    alice, image, agent, field
):
    value = "2030-01-01T09:00:00Z" if field == "starts_at" else 60
    with pytest.raises(InvalidInput) as excinfo:
        services.session_create(owner=alice, spec={"image": image.reference, field: value})
    assert "batch sessions only" in _refused(excinfo, field)
    assert not Session.objects.exists()


def test_a_batch_session_keeps_its_start_time(alice, image, agent):
    tomorrow = timezone.now() + timedelta(days=1)
    session = launch(alice, type="batch", startup_command="true", starts_at=tomorrow.isoformat())
    assert session.starts_at == tomorrow


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "job\n"}, "name"),
        ({"env": {"NAME\n": "v"}}, "env"),
        ({"starts_at": "9999-12-31T23:59:59-14:00", "type": "batch"}, "starts_at"),
        ({"starts_at": "0001-01-01T00:00:00+14:00", "type": "batch"}, "starts_at"),
        ({"batch_timeout": 8e13, "type": "batch"}, "batch_timeout"),
        ({"resources": {"cpu": "0.0000000000000000001"}}, "resources"),
        ({"resources": {"cpu": "0.0000000001", "mem": 0.5}}, "resources"),
        ({"resources": {"cpu": "0.001"}}, "resources"),
        ({"startup_command": "echo \x00"}, "startup_command"),
        ({"env": {"A": "x\x00y"}}, "env"),
    ],
)
def test_unbounded_or_malformed_values_are_refused_before_anything_is_written(
    alice, image, agent, spec, field
):
    spec = {"image": image.reference, "startup_command": "true", **spec}
    with pytest.raises(InvalidInput) as excinfo:
        services.session_create(owner=alice, spec=spec)
    assert _refused(excinfo, field)
    assert not Session.objects.exists()


def test_a_plain_user_may_not_pin_a_session_to_agents(alice, image, agent):
    with pytest.raises(Forbidden) as excinfo:
        services.session_create(owner=alice, spec={"image": image.reference, "agents": [agent.pk]})
    assert "only admins" in _refused(excinfo, "agents")
    assert not Session.objects.exists()


def test_an_admin_may_not_pin_a_session_to_an_unknown_agent(admin, image, agent):
    with pytest.raises(InvalidInput) as excinfo:
        services.session_create(owner=admin, spec={"image": image.reference, "agents": ["nope"]})
    assert "no agent 'nope'" in _refused(excinfo, "agents")


def test_a_cancelled_dependant_names_every_unsatisfied_dependency(alice, image, agent):
    prep = run(launch(alice, name="prep", type="batch", startup_command="false"))
    fetch = run(launch(alice, name="fetch", type="batch", startup_command="sleep 60"))
    train = launch(
        alice,
        name="train",
        type="batch",
        startup_command="true",
        depends_on=[str(prep.pk), str(fetch.pk)],
    )
    exit_main(prep, 1)
    train.refresh_from_db()
    assert train.status == Status.CANCELLED
    assert train.status_reason == (
        "dependency prep ended FAILED (exit code 1); dependency fetch had not finished"
    )


def test_an_admin_pins_a_session_and_the_scheduler_places_it_only_there(
    admin, image, agent, make_agent
):
    other = make_agent("agent-2", cpu="8")
    pinned = launch(admin, name="pinned", agents=[other.pk])
    assert pinned.designated_agents == [other.pk]
    placed = place(pinned)
    assert placed.status == Status.SCHEDULED
    assert {k.agent_id for k in placed.kernels.all()} == {other.pk}
