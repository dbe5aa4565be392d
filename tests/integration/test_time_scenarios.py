"""The issue's "done" scenarios, end to end with an injected clock and the
beat tasks run the way Celery beat runs them.

Personas: ``admin`` edits the default resource policy in Django admin;
``alice`` works in one session and forgets another; her pipeline's first step
fails.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from session_steps import exit_main, launch, run

from scheduler_app import tasks
from sessions_app import services
from sessions_app.models import ResourcePolicy, Status

pytestmark = pytest.mark.django_db

T0 = datetime(2030, 3, 4, 14, 0, tzinfo=UTC)


def _form_data(page) -> dict:
    """What the browser would post back unchanged from an admin change page."""
    forms = [page.context["adminform"].form]
    for inline in page.context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.forms]
    data = {}
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if value is None or value is False:
                continue
            data[form.add_prefix(name)] = "on" if value is True else value
    return data


def test_an_admin_sets_a_2_minute_idle_timeout_and_only_the_untouched_session_ends(
    client, admin, alice, api, image, agent, group
):
    policy = ResourcePolicy.objects.get(is_default=True)
    client.force_login(admin)
    url = f"/admin/sessions_app/resourcepolicy/{policy.pk}/change/"
    data = _form_data(client.get(url))
    data["idle_timeout"] = "00:02:00"
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    policy.refresh_from_db()
    assert policy.idle_timeout == timedelta(minutes=2)

    with time_machine.travel(T0, tick=False) as clock:
        forgotten = run(launch(alice, name="forgotten"))
        in_use = run(launch(alice, name="in-use"))
        # Beat sweeps every 10 s; the terminal consumer touches in-use every 30 s.
        for second in range(0, 181, 10):
            clock.move_to(T0 + timedelta(seconds=second))
            if second % 30 == 0:
                services.session_touch(session_id=in_use.pk)
            tasks.sweep_timeouts()

    client = api(alice)
    gone = client.get(f"/api/v1/sessions/{forgotten.pk}/").json()
    assert gone["status"] == Status.TERMINATING
    assert gone["status_reason"] == "idle timeout: no activity for 2 min"
    assert gone["events"][-1]["reason"] == "idle timeout: no activity for 2 min"
    assert gone["events"][-1]["time"] == "2030-03-04T14:02:00Z"
    kept = client.get(f"/api/v1/sessions/{in_use.pk}/").json()
    assert kept["status"] == Status.RUNNING
    assert kept["seconds_left"] is not None and kept["seconds_left"] > 0


def test_a_three_step_pipeline_stops_with_clear_reasons_when_its_first_step_fails(
    api, alice, image, agent
):
    client = api(alice)

    def step(name, *after):
        response = client.post(
            "/api/v1/sessions/",
            {
                "name": name,
                "image": image.reference,
                "type": "batch",
                "startup_command": f"./{name}.sh",
                "depends_on": [s["id"] for s in after],
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        return response.json()

    prepare = step("prepare")
    train = step("train", prepare)
    evaluate = step("evaluate", train)

    first = run(services.Session.objects.get(pk=prepare["id"]))
    exit_main(first, 1)

    def shown(session):
        body = client.get(f"/api/v1/sessions/{session['id']}/").json()
        return body["status"], body["status_reason"]

    assert shown(prepare) == (Status.TERMINATED, "main1: exited with code 1")
    assert shown(train) == (Status.CANCELLED, "dependency prepare ended FAILED (exit code 1)")
    assert shown(evaluate) == (
        Status.CANCELLED,
        "dependency train cancelled: dependency prepare ended FAILED (exit code 1)",
    )
