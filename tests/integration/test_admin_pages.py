"""Django admin: every page loads for an admin and is refused to anyone else;
the actions go through the same services as the API.

Personas (tests/conftest.py): ``admin`` may see every page; ``alice`` is a
plain user and is sent to the admin login.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib import admin as django_admin
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.test import RequestFactory
from django.urls import reverse

from sessions_app.models import (
    Agent,
    DataFolder,
    ExecutionRun,
    FolderShare,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    ResourcePreset,
    Session,
    SessionEvent,
    SessionTemplate,
    SSHKey,
    Status,
    UserResourcePolicy,
    hash_token,
)
from sessions_app.tokens import token_create

pytestmark = pytest.mark.django_db
User = get_user_model()

REGISTERED = sorted(django_admin.site._registry, key=lambda m: m._meta.label)
SLOT_TYPES = settings.BAI_SLOT_TYPES  # cpu, mem, cuda.device, cuda.shares


def _input_value(page: str, name: str) -> str:
    """The value of the input named ``name`` in a rendered form."""
    tag = re.search(rf'<input[^>]*name="{re.escape(name)}"[^>]*>', page)
    assert tag, f"no input {name}"
    value = re.search(r'value="([^"]*)"', tag.group(0))
    return value.group(1) if value else ""


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
def world(alice, bob, admin, image, group, agent):
    """At least one row of every model the admin shows."""
    session = _session(alice, image, group, agent)
    folder = DataFolder.objects.create(owner=alice, name="data")
    session.mounts.set([folder])
    FolderShare.objects.create(folder=folder, user=bob, permission="ro")
    SSHKey.objects.create(
        owner=alice, name="laptop", public_key="ssh-ed25519 AAAA", fingerprint="SHA256:x"
    )
    SessionEvent.objects.create(session=session, to_status=Status.PENDING, reason="created")
    ExecutionRun.objects.create(session=session, user=alice, mode="query", run_id="r1")
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
    _serving_world(alice, image, group, session)


def _serving_world(owner, image, group, session):
    """An endpoint with a route, a token, a rule and an event (serving_app)."""
    from serving_app.models import AutoScalingRule, Endpoint, EndpointEvent, EndpointToken, Route

    endpoint = Endpoint.objects.create(owner=owner, name="iris", image=image, resource_group=group)
    Route.objects.create(endpoint=endpoint, session=session)
    EndpointToken.objects.create(
        endpoint=endpoint, prefix="abcd1234", digest="0" * 64, created_by=owner
    )
    AutoScalingRule.objects.create(
        endpoint=endpoint, metric="inflight", comparator="gt", threshold=5, step=1
    )
    EndpointEvent.objects.create(endpoint=endpoint, kind="created", message="created")


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

    for app in ("sessions_app", "serving_app"):
        app_models = set(apps.get_app_config(app).get_models())
        assert app_models <= set(django_admin.site._registry), app


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


def _slot_inputs(field: str, **typed: str) -> dict[str, str]:
    """The per-slot inputs of a slots field, as a browser posts them (empty ones too)."""
    return {f"{field}_{slot}": typed.get(slot.replace(".", "_"), "") for slot in SLOT_TYPES}


def _policy_form(name: str, **fields: str) -> dict[str, str]:
    slots = {k: v for k, v in fields.items() if k in ("cpu", "mem", "cuda_device", "cuda_shares")}
    return {
        "name": name,
        **_slot_inputs("total_resource_slots", **slots),
        "max_containers_per_session": "8",
        "max_concurrent_sftp_sessions": "1",
        "assignments-TOTAL_FORMS": "0",
        "assignments-INITIAL_FORMS": "0",
        **{k: v for k, v in fields.items() if k not in slots},
    }


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        ({"cpu": "lots"}, "CPU: &#x27;lots&#x27; is not a number"),
        ({"cpu": "-1"}, "CPU: must not be negative"),
        ({"cpu": "0.0001"}, "CPU: at most 3 decimal places"),
        ({"mem": "2x"}, "Memory: &#x27;2x&#x27; is not a size"),
        ({"cpu": "2000000000000000"}, "CPU: at most 1,000,000,000,000,000"),
    ],
)
def test_a_policy_with_bad_slot_limits_is_refused_naming_the_slot(client, admin, typed, words):
    client.force_login(admin)

    response = client.post(_url(ResourcePolicy, "add"), _policy_form("bad", **typed))

    assert response.status_code == 200  # the form again, with the error
    assert words in response.content.decode()
    assert not ResourcePolicy.objects.filter(name="bad").exists()


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ({"mem": "4"}, {"mem": str(4 * 2**30)}),  # a bare number is GiB, as the unit says
        ({"mem": "512m"}, {"mem": str(512 * 2**20)}),
        ({"mem": "1.5 GiB"}, {"mem": str(3 * 2**29)}),
        ({"mem": "2g", "cpu": "0"}, {"mem": str(2 * 2**30), "cpu": "0"}),  # 0 stays a limit
        ({"cpu": "2.50", "cuda_device": "1"}, {"cpu": "2.5", "cuda.device": "1"}),
        ({}, {}),  # every input empty: unlimited
    ],
)
def test_a_policy_limit_typed_in_units_is_stored_exactly(client, admin, typed, stored):
    client.force_login(admin)

    response = client.post(_url(ResourcePolicy, "add"), _policy_form("ok", **typed))

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ResourcePolicy.objects.get(name="ok").total_resource_slots == stored


def test_a_policy_page_shows_each_limit_in_its_unit_and_says_what_it_accepts(client, admin):
    policy = ResourcePolicy.objects.create(
        name="teams",
        total_resource_slots={"cpu": "16", "mem": str(3 * 2**29)},
        idle_timeout=timedelta(minutes=90),
    )
    client.force_login(admin)

    page = client.get(_url(ResourcePolicy, "change", policy.pk)).content.decode()

    assert _input_value(page, "total_resource_slots_cpu") == "16"  # cpu, in cores
    assert _input_value(page, "total_resource_slots_mem") == "1.5 GiB"
    assert _input_value(page, "total_resource_slots_cuda.device") == ""  # no GPU limit: unlimited
    assert _input_value(page, "idle_timeout") == "1 h 30 min"
    assert _input_value(page, "max_session_lifetime") == ""
    assert "512m, 2g, 1.5 GiB" in page
    assert "Type 30m, 8h, 1d or 1h30m" in page
    assert "/static/css/admin.css" in page


def test_the_policy_list_shows_limits_and_durations_in_units(client, admin):
    ResourcePolicy.objects.create(
        name="teams",
        total_resource_slots={"cpu": "16", "mem": str(32 * 2**30)},
        idle_timeout=timedelta(hours=8),
    )
    client.force_login(admin)

    page = client.get(_url(ResourcePolicy, "changelist")).content.decode()

    assert "16 cpu, 32 GiB mem" in page
    assert "8 h" in page
    assert "unlimited" in page  # the lifetime, and the default policy's slots


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("30m", timedelta(minutes=30)),
        ("8h", timedelta(hours=8)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(minutes=90)),
        ("1 h 30 min", timedelta(minutes=90)),  # what the page shows reads back the same
        ("90", timedelta(seconds=90)),
        ("0:30:00", timedelta(minutes=30)),  # Django's own form, as before
        ("", None),
    ],
)
def test_a_duration_is_typed_with_units(client, admin, typed, stored):
    client.force_login(admin)

    response = client.post(
        _url(ResourcePolicy, "add"),
        _policy_form("timed", idle_timeout=typed, max_session_lifetime=typed),
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    policy = ResourcePolicy.objects.get(name="timed")
    assert (policy.idle_timeout, policy.max_session_lifetime) == (stored, stored)


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        ("soon", "is not a duration"),
        ("30m1h", "is not a duration"),
        ("0.5s", "at least 1 s"),
        ("99999 days, 0:00:00", "at most 3650 d"),
        ("-1 00:00:00", "at least 1 s"),
    ],
)
def test_a_bad_duration_is_refused_with_the_accepted_forms(client, admin, typed, words):
    client.force_login(admin)

    response = client.post(_url(ResourcePolicy, "add"), _policy_form("t", idle_timeout=typed))

    assert response.status_code == 200
    assert words in response.content.decode()
    assert not ResourcePolicy.objects.filter(name="t").exists()


def test_a_group_pending_timeout_is_typed_with_units(client, admin, group):
    client.force_login(admin)
    form = {
        "name": group.name,
        "is_active": "on",
        "session_selection": "fifo",
        "num_retries_to_skip": "0",
        "agent_selection": "concentrated",
        "allowed_session_types": ["interactive"],
        "pending_timeout": "5m",
    }

    response = client.post(_url(ResourceGroup, "change", group.pk), form)

    assert response.status_code == 302, response.content.decode()[-2000:]
    group.refresh_from_db()
    assert group.pending_timeout == timedelta(minutes=5)
    page = client.get(_url(ResourceGroup, "change", group.pk)).content.decode()
    assert _input_value(page, "pending_timeout") == "5 min"


def test_an_image_with_bad_minimum_slots_is_refused(client, admin):
    client.force_login(admin)

    response = client.post(
        _url(Image, "add"),
        {"reference": "x/y:1", **_slot_inputs("min_slots", cpu="two"), "is_active": "on"},
    )

    assert response.status_code == 200
    assert "not a number" in response.content.decode()
    assert not Image.objects.filter(reference="x/y:1").exists()


def test_an_image_minimum_in_units_is_stored_as_today(client, admin):
    client.force_login(admin)

    response = client.post(
        _url(Image, "add"),
        {
            "reference": "x/y:2",
            **_slot_inputs("min_slots", cpu="0.5", mem="256m"),
            "is_active": "on",
        },
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Image.objects.get(reference="x/y:2").min_slots == {
        "cpu": "0.5",
        "mem": str(256 * 2**20),
    }


@pytest.mark.parametrize("types", [["interactive", "cron"], ["1"], ['["interactive"]']])
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
    assert "is not one of the available choices" in response.content.decode()
    assert not ResourceGroup.objects.filter(name="g2").exists()


# --- who has which resource policy --------------------------------------------------------------


def _policy_page_form(policy, rows) -> dict[str, str]:
    """The resource policy's change form with its users inline, as the page posts it."""
    form = _policy_form(policy.name)
    form.update(
        {"assignments-TOTAL_FORMS": str(len(rows)), "assignments-INITIAL_FORMS": str(len(rows))}
    )
    for i, row in enumerate(rows):
        form.update({f"assignments-{i}-{key}": value for key, value in row.items()})
    return form


def test_deleting_a_user_row_inline_removes_the_assignment(client, admin, alice):
    policy = ResourcePolicy.objects.create(name="small")
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    client.force_login(admin)

    response = client.post(
        _url(ResourcePolicy, "change", policy.pk),
        _policy_page_form(
            policy, [{"user": str(alice.pk), "policy": str(policy.pk), "DELETE": "on"}]
        ),
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert not UserResourcePolicy.objects.exists()
    history = LogEntry.objects.get(object_id=str(policy.pk))
    assert "alice → small" in history.get_change_message()


def test_the_user_of_an_existing_row_cannot_be_changed_silently(client, admin, alice, bob):
    policy = ResourcePolicy.objects.create(name="small")
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    client.force_login(admin)

    page = client.get(_url(ResourcePolicy, "change", policy.pk)).content.decode()
    response = client.post(
        _url(ResourcePolicy, "change", policy.pk),
        _policy_page_form(policy, [{"user": str(bob.pk), "policy": str(policy.pk)}]),
    )

    assert re.search(r'<select[^>]*name="assignments-0-user"[^>]*disabled', page)
    assert response.status_code == 302
    # The disabled input keeps what it showed: alice keeps the policy, bob gets none.
    assert list(UserResourcePolicy.objects.values_list("user__username", "policy__name")) == [
        ("alice", "small")
    ]


def test_a_user_row_is_added_inline_on_the_policy_page(client, admin, alice):
    policy = ResourcePolicy.objects.create(name="small")
    client.force_login(admin)
    form = _policy_page_form(policy, [{"user": str(alice.pk), "policy": str(policy.pk)}])
    form["assignments-INITIAL_FORMS"] = "0"

    response = client.post(_url(ResourcePolicy, "change", policy.pk), form)

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert UserResourcePolicy.objects.get(user=alice).policy == policy


def test_the_user_of_an_assignment_is_read_only_on_its_own_page(client, admin, alice, bob):
    policy = ResourcePolicy.objects.create(name="small")
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    client.force_login(admin)

    page = client.get(_url(UserResourcePolicy, "change", alice.pk)).content.decode()
    client.post(
        _url(UserResourcePolicy, "change", alice.pk), {"user": str(bob.pk), "policy": policy.pk}
    )

    assert "delete this row and add one" in page
    assert list(UserResourcePolicy.objects.values_list("user__username", flat=True)) == ["alice"]


def _user_form(user, **policy_row: str) -> dict[str, str]:
    """The user's change page as it posts, with the resource policy inline."""
    initial = "1" if UserResourcePolicy.objects.filter(user=user).exists() else "0"
    form = {
        "username": user.username,
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "resource_policy-TOTAL_FORMS": "1",
        "resource_policy-INITIAL_FORMS": initial,
        "resource_policy-MIN_NUM_FORMS": "0",
        "resource_policy-MAX_NUM_FORMS": "1",
    }
    form.update({f"resource_policy-0-{key}": value for key, value in policy_row.items()})
    if initial == "1":
        form["resource_policy-0-user"] = str(user.pk)
    return form


def test_a_users_resource_policy_is_set_on_the_users_page(client, admin, alice, group):
    policy = ResourcePolicy.objects.create(name="gpu-team")
    client.force_login(admin)

    page = client.get(_url(User, "change", alice.pk)).content.decode()
    response = client.post(_url(User, "change", alice.pk), _user_form(alice, policy=str(policy.pk)))

    assert "Without one, the default policy (default) applies" in page
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert UserResourcePolicy.objects.get(user=alice).policy == policy


def test_deleting_a_users_policy_on_the_users_page_falls_back_to_the_default(
    client, admin, alice, group
):
    policy = ResourcePolicy.objects.create(name="gpu-team")
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    client.force_login(admin)

    response = client.post(
        _url(User, "change", alice.pk), _user_form(alice, policy=str(policy.pk), DELETE="on")
    )

    assert response.status_code == 302, response.content.decode()[-3000:]
    assert not UserResourcePolicy.objects.filter(user=alice).exists()


# --- agents: used of capacity as bars -----------------------------------------------------------


def test_the_agents_list_shows_used_and_capacity_as_bars(client, admin, make_agent):
    make_agent(
        "gpu-node",
        cpu="8",
        mem=16 * 2**30,
        slots={"cuda.device": "2"},
        occupied_slots={"cpu": "2", "mem": str(4 * 2**30), "cuda.device": "1"},
    )
    make_agent("cpu-node", cpu="4", mem=8 * 2**30)
    client.force_login(admin)

    page = client.get(_url(Agent, "changelist")).content.decode()

    meters = re.findall(r"<meter[^>]*>", page)
    assert len(meters) == 5  # cpu, mem of cpu-node (listed first); cpu, mem, gpu of gpu-node
    assert 'max="4" value="0"' in meters[0]
    assert 'max="8" value="2"' in meters[2]
    assert f'max="{16 * 2**30}" value="{4 * 2**30}"' in meters[3]
    assert 'max="2" value="1"' in meters[4]
    assert "2 / 8 cores" in page and "4 / 16 GiB" in page and ">1 / 2<" in page
    assert "0 / 4 cores" in page
    assert "style=" not in "".join(re.findall(r'<div class="bai-usage">.*?</div>', page, re.S))
    assert "/static/css/admin.css" in page


def test_an_agents_page_shows_its_capacity_in_units_and_never_as_an_input(client, admin, agent):
    client.force_login(admin)

    page = client.get(_url(Agent, "change", agent.pk)).content.decode()

    assert "8 cpu, 16 GiB mem" in page
    assert 'name="capacity_slots"' not in page


# --- the audit history is never deleted ---------------------------------------------------------


def test_sessions_kernels_and_events_cannot_be_deleted_even_by_a_superuser(
    client, admin, alice, image, group, agent
):
    session = _session(alice, image, group, agent)
    event = SessionEvent.objects.create(session=session, to_status=Status.PENDING, reason="created")
    client.force_login(admin)

    for model, pk in [(Session, session.pk), (Kernel, session.pk), (SessionEvent, event.pk)]:
        assert client.get(_url(model, "delete", pk)).status_code == 403, model
        assert client.post(_url(model, "delete", pk), {"post": "yes"}).status_code == 403, model

    assert Session.objects.filter(pk=session.pk).exists()
    assert session.kernels.count() == 2 and session.events.count() == 1


def test_the_session_list_offers_no_delete_action(client, admin, alice, image, group, agent):
    session = _session(alice, image, group, agent)
    client.force_login(admin)

    page = client.get(_url(Session, "changelist")).content.decode()
    response = client.post(
        _url(Session, "changelist"),
        {"action": "delete_selected", "_selected_action": [str(session.pk)], "post": "yes"},
    )

    assert 'value="delete_selected"' not in page
    assert "never deleted here" in page
    assert response.status_code == 302  # "no action selected": nothing happens
    assert Session.objects.filter(pk=session.pk).exists()


def test_a_sessions_page_says_why_it_cannot_be_deleted(client, admin, alice, image, group, agent):
    session = _session(alice, image, group, agent)
    Session.objects.filter(pk=session.pk).update(
        requested_slots={"cpu": "1", "mem": str(2 * 2**30)}
    )
    client.force_login(admin)

    page = client.get(_url(Session, "change", session.pk)).content.decode()

    assert "never deleted here" in page and "audit history" in page
    assert _url(Session, "delete", session.pk) not in page
    assert "1 cpu, 2 GiB mem" in page  # its resources, in units


# --- resource presets ---------------------------------------------------------------------------


def test_a_fresh_install_has_three_presets(db):
    assert [
        (p.name, p.resource_slots)
        for p in ResourcePreset.objects.filter(name__in=["small", "medium", "large"])
    ] == [
        ("small", {"cpu": "1", "mem": str(2 * 2**30)}),
        ("medium", {"cpu": "2", "mem": str(4 * 2**30)}),
        ("large", {"cpu": "4", "mem": str(8 * 2**30)}),
    ]


def test_a_preset_is_made_in_units_for_one_group(client, admin, group):
    client.force_login(admin)

    response = client.post(
        _url(ResourcePreset, "add"),
        {
            "name": "gpu-small",
            **_slot_inputs("resource_slots", cpu="2", mem="8", cuda_device="1"),
            "resource_group": str(group.pk),
            "order": "5",
        },
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    preset = ResourcePreset.objects.get(name="gpu-small")
    assert preset.resource_slots == {"cpu": "2", "mem": str(8 * 2**30), "cuda.device": "1"}
    assert preset.resource_group == group
    assert (
        "2 cpu, 8 GiB mem, 1 cuda.device"
        in client.get(_url(ResourcePreset, "changelist")).content.decode()
    )


def test_a_preset_without_cpu_or_memory_is_refused(client, admin):
    client.force_login(admin)

    response = client.post(
        _url(ResourcePreset, "add"),
        {"name": "empty", **_slot_inputs("resource_slots", cpu="0"), "order": "0"},
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert "CPU: must be more than 0" in page and "Memory: required" in page
    assert not ResourcePreset.objects.filter(name="empty").exists()


def test_the_editable_cells_of_the_group_list_name_their_field_and_row(client, admin, group):
    client.force_login(admin)
    page = client.get(reverse("admin:sessions_app_resourcegroup_changelist")).content.decode()
    assert 'aria-label="Session selection of default"' in page
    assert 'aria-label="Agent selection of default"' in page
