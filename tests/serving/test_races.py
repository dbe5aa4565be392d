"""Requests on an endpoint that is being deleted at the same moment: a clear 404 (the
endpoint was deleted), never a 500. Threads on the real database (PostgreSQL in CI)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from serving_app import selectors, services
from serving_app.models import Endpoint

pytestmark = pytest.mark.django_db(transaction=True)

RULE = {"metric": "rps_per_replica", "comparator": "gt", "threshold": 5, "step": 1}


def _client(user) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("patch", "", {"replicas": 3}),
        ("post", "scale/", {"replicas": 3}),
        ("post", "rules/", RULE),
        ("delete", "", None),
    ],
)
def test_a_change_that_finds_the_endpoint_just_deleted_is_a_404(
    alice, make_endpoint, monkeypatch, method, suffix, body
):
    """The request read the endpoint; a delete commits before it takes the row's lock."""
    endpoint = make_endpoint()
    found = selectors.get_endpoint_for_user

    def found_then_deleted(**kwargs):
        stale = found(**kwargs)
        if Endpoint.objects.filter(pk=stale.pk).exists():
            services.endpoint_delete(endpoint=stale, user=alice)
        return stale

    monkeypatch.setattr(selectors, "get_endpoint_for_user", found_then_deleted)
    response = getattr(_client(alice), method)(
        f"/api/v1/endpoints/{endpoint.pk}/{suffix}", body, format="json"
    )
    assert response.status_code == 404, response.content
    assert response.json()["message"] == "The endpoint was deleted."
    assert not Endpoint.objects.exists()


def test_concurrent_patch_and_delete_answer_404_or_success_never_500(alice, make_endpoint):
    answers: list[tuple[str, int]] = []

    def call(barrier, method, path, body):
        try:
            client = _client(alice)
            barrier.wait()
            response = getattr(client, method)(path, body, format="json")
            answers.append((method, response.status_code))
        finally:
            connections.close_all()

    for n in range(12):
        endpoint = make_endpoint(name=f"race-{n}")
        path = f"/api/v1/endpoints/{endpoint.pk}/"
        barrier = threading.Barrier(3)
        threads = [
            threading.Thread(target=call, args=(barrier, "patch", path, {"replicas": 3})),
            threading.Thread(target=call, args=(barrier, "patch", path, {"max_replicas": 5})),
            threading.Thread(target=call, args=(barrier, "delete", path, None)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len(answers) == 36
    assert {code for method, code in answers if method == "patch"} <= {200, 404}
    assert {code for method, code in answers if method == "delete"} == {204}
    assert not Endpoint.objects.exists()
