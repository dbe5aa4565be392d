"""Dependencies: a session waits until every dependency ended with SUCCESS;
when one can no longer succeed, its dependents are cancelled at once,
transitively, with reasons naming the chain. The scheduling pass's check is
the backstop. Refusals at creation name the field.

Personas: ``alice`` builds pipelines; ``bob`` owns sessions alice may not name.
"""

from __future__ import annotations

import uuid

import pytest
from session_steps import destroyed, exit_main, fail_main, launch, place, run

from sessions_app import services
from sessions_app.errors import InvalidInput
from sessions_app.models import Result, Session, SessionEvent, Status

pytestmark = pytest.mark.django_db

URL = "/api/v1/sessions/"


def job(owner, name, *after: Session) -> Session:
    return launch(
        owner,
        name=name,
        type="batch",
        startup_command=f"./{name}.sh",
        depends_on=[str(s.pk) for s in after],
    )


@pytest.fixture
def pipeline(alice, image, agent):
    """A → B → C: B waits for A, C waits for B."""
    a = job(alice, "A")
    b = job(alice, "B", a)
    c = job(alice, "C", b)
    return a, b, c


def fresh(*sessions: Session) -> list[Session]:
    for s in sessions:
        s.refresh_from_db()
    return list(sessions)


def test_a_pipeline_runs_in_order(pipeline):
    a, b, c = pipeline
    place(a)
    b, c = fresh(b, c)
    assert a.status == Status.SCHEDULED
    assert (b.status, c.status) == (Status.PENDING, Status.PENDING)
    assert b.status_reason == "waiting for dependencies: A"

    run(a)
    exit_main(a, 0)
    assert a.result == Result.SUCCESS
    place(b)
    assert b.status == Status.SCHEDULED
    assert fresh(c)[0].status == Status.PENDING

    run(b)
    exit_main(b, 0)
    place(c)
    assert c.status == Status.SCHEDULED


def test_when_the_first_step_fails_the_rest_is_cancelled_at_once_naming_it(pipeline):
    a, b, c = pipeline
    run(a)
    exit_main(a, 1)

    # No scheduling pass ran: the cancellation happened with A's end.
    b, c = fresh(b, c)
    assert (b.status, c.status) == (Status.CANCELLED, Status.CANCELLED)
    assert b.status_reason == "dependency A ended FAILED (exit code 1)"
    assert c.status_reason == "dependency B cancelled: dependency A ended FAILED (exit code 1)"
    for dependent in (b, c):
        assert not dependent.kernels.exclude(status=Status.CANCELLED).exists()
        assert dependent.events.filter(to_status=Status.CANCELLED, kernel=None).count() == 1


def test_a_failed_step_in_a_cluster_cancels_dependents_when_main1_exits(alice, image, agent):
    a = run(
        launch(
            alice,
            name="A",
            type="batch",
            startup_command="false",
            roles={"sub": {"replicas": 1}},
        )
    )
    b = job(alice, "B", a)
    exit_main(a, 2)
    assert a.status == Status.TERMINATING  # sub1 is still being destroyed
    assert fresh(b)[0].status_reason == "dependency A ended FAILED (exit code 2)"
    destroyed(a)
    assert a.status == Status.TERMINATED
    assert fresh(b)[0].events.filter(to_status=Status.CANCELLED, kernel=None).count() == 1


def test_cancelling_the_first_step_cancels_the_rest(pipeline):
    a, b, c = pipeline
    services.session_terminate(session=a, reason="terminated by its owner")
    b, c = fresh(b, c)
    assert b.status_reason == "dependency A cancelled: terminated by its owner"
    assert c.status_reason == (
        "dependency B cancelled: dependency A cancelled: terminated by its owner"
    )


def test_a_step_that_errors_cancels_the_rest(pipeline):
    a, b, c = pipeline
    run(a)
    fail_main(a, "the container vanished from agent agent-1")
    b, c = fresh(b, c)
    assert a.status == Status.ERROR
    assert b.status == Status.CANCELLED
    assert b.status_reason == (
        "dependency A ended ERROR without success: main1: the container vanished from agent agent-1"
    )
    assert c.status == Status.CANCELLED


def test_a_step_that_hit_its_batch_timeout_names_the_timeout(alice, image, agent):
    from datetime import timedelta

    from django.utils import timezone

    from scheduler_app import sweeps

    a = run(launch(alice, name="A", type="batch", startup_command="sleep 1d", batch_timeout=60))
    b = job(alice, "B", a)
    sweeps.sweep_timeouts(now=timezone.now() + timedelta(minutes=2))
    assert fresh(b)[0].status_reason == (
        "dependency A ended FAILED (batch timeout: ran longer than 1 min)"
    )


def test_an_interactive_dependency_ended_by_its_owner_is_not_a_success(alice, image, agent):
    a = run(launch(alice, name="prep"))
    b = job(alice, "B", a)
    services.session_terminate(session=a, reason="terminated by its owner")
    destroyed(a)
    b = fresh(b)[0]
    assert b.status == Status.CANCELLED
    assert b.status_reason == (
        "dependency prep ended TERMINATED without success: main1: terminated by its owner"
    )


def test_a_dependent_waits_for_all_of_its_dependencies(alice, image, agent):
    a, b = job(alice, "A"), job(alice, "B")
    c = job(alice, "C", a, b)
    run(a)
    exit_main(a, 0)
    place(c)
    assert c.status == Status.PENDING
    run(b)
    exit_main(b, 0)
    place(c)
    assert c.status == Status.SCHEDULED


def test_a_success_cancels_nothing(pipeline):
    a, b, c = pipeline
    run(a)
    exit_main(a, 0)
    assert services.session_cancel_dependents(session=a) == []
    assert {s.status for s in fresh(b, c)} == {Status.PENDING}


def test_cancelling_dependents_twice_changes_nothing(pipeline):
    a, b, c = pipeline
    run(a)
    exit_main(a, 1)
    events = SessionEvent.objects.count()
    assert services.session_cancel_dependents(session=a) == []
    assert SessionEvent.objects.count() == events


def test_the_scheduling_pass_is_the_backstop(pipeline):
    a, b, c = pipeline
    # A failure the cascade never saw (e.g. the process died right after commit).
    Session.objects.filter(pk=a.pk).update(
        status=Status.TERMINATED, result=Result.FAILED, exit_code=1
    )
    place(b)
    assert b.status == Status.CANCELLED
    assert b.status_reason == "dependency A ended FAILED (exit code 1)"
    place(c)
    assert c.status == Status.CANCELLED


# --- refusals at creation ----------------------------------------------------------------


def refused(owner, *dep_ids: object) -> str:
    with pytest.raises(InvalidInput) as error:
        launch(owner, name="late", depends_on=list(dep_ids))
    assert "depends_on" in error.value.fields
    return " ".join(error.value.fields["depends_on"])


def test_an_unknown_dependency_is_refused(alice, image, agent):
    unknown = uuid.uuid4()
    assert refused(alice, str(unknown)) == f"no session of yours with id {str(unknown)!r}"
    assert "not-a-uuid" in refused(alice, "not-a-uuid")
    assert not Session.objects.filter(name="late").exists()


def test_another_users_session_is_refused_as_unknown(alice, bob, image, agent):
    bobs = launch(bob, name="bobs")
    assert refused(alice, str(bobs.pk)) == f"no session of yours with id {str(bobs.pk)!r}"


def test_a_dependency_listed_twice_is_refused(alice, image, agent):
    a = launch(alice, name="A")
    assert "listed twice" in refused(alice, str(a.pk), str(a.pk))


def test_a_session_cannot_depend_on_itself_or_form_a_cycle(alice, image, agent):
    # Ids are assigned at creation and dependencies cannot be changed later, so
    # a session can only name sessions older than itself: no id it could give
    # for itself exists yet, and no cycle can form.
    own_id = uuid.uuid4()
    assert "no session of yours" in refused(alice, str(own_id))
    a = launch(alice, name="A")
    b = job(alice, "B", a)
    assert list(a.depends_on.all()) == []
    assert list(b.dependents.all()) == []


def test_the_api_refuses_a_bad_dependency_naming_the_field(api, alice, image, agent):
    response = api(alice).post(
        URL, {"image": "bai-kernel/minimal:1", "depends_on": [str(uuid.uuid4())]}, format="json"
    )
    assert response.status_code == 400
    assert "depends_on" in response.json()["extra"]["fields"]
    assert response.json()["message"].startswith("depends_on: no session of yours")


def test_the_detail_api_names_the_dependencies(pipeline, api, alice):
    a, b, _ = pipeline
    body = api(alice).get(f"{URL}{b.pk}/").json()
    assert body["depends_on"] == [str(a.pk)]
    assert body["dependencies"] == [
        {"id": str(a.pk), "name": "A", "status": a.status, "result": a.result}
    ]


def test_the_detail_lists_dependencies_oldest_first_in_a_bounded_number_of_queries(
    alice, image, agent, api, django_assert_max_num_queries
):
    # The detail reads kernels, mounts and dependencies prefetched (a query each),
    # never once per field: 12 queries before, whatever the number of kernels.
    first, second, third = (job(alice, name) for name in ("first", "second", "third"))
    d = launch(
        alice,
        name="d",
        type="batch",
        startup_command="./d.sh",
        cluster_size=3,
        depends_on=[str(s.pk) for s in (third, first, second)],
    )
    client = api(alice)
    with django_assert_max_num_queries(8):
        body = client.get(f"{URL}{d.pk}/").json()
    assert [dep["name"] for dep in body["dependencies"]] == ["first", "second", "third"]
    assert len(body["kernels"]) == 3
