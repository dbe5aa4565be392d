"""Fixtures for inference endpoints.

Personas (from tests/conftest.py): ``alice`` owns the endpoints; ``bob`` may not
see or touch them by any path (404); ``admin`` sees and manages every one.
"""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def folder(alice):
    from sessions_app import services

    return services.folder_create(owner=alice, name="iris-model")


@pytest.fixture
def endpoint_data(image, folder):
    return {
        "name": "iris",
        "image": image.reference,
        "model_folder": folder.name,
        "start_command": "python3 -m http.server 8000",
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 4,
    }


@pytest.fixture
def make_endpoint(alice, endpoint_data):
    from serving_app import services

    def make(owner=None, **changes):
        return services.endpoint_create(owner=owner or alice, data={**endpoint_data, **changes})

    return make


@pytest.fixture
def traffic():
    """``traffic(endpoint, rps=..., inflight=...)``: requests as the router records them, in
    the real ``serving_app.metrics`` (Redis): ``rps`` x 30 requests ended two seconds ago (the
    reconciler reads a 30-second window) and ``inflight`` requests still open on one route."""
    from serving_app import metrics

    opened: list[tuple[str, int, int]] = []

    def make(endpoint, *, rps: float = 0.0, inflight: int = 0) -> None:
        endpoint_id = str(endpoint.pk)
        route_id = endpoint.routes.order_by("id").values_list("pk", flat=True).first() or 0
        when = time.time() - 2
        for _ in range(round(rps * 30)):
            metrics.record(endpoint_id, route_id, 0.003, True, now=when)
        if inflight:
            metrics.inflight(endpoint_id, route_id, inflight)
            opened.append((endpoint_id, route_id, inflight))

    yield make
    for endpoint_id, route_id, count in opened:
        metrics.inflight(endpoint_id, route_id, -count)
