"""Who may see and touch what, over every API endpoint.

Personas (tests/conftest.py):
- ``alice`` and ``bob``: plain users; each sees only their own sessions,
  kernels' logs, templates and folders. Another user's object is *not found*
  (404), never *forbidden*, so its existence does not leak.
- ``admin``: sees every session (``?all=1`` on the list), reads and ends any,
  reads the agents.
- nobody logged in: refused everywhere.
"""

from __future__ import annotations

import pytest

from sessions_app.models import (
    DataFolder,
    Kernel,
    Session,
    SessionTemplate,
    Status,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _session(owner, image, group, agent, name="s", kernels=2, status=Status.RUNNING) -> Session:
    session = Session.objects.create(
        owner=owner,
        name=name,
        image=image,
        resource_group=group,
        cluster_size=kernels,
        cluster_mode="multi-node",
        status=status,
    )
    placed = status != Status.PENDING
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
            agent=agent if placed else None,
            status=status,
            log_tail=f"secret output of {owner.username}",
        )
    return session


class World:
    """One of everything for alice and for bob."""

    def __init__(self, alice, bob, image, group, agent):
        self.sessions = {u.username: _session(u, image, group, agent) for u in (alice, bob)}
        self.templates = {
            u.username: SessionTemplate.objects.create(
                owner=u, name=f"{u.username}-tpl", spec={"image": image.reference}
            )
            for u in (alice, bob)
        }
        self.folders = {
            u.username: DataFolder.objects.create(owner=u, name=f"{u.username}-data")
            for u in (alice, bob)
        }

    def sub1(self, username: str) -> Kernel:
        return self.sessions[username].kernels.get(cluster_hostname="sub1")


@pytest.fixture
def world(alice, bob, image, group, agent):
    return World(alice, bob, image, group, agent)


# (method, url builder, body) for every endpoint that reaches one of bob's objects.
BOBS_OBJECTS = {
    "read session": ("get", lambda w: f"/api/v1/sessions/{w.sessions['bob'].pk}/", None),
    "terminate session": (
        "post",
        lambda w: f"/api/v1/sessions/{w.sessions['bob'].pk}/terminate/",
        {},
    ),
    "logs by hostname": (
        "get",
        lambda w: f"/api/v1/sessions/{w.sessions['bob'].pk}/kernels/main1/logs/",
        None,
    ),
    "logs by kernel id": (
        "get",
        lambda w: f"/api/v1/sessions/{w.sessions['bob'].pk}/kernels/{w.sub1('bob').pk}/logs/",
        None,
    ),
    "bob's kernel under alice's session": (
        "get",
        lambda w: f"/api/v1/sessions/{w.sessions['alice'].pk}/kernels/{w.sub1('bob').pk}/logs/",
        None,
    ),
    "read template": ("get", lambda w: f"/api/v1/templates/{w.templates['bob'].pk}/", None),
    "update template": (
        "put",
        lambda w: f"/api/v1/templates/{w.templates['bob'].pk}/",
        {"name": "stolen", "spec": {"image": "x"}},
    ),
    "delete template": ("delete", lambda w: f"/api/v1/templates/{w.templates['bob'].pk}/", None),
    "export template": (
        "get",
        lambda w: f"/api/v1/templates/{w.templates['bob'].pk}/export/",
        None,
    ),
    "delete folder": ("delete", lambda w: f"/api/v1/folders/{w.folders['bob'].pk}/", None),
}

LISTS = ["/api/v1/sessions/", "/api/v1/sessions/?all=1", "/api/v1/templates/", "/api/v1/folders/"]

EVERY_ENDPOINT = {
    **{f"list {url}": ("get", lambda w, url=url: url, None) for url in LISTS},
    **BOBS_OBJECTS,
    "create session": ("post", lambda w: "/api/v1/sessions/", {"image": "x"}),
    "create template": ("post", lambda w: "/api/v1/templates/", {"name": "t", "spec": {}}),
    "import template": ("post", lambda w: "/api/v1/templates/import/", {"document": "x"}),
    "create folder": ("post", lambda w: "/api/v1/folders/", {"name": "f"}),
    "images": ("get", lambda w: "/api/v1/images/", None),
    "resource groups": ("get", lambda w: "/api/v1/resource-groups/", None),
    "agents": ("get", lambda w: "/api/v1/agents/", None),
}


def _call(client, method, url, body):
    return (
        getattr(client, method)(url, body, format="json")
        if body is not None
        else getattr(client, method)(url)
    )


def _bobs_things_are_untouched(world):
    bobs = Session.objects.get(pk=world.sessions["bob"].pk)
    assert bobs.status == Status.RUNNING
    assert not bobs.events.exists()
    assert SessionTemplate.objects.get(pk=world.templates["bob"].pk).name == "bob-tpl"
    assert DataFolder.objects.filter(pk=world.folders["bob"].pk).exists()


@pytest.mark.parametrize("endpoint", list(BOBS_OBJECTS))
def test_a_user_cannot_reach_another_users_objects(api, alice, world, endpoint):
    method, url, body = BOBS_OBJECTS[endpoint]

    response = _call(api(alice), method, url(world), body)

    assert response.status_code == 404, response.content
    body = response.json()
    assert body["message"] and "secret" not in response.content.decode()
    _bobs_things_are_untouched(world)


@pytest.mark.parametrize("url", LISTS)
def test_a_users_lists_never_contain_another_users_objects(api, alice, world, url):
    response = api(alice).get(url)

    assert response.status_code == 200
    items = response.json()
    assert items, "alice's own objects are listed"
    text = response.content.decode()
    for ident in (
        str(world.sessions["bob"].pk),
        "bob-tpl",
        "bob-data",
        "secret output of bob",
    ):
        assert ident not in text
    owners = {item.get("owner") for item in items if "owner" in item}
    assert owners <= {"alice"}


def test_a_user_reaches_their_own_objects(api, alice, world):
    client = api(alice)
    session = world.sessions["alice"]
    assert client.get(f"/api/v1/sessions/{session.pk}/").status_code == 200
    logs = client.get(f"/api/v1/sessions/{session.pk}/kernels/sub1/logs/")
    assert logs.json()["log"] == "secret output of alice"
    by_id = client.get(f"/api/v1/sessions/{session.pk}/kernels/{world.sub1('alice').pk}/logs/")
    assert by_id.json()["kernel"] == "sub1"
    assert client.get(f"/api/v1/templates/{world.templates['alice'].pk}/export/").status_code == 200


def test_a_shared_template_is_readable_but_not_changeable_by_others(api, alice, bob, image):
    shared = SessionTemplate.objects.create(
        owner=bob, name="team", is_shared=True, spec={"image": image.reference}
    )
    client = api(alice)
    assert client.get(f"/api/v1/templates/{shared.pk}/").status_code == 200
    assert "team" in [t["name"] for t in client.get("/api/v1/templates/").json()]
    response = client.delete(f"/api/v1/templates/{shared.pk}/")
    assert response.status_code in (403, 400)
    assert response.json()["message"]
    assert SessionTemplate.objects.filter(pk=shared.pk).exists()


def test_a_plain_user_may_not_list_agents(api, alice, agent):
    response = api(alice).get("/api/v1/agents/")
    assert response.status_code == 403
    assert response.json()["message"]
    assert agent.id not in response.content.decode()


# --- admins -----------------------------------------------------------------------------------


def test_an_admin_lists_every_users_sessions_with_all(api, admin, world):
    client = api(admin)
    everyone = {s["id"] for s in client.get("/api/v1/sessions/?all=1").json()}
    assert everyone == {str(s.pk) for s in world.sessions.values()}
    assert client.get("/api/v1/sessions/").json() == []  # without it: their own, none


def test_all_means_nothing_for_a_plain_user(api, alice, world):
    ids = {s["id"] for s in api(alice).get("/api/v1/sessions/?all=true").json()}
    assert ids == {str(world.sessions["alice"].pk)}


def test_an_admin_reads_any_session_and_its_logs(api, admin, world):
    client = api(admin)
    bobs = world.sessions["bob"]
    assert client.get(f"/api/v1/sessions/{bobs.pk}/").json()["owner"] == "bob"
    logs = client.get(f"/api/v1/sessions/{bobs.pk}/kernels/main1/logs/")
    assert logs.json()["log"] == "secret output of bob"
    by_id = client.get(f"/api/v1/sessions/{bobs.pk}/kernels/{world.sub1('bob').pk}/logs/")
    assert by_id.json()["kernel"] == "sub1"


def test_an_admin_reading_a_session_does_not_count_as_its_owners_activity(api, admin, world):
    bobs = world.sessions["bob"]
    before = Session.objects.get(pk=bobs.pk).last_activity_at
    api(admin).get(f"/api/v1/sessions/{bobs.pk}/")
    assert Session.objects.get(pk=bobs.pk).last_activity_at == before


def test_reading_a_session_is_not_even_its_owners_activity(api, bob, world):
    """An open page (it reads the session, its runs, its logs) is not activity."""
    bobs = world.sessions["bob"]
    before = Session.objects.get(pk=bobs.pk).last_activity_at
    for path in ("", "runs/", "kernels/main1/logs/"):
        assert api(bob).get(f"/api/v1/sessions/{bobs.pk}/{path}").status_code == 200
    assert Session.objects.get(pk=bobs.pk).last_activity_at == before


def test_an_admin_ends_any_session_and_the_reason_names_them(api, admin, world):
    bobs = world.sessions["bob"]
    response = api(admin).post(f"/api/v1/sessions/{bobs.pk}/terminate/")
    assert response.status_code == 200, response.content
    bobs.refresh_from_db()
    assert bobs.status == Status.TERMINATING
    assert bobs.status_reason == "terminated by admin root"


def test_an_admin_reads_and_exports_any_template(api, admin, world):
    client = api(admin)
    bobs = world.templates["bob"]
    assert client.get(f"/api/v1/templates/{bobs.pk}/").json()["owner"] == "bob"
    assert client.get(f"/api/v1/templates/{bobs.pk}/export/").status_code == 200
    names = {t["name"] for t in client.get("/api/v1/templates/?all=1").json()}
    assert {"alice-tpl", "bob-tpl"} <= names


def test_an_admin_lists_the_agents(api, admin, agent):
    response = api(admin).get("/api/v1/agents/")
    assert response.status_code == 200
    assert [a["id"] for a in response.json()] == [agent.id]


# --- nobody logged in ------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", list(EVERY_ENDPOINT))
def test_nobody_logged_in_is_refused_everywhere(api, world, endpoint):
    method, url, body = EVERY_ENDPOINT[endpoint]

    response = _call(api(), method, url(world), body)

    assert response.status_code in (401, 403), response.content
    assert response.json()["message"]
    assert "secret" not in response.content.decode()
    _bobs_things_are_untouched(world)


# --- query counts ------------------------------------------------------------------------------------


def test_the_session_list_costs_the_same_queries_for_one_session_or_many(
    api, alice, image, group, agent, django_assert_max_num_queries
):
    client = api(alice)
    folder = DataFolder.objects.create(owner=alice, name="data")
    first = _session(alice, image, group, agent, name="s0", kernels=3)
    first.mounts.set([folder])
    with django_assert_max_num_queries(6) as one:
        assert len(client.get("/api/v1/sessions/").json()) == 1

    for i in range(1, 8):
        session = _session(alice, image, group, agent, name=f"s{i}", kernels=3)
        session.mounts.set([folder])
        session.depends_on.set([first])
    with django_assert_max_num_queries(len(one.captured_queries)):
        body = api(alice).get("/api/v1/sessions/").json()
    assert len(body) == 8
    assert all(len(s["kernels"]) == 3 for s in body)
    assert all(s["mounts"] == ["data"] for s in body)
    assert sum(s["depends_on"] == [str(first.pk)] for s in body) == 7
