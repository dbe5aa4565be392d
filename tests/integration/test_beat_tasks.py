"""Every task that Celery beat runs exists and runs (a renamed service must not
silently stop a sweep: beat would log an error every few seconds, and nothing
would ever be marked LOST or timed out)."""

from __future__ import annotations

import pytest
from django.conf import settings

from backendai_web.celery import app

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("entry", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_each_beat_entry_names_a_task_that_runs(entry, group):
    name = settings.CELERY_BEAT_SCHEDULE[entry]["task"]
    app.loader.import_default_modules()
    task = app.tasks[name]
    task.apply().get(propagate=True)
