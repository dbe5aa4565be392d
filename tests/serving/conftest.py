"""Fixtures for inference endpoints.

Personas (from tests/conftest.py): ``alice`` owns the endpoints; ``bob`` may not
see or touch them by any path (404); ``admin`` sees and manages every one.
"""

from __future__ import annotations

import sys
import types

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


class FakeMetrics(types.ModuleType):
    """Stands in for serving_app.metrics (the router helper's module) until it lands:
    the same four functions, fed by the test."""

    def __init__(self) -> None:
        super().__init__("serving_app.metrics")
        self.snapshots: dict[str, dict] = {}

    def snapshot(self, endpoint_id, window_s=30):
        return self.snapshots.get(
            str(endpoint_id), {"routes": {}, "rps": 0.0, "p95_ms": 0.0, "inflight": 0}
        )

    def series(self, endpoint_id, seconds=300):
        return [{"t": 0, "rps": 0.0, "p95_ms": 0.0}]

    def record(self, endpoint_id, route_id, latency_s, ok):
        pass

    def inflight(self, endpoint_id, route_id, delta):
        pass


@pytest.fixture
def fake_metrics(monkeypatch):
    """A fake serving_app.metrics when the real one has not landed; the real one's
    snapshot patched to the test's figures when it has."""
    import serving_app

    fake = FakeMetrics()
    try:
        import serving_app.metrics as real  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "serving_app.metrics", fake)
        monkeypatch.setattr(serving_app, "metrics", fake, raising=False)
    else:
        monkeypatch.setattr(real, "snapshot", fake.snapshot)
    return fake
