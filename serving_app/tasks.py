"""Celery tasks of the reconciler: take ids, call one function, safe to run twice."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="serving_app.tasks.reconcile_endpoint", ignore_result=True)
def reconcile_endpoint(endpoint_id: str) -> None:
    from . import reconcile

    reconcile.reconcile_endpoint(endpoint_id)


@shared_task(name="serving_app.tasks.reconcile_endpoints", ignore_result=True)
def reconcile_endpoints() -> None:
    """Beat, every few seconds: one pass per endpoint (each its own task, so that
    workers share them; a pass already running for an endpoint is skipped)."""
    from . import reconcile

    for endpoint_id in reconcile.endpoint_ids():
        reconcile_endpoint.delay(endpoint_id)
