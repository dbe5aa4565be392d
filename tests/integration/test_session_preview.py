"""POST /api/v1/sessions/preview/: will it fit? The launch spec of POST /sessions/, judged
without launching: start_now, wait (and for what) or never (in the launch's own words),
with what is left of the user's quota and what the group has free now. It writes nothing.

Personas (tests/conftest.py): ``alice`` asks; the ``default`` group has one agent with
8 cpu and 16 GiB unless a test says otherwise.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sessions_app.models import (
    Agent,
    Kernel,
    ResourcePolicy,
    Session,
    SessionEvent,
    SessionSelection,
    Status,
    UserResourcePolicy,
)

URL = "/api/v1/sessions/preview/"
LAUNCH = "/api/v1/sessions/"
GIB = 2**30

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


@pytest.fixture
def preview(as_alice, image, agent):
    """POST a spec to the preview as alice; returns the JSON body of a 200."""

    def post(expect: int = 200, **spec):
        spec.setdefault("image", image.reference)
        response = as_alice.post(URL, spec, format="json")
        assert response.status_code == expect, response.content
        return response.json()

    return post


def _holding(owner, image, agent, *, cpu="1", mem=GIB, status=Status.RUNNING, name=None):
    """A session of ``owner`` whose one kernel holds slots on ``agent``."""
    session = Session.objects.create(
        owner=owner,
        name=name or f"held-{Session.objects.count()}",
        image=image,
        resource_group=agent.resource_group,
        status=status,
    )
    Kernel.objects.create(
        id=session.pk,
        session=session,
        cluster_role="main",
        cluster_idx=1,
        local_rank=0,
        cluster_hostname="main1",
        image=image.reference,
        requested_slots={"cpu": cpu, "mem": str(mem)},
        agent=agent if status != Status.PENDING else None,
        status=status,
    )
    return session


def _policy(alice, **limits) -> ResourcePolicy:
    policy = ResourcePolicy.objects.create(name="alice-policy", **limits)
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    return policy


# --- start now ----------------------------------------------------------------------------------


def test_a_session_that_fits_the_free_slots_starts_now(preview):
    body = preview(resources={"cpu": "2", "mem": "4g"})

    assert body["verdict"] == "start_now"
    assert body["reasons"] == []
    assert body["reason"] == "fits now: an agent of resource group default has room for it"
    assert body["resources"]["total"] == {"cpu": "2", "mem": str(4 * GIB)}
    assert body["resources"]["text"] == "2 cpu, 4 GiB mem"


def test_the_preview_shows_per_container_and_total_slots_of_a_cluster(preview):
    body = preview(cluster_mode="multi-node", cluster_size=3, resources={"cpu": 1, "mem": "1g"})

    assert body["resources"]["containers"] == [
        {"role": "main", "count": 1, "resources": {"cpu": "1", "mem": str(GIB)}},
        {"role": "sub", "count": 2, "resources": {"cpu": "1", "mem": str(GIB)}},
    ]
    assert body["resources"]["total"] == {"cpu": "3", "mem": str(3 * GIB)}
    assert body["resources"]["cluster_size"] == 3


def test_a_multi_node_cluster_that_fits_only_spread_over_agents_starts_now(
    preview, make_agent, agent, alice, image
):
    Agent.objects.filter(pk=agent.pk).delete()
    for name in ("a", "b"):
        make_agent(name, cpu="4", mem=16 * GIB)

    body = preview(cluster_mode="multi-node", cluster_size=2, resources={"cpu": 3, "mem": "1g"})

    assert body["verdict"] == "start_now", body["reason"]
    assert body["reason"] == (
        "fits now: the agents of resource group default have room for all 2 containers"
    )


# --- the group's free slots -------------------------------------------------------------------


def test_a_session_larger_than_what_is_free_now_waits_with_the_shortage(
    preview, alice, bob, image, agent
):
    _holding(bob, image, agent, cpu="2")

    body = preview(resources={"cpu": "8", "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == "needs 8 cpu per container; largest free on an agent: 6"


def test_a_single_node_cluster_waits_for_one_agent_with_room_for_all(
    preview, make_agent, agent, bob, image
):
    _holding(bob, image, agent, cpu="4")
    make_agent("agent-2", cpu="4", mem=16 * GIB)

    body = preview(cluster_mode="single-node", cluster_size=2, resources={"cpu": 3, "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == "single-node cluster of 2 needs 6 cpu on one agent; largest free: 4"


def test_a_group_without_a_live_agent_makes_the_session_wait(preview, agent):
    Agent.objects.filter(pk=agent.pk).update(status="LOST")

    body = preview(resources={"cpu": "1", "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == "no agent alive and schedulable in resource group default"
    assert body["resource_group"]["agents"] == 0


def test_the_group_shows_capacity_occupied_free_and_the_largest_free_per_slot(
    preview, make_agent, agent, bob, image
):
    other = make_agent("agent-2", cpu="4", mem=8 * GIB)
    _holding(bob, image, agent, cpu="5", mem=4 * GIB)
    _holding(bob, image, other, cpu="1", mem=GIB)
    make_agent("drained", cpu="64", mem=64 * GIB, schedulable=False)

    group = preview(resources={"cpu": "1", "mem": "1g"})["resource_group"]

    assert group["name"] == "default" and group["agents"] == 2
    assert group["slots"]["cpu"] == {
        "capacity": "12",
        "occupied": "6",
        "free": "6",
        "largest_free": "3",
        "text": "6 free of 12 cpu; at most 3 on one agent",
    }
    assert group["slots"]["mem"]["free"] == str(19 * GIB)
    assert group["slots"]["mem"]["largest_free"] == str(12 * GIB)
    assert group["slots"]["mem"]["text"] == "19 GiB free of 24 GiB mem; at most 12 GiB on one agent"
    assert group["slots"]["cuda.device"]["capacity"] == "0"


# --- the user's quota ---------------------------------------------------------------------------


def test_the_preview_shows_what_is_left_of_the_users_quota(preview, alice, image, agent):
    _policy(
        alice,
        total_resource_slots={"cpu": "8", "mem": str(16 * GIB)},
        max_concurrent_sessions=3,
        max_pending_sessions=5,
    )
    _holding(alice, image, agent, cpu="2", mem=4 * GIB)
    _holding(alice, image, agent, status=Status.PENDING)

    quota = preview(resources={"cpu": "1", "mem": "1g"})["quota"]

    assert quota["policy"] == "alice-policy"
    assert quota["slots"]["cpu"] == {
        "limit": "8",
        "used": "2",
        "left": "6",
        "text": "6 left of 8 cpu",
    }
    assert quota["slots"]["mem"]["left"] == str(12 * GIB)
    assert quota["slots"]["cuda.device"] == {
        "limit": None,
        "used": "0",
        "left": None,
        "text": "unlimited",
    }
    assert quota["sessions"] == {"limit": 3, "active": 1, "left": 2}
    assert quota["pending_sessions"] == {"limit": 5, "pending": 1, "left": 4}
    assert quota["max_containers_per_session"] == 8


def test_a_session_over_what_is_left_of_the_slot_quota_waits(preview, alice, image, agent):
    _policy(alice, total_resource_slots={"cpu": "8"})
    _holding(alice, image, agent, cpu="6")

    body = preview(resources={"cpu": "4", "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == "quota: total cpu would be 10 of 8 allowed (2 over)"


def test_a_session_over_the_concurrent_session_quota_waits(preview, alice, image, agent):
    _policy(alice, max_concurrent_sessions=1)
    _holding(alice, image, agent)

    body = preview(resources={"cpu": "1", "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == "quota: 1 concurrent sessions allowed; 1 already active"


def test_every_reason_to_wait_is_listed(preview, alice, bob, image, agent):
    _policy(alice, max_concurrent_sessions=1)
    _holding(alice, image, agent, cpu="1")
    _holding(bob, image, agent, cpu="6")

    body = preview(resources={"cpu": "4", "mem": "1g"})

    assert body["reasons"] == [
        "quota: 1 concurrent sessions allowed; 1 already active",
        "needs 4 cpu per container; largest free on an agent: 1",
    ]


# --- never: the launch's own words --------------------------------------------------------------


def _launch_refusal(as_alice, spec) -> tuple[int, str]:
    response = as_alice.post(LAUNCH, spec, format="json")
    return response.status_code, response.json()["message"]


def test_a_session_larger_than_any_agent_can_never_fit_in_the_launchs_words(
    preview, as_alice, image
):
    spec = {"image": image.reference, "resources": {"cpu": "16", "mem": "1g"}}

    body = preview(**spec)

    assert body["verdict"] == "never"
    status, message = _launch_refusal(as_alice, spec)
    assert status == 400
    assert body["reason"] == message
    assert "no agent in resource group default has that much" in message
    assert body["reasons"] == [message]


def test_a_session_over_the_whole_slot_quota_can_never_fit_in_the_launchs_words(
    preview, as_alice, alice, image
):
    _policy(alice, total_resource_slots={"cpu": "4"})
    spec = {"image": image.reference, "resources": {"cpu": "6", "mem": "1g"}}

    body = preview(**spec)

    assert body["verdict"] == "never"
    assert body["reason"] == _launch_refusal(as_alice, spec)[1]
    assert body["reason"] == "quota: total cpu would be 6 of 4 allowed (2 over)"


def test_a_cluster_over_the_containers_quota_can_never_fit(preview, alice):
    _policy(alice, max_containers_per_session=2)

    body = preview(cluster_mode="multi-node", cluster_size=3, resources={"cpu": 1, "mem": "1g"})

    assert body["verdict"] == "never"
    assert body["reason"].startswith("quota: at most 2 containers per session")


def test_a_session_whose_dependency_failed_can_never_start(preview, alice, image, agent):
    failed = _holding(alice, image, agent, status=Status.TERMINATED, name="prep")
    Session.objects.filter(pk=failed.pk).update(result="FAILED", exit_code=3)

    body = preview(type="batch", startup_command="run", depends_on=[str(failed.pk)])

    assert body["verdict"] == "never"
    assert body["reason"] == "dependency prep ended FAILED (exit code 3)"


# --- wait: time, dependencies, the queue --------------------------------------------------------


def test_a_session_waits_for_its_running_dependencies(preview, alice, image, agent):
    running = _holding(alice, image, agent, name="prep")

    body = preview(type="batch", startup_command="run", depends_on=[str(running.pk)])

    assert body["verdict"] == "wait"
    assert body["reason"] == "waiting for dependencies: prep"


def test_a_batch_session_with_a_later_start_time_waits_for_it(preview):
    later = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)

    body = preview(type="batch", startup_command="run", starts_at=later.isoformat())

    assert body["verdict"] == "wait"
    assert body["reason"] == f"starts at {later.isoformat()}"


def test_in_a_fifo_group_a_session_waits_behind_one_that_waits_for_resources(
    preview, bob, image, agent, group
):
    stuck = _holding(bob, image, agent, status=Status.PENDING)
    Session.objects.filter(pk=stuck.pk).update(scheduling_attempts=3)

    body = preview(resources={"cpu": "1", "mem": "1g"})

    assert body["verdict"] == "wait"
    assert body["reason"] == f"queued behind session {str(stuck.pk)[:8]} which waits for resources"
    assert body["resource_group"]["pending_sessions"] == 1


def test_in_a_lifo_group_a_session_that_fits_starts_now_whatever_waits(
    preview, bob, image, agent, group
):
    group.session_selection = SessionSelection.LIFO
    group.save()
    stuck = _holding(bob, image, agent, status=Status.PENDING)
    Session.objects.filter(pk=stuck.pk).update(scheduling_attempts=3)

    assert preview(resources={"cpu": "1", "mem": "1g"})["verdict"] == "start_now"


# --- the same input checks as a launch, and nothing written -----------------------------------


@pytest.mark.parametrize(
    ("spec", "status", "field"),
    [
        ({"image": "no/such:1"}, 400, "image"),
        ({"resources": {"cpu": "lots"}}, 400, "resources"),
        ({"resorces": {"cpu": 1}}, 400, "resorces"),
        ({"cluster_size": 0}, 400, "cluster_size"),
        ({"agents": ["agent-1"]}, 403, "agents"),
    ],
)
def test_a_bad_spec_is_refused_as_a_launch_refuses_it(as_alice, image, agent, spec, status, field):
    spec = {"image": image.reference, **spec}

    response = as_alice.post(URL, spec, format="json")
    launched = as_alice.post(LAUNCH, spec, format="json")

    assert response.status_code == launched.status_code == status, response.content
    assert response.json() == launched.json()
    assert field in response.json()["extra"]["fields"]


def test_a_name_already_in_use_is_refused_as_a_launch_refuses_it(as_alice, alice, image, agent):
    _holding(alice, image, agent, name="notebook")
    spec = {"image": image.reference, "name": "notebook"}

    response = as_alice.post(URL, spec, format="json")

    assert response.status_code == 409
    assert response.json() == as_alice.post(LAUNCH, spec, format="json").json()


def test_the_pending_limit_is_refused_as_a_launch_refuses_it(as_alice, alice, image, agent):
    _policy(alice, max_pending_sessions=1)
    _holding(alice, image, agent, status=Status.PENDING)
    spec = {"image": image.reference}

    response = as_alice.post(URL, spec, format="json")

    assert response.status_code == 403
    assert response.json() == as_alice.post(LAUNCH, spec, format="json").json()


@pytest.mark.parametrize(
    "spec",
    [
        {"resources": {"cpu": "1", "mem": "1g"}},  # start_now
        {"resources": {"cpu": "16"}},  # never
        {"cluster_mode": "multi-node", "cluster_size": 4, "resources": {"cpu": "4"}},  # wait
    ],
)
def test_a_preview_writes_nothing(as_alice, image, agent, spec):
    before = (Session.objects.count(), Kernel.objects.count(), SessionEvent.objects.count())

    with CaptureQueriesContext(connection) as queries:
        response = as_alice.post(URL, {"image": image.reference, **spec}, format="json")

    assert response.status_code == 200, response.content
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))
    ]
    assert writes == []
    assert (Session.objects.count(), Kernel.objects.count(), SessionEvent.objects.count()) == before


def test_the_preview_asks_for_a_login(api, image):
    assert api().post(URL, {"image": image.reference}, format="json").status_code in (401, 403)


def test_the_schema_documents_the_preview_and_the_presets(client):
    schema = client.get("/api/schema/?format=json").json()

    preview = schema["paths"]["/api/v1/sessions/preview/"]["post"]
    assert "200" in preview["responses"]
    body = schema["components"]["schemas"]["PreviewOutput"]["properties"]
    assert {"verdict", "reason", "reasons", "resources", "quota", "resource_group"} <= set(body)
    [ref] = body["verdict"]["allOf"]  # the choices are a component of their own
    verdict = schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    assert set(verdict["enum"]) == {"start_now", "wait", "never"}
    assert "get" in schema["paths"]["/api/v1/presets/"]
