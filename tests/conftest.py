"""Shared fixtures: personas, a resource group with an agent, images.

Personas:
- ``alice`` and ``bob``: plain users; each may see and touch only their own
  sessions, folders and templates.
- ``admin``: staff and superuser; sees everything, may attach to any session.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings

IN_CI = os.environ.get("CI") == "true"


def pytest_configure(config: pytest.Config) -> None:
    # The test process opens a connection per thread and closes it after each
    # use, without the pool (threads of concurrency tests would queue for it),
    # so that the test database can be dropped at the end. The servers that
    # tests start use the pool, as in production.
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    settings.DATABASES["default"]["OPTIONS"].pop("pool", None)
    engine = settings.DATABASES["default"]["ENGINE"]
    if IN_CI and "postgresql" not in engine:
        raise pytest.UsageError(
            "CI=true: tests must run on PostgreSQL (set DATABASE_URL or use scripts/test)"
        )


def skip_or_fail(reason: str) -> None:
    """Outside CI a missing part skips (saying why); under CI=true it fails."""
    if IN_CI:
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True, scope="session")
def _fast_passwords():
    """Hashing at full strength costs ~0.3 s per user; tests need no strength."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield


@pytest.fixture(autouse=True, scope="session")
def _celery_eager():
    """Tasks run inline in tests (after commit), unless a test starts a real worker."""
    from backendai_web.celery import app

    settings.CELERY_TASK_ALWAYS_EAGER = True
    app.conf.task_always_eager = True
    yield


@pytest.fixture(autouse=True)
def _own_cache(settings):
    """A cache key prefix of this test's own: login-failure counters (the
    token endpoint's throttle) of other tests and runs on this Redis stay out.
    The login pages' lockouts (django-axes) live in the database, which each
    test gets clean."""
    import uuid

    default = {**settings.CACHES["default"], "KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}"}
    settings.CACHES = {**settings.CACHES, "default": default}


@pytest.fixture(autouse=True)
def _storage_root(tmp_path, settings):
    settings.BAI_STORAGE_ROOT = (tmp_path / "storage").resolve()
    settings.BAI_STORAGE_ROOT.mkdir()


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="bob-pass-123")


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.org", "root-pass-123")


@pytest.fixture
def group(db):
    """The ``default`` group and policy (a data migration makes them; tests
    with transaction=True flush tables, so they are re-made when missing)."""
    from sessions_app.models import ResourceGroup, ResourcePolicy

    ResourcePolicy.objects.get_or_create(
        is_default=True,
        defaults={"name": "default", "max_concurrent_sessions": 10, "max_pending_sessions": 20},
    )
    return ResourceGroup.objects.get_or_create(name="default")[0]


@pytest.fixture
def image(group):
    from sessions_app.models import Image

    return Image.objects.create(reference="bai-kernel/minimal:1", display_name="Minimal")


@pytest.fixture
def make_agent(group):
    from sessions_app.models import Agent, AgentStatus

    def make(agent_id: str = "agent-1", cpu: str = "8", mem: int = 16 * 2**30, **extra):
        agent = Agent(
            id=agent_id,
            resource_group=extra.pop("resource_group", group),
            status=AgentStatus.ALIVE,
            capacity_slots={"cpu": cpu, "mem": str(mem), **extra.pop("slots", {})},
            **extra,
        )
        token = agent.set_new_token()
        agent.save()
        agent.plain_token = token
        return agent

    return make


@pytest.fixture
def agent(make_agent):
    return make_agent()


@pytest.fixture
def make_token():
    """``make_token(user)`` → the plain text of a new API token of that user."""
    from sessions_app.tokens import token_create

    def make(user) -> str:
        return token_create(user=user)[1]

    return make


@pytest.fixture
def api(client):
    """A DRF client factory: ``api(user)`` is logged in as that user."""
    from rest_framework.test import APIClient

    def make(user=None):
        c = APIClient()
        if user is not None:
            c.force_authenticate(user)
        return c

    return make


@pytest.fixture
def channel_prefix(settings) -> str:
    """A channel-layer prefix of this test's own (for its processes too), so
    other test runs on the same Redis stay out."""
    import uuid

    prefix = f"t{uuid.uuid4().hex[:10]}"
    default = dict(settings.CHANNEL_LAYERS["default"])
    default["CONFIG"] = {**default["CONFIG"], "prefix": prefix}
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS, "default": default}
    return prefix


@pytest.fixture
def live_system(transactional_db, tmp_path, group, channel_prefix):
    """daphne on the test database (see tests/live.py); agents via ``start_agent``."""
    from django.db import connection

    from tests.live import LiveSystem

    if connection.vendor != "postgresql":
        skip_or_fail("a live server shares the test database: run on PostgreSQL (DATABASE_URL)")
    system = LiveSystem(tmp_path).start()
    yield system
    system.stop()
