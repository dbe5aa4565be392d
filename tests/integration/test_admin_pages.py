"""Django admin: every page loads for an admin and is refused to anyone else;
the actions go through the same services as the API.

Personas (tests/conftest.py): ``admin`` may see every page; ``alice`` is a
plain user and is sent to the admin login.
"""

from __future__ import annotations

import re

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin as django_admin
from django.contrib.admin.utils import quote
from django.test import RequestFactory
from django.urls import reverse

from sessions_app.models import (
    Agent,
    DataFolder,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    Session,
    SessionEvent,
    SessionTemplate,
    Status,
    UserResourcePolicy,
    hash_token,
)
from sessions_app.tokens import token_create

pytestmark = pytest.mark.django_db

REGISTERED = sorted(django_admin.site._registry, key=lambda m: m._meta.label)


def _label(model) -> str:
    return model._meta.label


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _session(owner, image, group, agent=None, name="s", status=Status.RUNNING, kernels=2):
    session = Session.objects.create(
        owner=owner,
        name=name,
        image=image,
        resource_group=group,
        cluster_size=kernels,
        status=status,
    )
    for rank in range(kernels):
        Kernel.objects.create(
            id=session.pk if rank == 0 else None,
            session=session,
            cluster_role="main" if rank == 0 else "sub",
            cluster_idx=max(rank, 1),
            local_rank=rank,
            cluster_hostname="main1" if rank == 0 else f"sub{rank}",
            image=image.reference,
            requested_slots={"cpu": "1"},
            agent=agent,
            status=status,
        )
    return session


@pytest.fixture
def world(alice, admin, image, group, agent):
    """At least one row of every model the admin shows."""
    session = _session(alice, image, group, agent)
    session.mounts.set([DataFolder.objects.create(owner=alice, name="data")])
    SessionEvent.objects.create(session=session, to_status=Status.PENDING, reason="created")
    SessionTemplate.objects.create(owner=alice, name="tpl", spec={"image": image.reference})
    UserResourcePolicy.objects.create(
        user=alice, policy=ResourcePolicy.objects.create(name="small")
    )
    image.allowed_groups.set([group])
    token_create(user=alice)
    AccessAttempt.objects.create(
        username="alice", ip_address="10.0.0.9", failures_since_start=3, get_data="", post_data=""
    )
    AccessLog.objects.create(username="alice", ip_address="10.0.0.9")
    AccessFailureLog.objects.create(username="alice", ip_address="10.0.0.9")
    from django.contrib.auth.models import Group

    Group.objects.create(name="researchers")


def _url(model, page: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{page}", args=args)


def _instance(model):
    obj = model._default_manager.first()
    assert obj is not None, f"the world fixture has no {_label(model)}: add one"
    return obj


def _pages(model, request) -> list[str]:
    model_admin = django_admin.site._registry[model]
    pages = [_url(model, "changelist"), _url(model, "change", quote(_instance(model).pk))]
    if model_admin.has_add_permission(request):
        pages.append(_url(model, "add"))
    return pages


@pytest.fixture
def admin_request(admin):
    request = RequestFactory().get("/admin/")
    request.user = admin
    return request


def test_every_model_of_the_app_is_in_the_admin():
    from django.apps import apps

    app_models = set(apps.get_app_config("sessions_app").get_models())
    assert app_models <= set(django_admin.site._registry)


def test_the_admin_index_loads(client, admin):
    client.force_login(admin)
    assert client.get(reverse("admin:index")).status_code == 200


@pytest.mark.parametrize("model", REGISTERED, ids=_label)
def test_every_admin_page_loads_for_an_admin(client, admin, world, admin_request, model):
    client.force_login(admin)
    for url in _pages(model, admin_request):
        response = client.get(url)
        assert response.status_code == 200, f"{url}: {response.status_code}"


@pytest.mark.parametrize("model", REGISTERED, ids=_label)
def test_every_admin_page_sends_a_plain_user_to_the_admin_login(
    client, alice, world, admin_request, model
):
    client.force_login(alice)
    for url in _pages(model, admin_request):
        response = client.get(url)
        assert response.status_code == 302, f"{url}: {response.status_code}"
        assert response["Location"].startswith(reverse("admin:login")), url


def test_the_admin_pages_refuse_someone_not_logged_in(client, world):
    response = client.get(_url(Session, "changelist"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_sessions_kernels_and_events_cannot_be_added_by_hand(admin_request):
    for model in (Session, Kernel, SessionEvent):
        assert not django_admin.site._registry[model].has_add_permission(admin_request)
    assert not django_admin.site._registry[SessionEvent].has_change_permission(admin_request)


# --- actions ------------------------------------------------------------------------------------


def test_the_terminate_action_ends_sessions_through_the_service(
    client, admin, alice, image, group, agent
):
    running = _session(alice, image, group, agent, name="running")
    pending = _session(alice, image, group, None, name="pending", status=Status.PENDING)
    client.force_login(admin)

    response = client.post(
        _url(Session, "changelist"),
        {"action": "terminate_sessions", "_selected_action": [str(running.pk), str(pending.pk)]},
        follow=True,
    )

    assert response.status_code == 200
    running.refresh_from_db()
    assert running.status == Status.TERMINATING
    event = running.events.get(kernel__isnull=True)
    assert (event.from_status, event.to_status) == (Status.RUNNING, Status.TERMINATING)
    assert event.reason == "terminated by admin root"
    assert set(running.kernels.values_list("status", flat=True)) == {Status.TERMINATING}
    pending.refresh_from_db()
    assert pending.status == Status.CANCELLED
    assert pending.status_reason == "terminated by admin root"
    assert set(pending.kernels.values_list("status", flat=True)) == {Status.CANCELLED}
    assert "Terminating 2 session(s)" in response.content.decode()


def test_the_terminate_action_says_which_session_had_already_ended(
    client, admin, alice, image, group
):
    ended = _session(alice, image, group, None, name="ended", status=Status.CANCELLED)
    client.force_login(admin)

    response = client.post(
        _url(Session, "changelist"),
        {"action": "terminate_sessions", "_selected_action": [str(ended.pk)]},
        follow=True,
    )

    assert "already ended" in response.content.decode()
    assert not ended.events.exists()


# --- agent tokens --------------------------------------------------------------------------------


def test_creating_an_agent_shows_its_token_once_and_stores_only_a_hash(client, admin, group):
    client.force_login(admin)

    response = client.post(
        _url(Agent, "add"),
        {"id": "gpu-node-1", "resource_group": group.pk, "schedulable": "on", "labels": "{}"},
        follow=True,
    )

    assert response.status_code == 200
    page = response.content.decode()
    tokens = set(re.findall(r"BACKENDAI_AGENT_TOKEN=([A-Za-z0-9_\-]{20,})", page))
    assert len(tokens) == 1, page
    token = tokens.pop()
    agent = Agent.objects.get(pk="gpu-node-1")
    assert agent.token_hash == hash_token(token) != token
    assert Agent.objects.get(token_hash=hash_token(token)) == agent  # how an agent signs in
    stored = [str(v) for v in Agent.objects.filter(pk=agent.pk).values().get().values()]
    assert token not in stored
    assert token not in client.get(_url(Agent, "change", agent.pk)).content.decode()


def test_regenerating_a_token_invalidates_the_old_one(client, admin, agent):
    client.force_login(admin)
    old_hash = agent.token_hash

    response = client.post(
        _url(Agent, "changelist"),
        {"action": "regenerate_token", "_selected_action": [agent.pk]},
        follow=True,
    )

    [token] = set(
        re.findall(r"BACKENDAI_AGENT_TOKEN=([A-Za-z0-9_\-]{20,})", response.content.decode())
    )
    agent.refresh_from_db()
    assert agent.token_hash == hash_token(token) != old_hash
    assert not Agent.objects.filter(token_hash=hash_token(agent.plain_token)).exists()


# --- what an admin types is checked before it can break launches ------------------------------


def _policy_form(name: str, total_resource_slots: str) -> dict[str, str]:
    return {
        "name": name,
        "total_resource_slots": total_resource_slots,
        "max_containers_per_session": "8",
        "max_concurrent_sftp_sessions": "1",
        "assignments-TOTAL_FORMS": "0",
        "assignments-INITIAL_FORMS": "0",
    }


@pytest.mark.parametrize(
    ("slots", "words"),
    [
        ('{"cpu": "lots"}', "not a number"),
        ('{"gpus": 1}', "unknown resource slot"),
        ('{"cpu": -1}', "negative"),
        ('"4 cpu"', "must be an object"),
    ],
)
def test_a_policy_with_bad_slot_limits_is_refused(client, admin, slots, words):
    client.force_login(admin)

    response = client.post(_url(ResourcePolicy, "add"), _policy_form("bad", slots))

    assert response.status_code == 200  # the form again, with the error
    assert words in response.content.decode()
    assert not ResourcePolicy.objects.filter(name="bad").exists()


def test_a_policy_limit_in_units_is_stored_exactly(client, admin):
    client.force_login(admin)

    response = client.post(
        _url(ResourcePolicy, "add"), _policy_form("ok", '{"mem": "4g", "cpu": 0}')
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ResourcePolicy.objects.get(name="ok").total_resource_slots == {
        "mem": str(4 * 2**30),
        "cpu": "0",  # a zero limit stays a limit, it does not become "unlimited"
    }


def test_an_image_with_bad_minimum_slots_is_refused(client, admin):
    client.force_login(admin)

    response = client.post(
        _url(Image, "add"),
        {"reference": "x/y:1", "min_slots": '{"cpu": "two"}', "is_active": "on"},
    )

    assert response.status_code == 200
    assert "not a number" in response.content.decode()
    assert not Image.objects.filter(reference="x/y:1").exists()


@pytest.mark.parametrize("types", ['"interactive"', '["interactive", "cron"]', "[1]"])
def test_a_group_with_unknown_session_types_is_refused(client, admin, group, types):
    client.force_login(admin)
    form = {
        "name": "g2",
        "is_active": "on",
        "session_selection": "fifo",
        "num_retries_to_skip": "0",
        "agent_selection": "concentrated",
        "allowed_session_types": types,
    }

    response = client.post(_url(ResourceGroup, "add"), form)

    assert response.status_code == 200
    assert "A list of session types" in response.content.decode()
    assert not ResourceGroup.objects.filter(name="g2").exists()


def test_the_editable_cells_of_the_group_list_name_their_field_and_row(client, admin, group):
    client.force_login(admin)
    page = client.get(reverse("admin:sessions_app_resourcegroup_changelist")).content.decode()
    assert 'aria-label="Session selection of default"' in page
    assert 'aria-label="Agent selection of default"' in page
