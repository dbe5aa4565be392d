"""Serving against the owner's quota. Replicas are sessions of the endpoint's owner and count
against the policy's session limits like any other (a replica the pending limit holds back
waits, it is no failed start); the policy's ``max_endpoints`` caps the endpoints a user owns.
Both hold under concurrent creates (threads on the real database: PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from serving_app import reconcile
from serving_app.models import Endpoint, Route
from sessions_app.models import ResourcePolicy, Session, Status


def _policy(**limits) -> None:
    ResourcePolicy.objects.filter(is_default=True).update(**limits)


def _pending(user) -> int:
    return Session.objects.filter(owner=user, status=Status.PENDING).count()


def _together(count, work):
    """``work(i)`` in ``count`` threads released at once; their results in order."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def _client(user) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


@pytest.mark.django_db
def test_replicas_held_back_by_the_pending_limit_wait_and_say_so(alice, make_endpoint):
    _policy(max_pending_sessions=2)
    endpoint = make_endpoint(replicas=4, max_replicas=4)
    for _ in range(3):
        reconcile.reconcile_endpoint(endpoint.pk)
    endpoint.refresh_from_db()
    assert _pending(alice) == 2
    assert list(endpoint.routes.values_list("status", flat=True)) == ["PROVISIONING"] * 2
    assert endpoint.start_failures == 0
    assert endpoint.status == "PROVISIONING"
    assert "more replicas wait for the owner's quota" in endpoint.status_reason
    assert "at most 2 pending sessions" in endpoint.status_reason
    # One replica leaves PENDING: the next pass starts one more, and no more.
    first = Route.objects.filter(endpoint=endpoint).order_by("id").first()
    Session.objects.filter(pk=first.session_id).update(status=Status.RUNNING)
    reconcile.reconcile_endpoint(endpoint.pk)
    assert _pending(alice) == 2
    assert endpoint.routes.count() == 3


@pytest.mark.django_db(transaction=True)
def test_parallel_reconciles_of_several_endpoints_keep_to_the_pending_limit(
    alice, make_endpoint, monkeypatch
):
    from serving_app import health

    monkeypatch.setattr(health, "check_all", lambda probes: {})
    _policy(max_pending_sessions=3)
    endpoints = [
        make_endpoint(name=f"ep-{i}", replicas=0, min_replicas=0, max_replicas=4) for i in range(4)
    ]
    Endpoint.objects.update(replicas=3, status="PROVISIONING")
    _together(4, lambda i: reconcile.reconcile_endpoint(endpoints[i].pk))
    assert _pending(alice) == 3
    assert not Route.objects.filter(status="FAILED_TO_START").exists()


@pytest.mark.django_db(transaction=True)
def test_parallel_launches_keep_to_the_pending_limit(alice, image):
    _policy(max_pending_sessions=3)
    answers = _together(
        8,
        lambda i: (
            _client(alice)
            .post("/api/v1/sessions/", {"image": image.reference, "name": f"s{i}"}, format="json")
            .status_code
        ),
    )
    assert sorted(answers) == [201] * 3 + [403] * 5
    assert _pending(alice) == 3


@pytest.mark.django_db(transaction=True)
def test_parallel_endpoint_creates_keep_to_max_endpoints(alice, bob, endpoint_data):
    _policy(max_endpoints=2)
    data = {k: v for k, v in endpoint_data.items() if k != "model_folder"}
    data["replicas"] = 0
    data["min_replicas"] = 0

    def create(i):
        response = _client(alice).post(
            "/api/v1/endpoints/", {**data, "name": f"ep-{i}"}, format="json"
        )
        return response.status_code, response.json()

    answers = _together(8, create)
    assert sorted(code for code, _ in answers) == [201] * 2 + [403] * 6
    refusal = next(body for code, body in answers if code == 403)
    assert refusal["message"] == (
        "You have 2 endpoints, the most your policy allows (2): delete one first."
    )
    assert refusal["extra"] == {"endpoint_count": 2, "max_endpoints": 2}
    assert Endpoint.objects.filter(owner=alice).count() == 2
    # The quota as each user sees it: their own count; the limits replicas count against.
    assert _client(alice).get("/api/v1/endpoints/quota/").json() == {
        "endpoint_count": 2,
        "max_endpoints": 2,
        "max_concurrent_sessions": 10,
        "max_pending_sessions": 20,
    }
    assert _client(bob).get("/api/v1/endpoints/quota/").json()["endpoint_count"] == 0
    assert (
        _client(bob).post("/api/v1/endpoints/", {**data, "name": "bobs"}, format="json").status_code
        == 201
    )


@pytest.mark.django_db
def test_admins_set_max_endpoints_on_a_policy(admin, client):
    policy = ResourcePolicy.objects.get(is_default=True)
    client.force_login(admin)
    page = client.get(f"/admin/sessions_app/resourcepolicy/{policy.pk}/change/")
    assert page.status_code == 200
    assert b'name="max_endpoints"' in page.content
    listing = client.get("/admin/sessions_app/resourcepolicy/")
    assert b"column-max_endpoints" in listing.content
