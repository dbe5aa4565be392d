"""The Templates pages as the server renders them: who sees which template,
who may change it, and what a row says of a template with role overrides.

Personas: ``alice`` owns her templates; ``bob`` owns one she must never see;
``admin`` shared one with everybody, which alice may launch and copy but not
change.
"""

from __future__ import annotations

import pytest

from sessions_app.models import SessionTemplate

pytestmark = pytest.mark.django_db

UNEVEN = {
    "image": "bai-kernel/minimal:1",
    "cluster_mode": "multi-node",
    "resources": {"cpu": "0.25", "mem": "256m"},
    "roles": {
        "main": {"image": "bai-kernel/python:2", "resources": {"mem": "512m"}},
        "sub": {"replicas": 2},
    },
}


@pytest.fixture
def world(alice, bob, admin):
    return {
        "alices": SessionTemplate.objects.create(owner=alice, name="alices", spec=UNEVEN),
        "bobs": SessionTemplate.objects.create(owner=bob, name="bobs", spec={}),
        "shared": SessionTemplate.objects.create(
            owner=admin, name="shared", is_shared=True, spec={"image": "x", "cluster_size": 1}
        ),
    }


def rows(response) -> dict[str, dict]:
    return {row["name"]: row for row in response.context["rows"]}


def test_the_list_shows_ones_own_and_the_shared_templates_only(client, alice, world):
    client.force_login(alice)
    response = client.get("/templates/")
    assert response.status_code == 200
    assert sorted(rows(response)) == ["alices", "shared"]
    assert "bobs" not in response.content.decode()


def test_a_row_gives_each_role_its_image_and_resources_as_the_launch_makes_them(
    client, alice, world
):
    client.force_login(alice)
    row = rows(client.get("/templates/"))["alices"]
    assert row["cluster_size"] == 3
    assert row["cluster_mode"] == "multi-node"
    assert row["role_images"] == [("main1", "bai-kernel/python:2")]
    assert row["resources"] == [
        ("main1", "0.25 CPU · 512 MiB"),
        ("sub1–sub2", "0.25 CPU · 256 MiB"),
    ]
    assert row["can_change"] and row["mine"] and not row["shared"]


def test_a_template_alike_on_every_kernel_shows_one_line_of_resources(client, alice):
    SessionTemplate.objects.create(
        owner=alice, name="even", spec={"cluster_size": 4, "resources": {"cpu": 2, "mem": "4g"}}
    )
    client.force_login(alice)
    assert rows(client.get("/templates/"))["even"]["resources"] == [("", "2 CPU · 4 GiB")]


def test_a_shared_template_is_offered_to_a_user_as_a_copy_not_for_change(client, alice, world):
    client.force_login(alice)
    row = rows(client.get("/templates/"))["shared"]
    assert row["shared"] and not row["can_change"] and row["owner"] == "root"

    shared = world["shared"]
    edit = client.get(f"/templates/{shared.pk}/edit/")
    assert edit.status_code == 302
    assert edit["Location"] == f"/templates/new/?from={shared.pk}"
    copy = client.get(edit["Location"]).context["data"]
    assert copy["template"]["name"] == "shared-copy"
    assert copy["template"]["spec"] == shared.spec
    assert "id" not in copy["template"]


def test_another_users_template_is_not_found_on_any_page(client, alice, world):
    client.force_login(alice)
    bobs = world["bobs"].pk
    assert client.get(f"/templates/{bobs}/edit/").status_code == 404
    assert client.get(f"/templates/new/?from={bobs}").status_code == 404


def test_the_edit_form_gets_the_template_and_the_catalogue_as_json(client, alice, world, image):
    client.force_login(alice)
    response = client.get(f"/templates/{world['alices'].pk}/edit/")
    assert response.status_code == 200
    data = response.context["data"]
    assert data["template"]["spec"] == UNEVEN
    assert data["images"] == [
        {"reference": "bai-kernel/minimal:1", "name": "Minimal", "ssh": False}
    ]
    assert data["canShare"] is False
    assert 'id="form-data"' in response.content.decode()


def test_an_admin_may_change_any_template_and_share_it(client, admin, world):
    client.force_login(admin)
    response = client.get(f"/templates/{world['shared'].pk}/edit/")
    assert response.status_code == 200
    assert response.context["data"]["canShare"] is True


def test_the_launch_link_of_a_template_opens_the_dialog_with_it(client, alice, world):
    client.force_login(alice)
    pk = world["alices"].pk
    page = client.get(f"/sessions/new/?template={pk}").context["page"]
    assert page["openLaunch"] is True and page["template"] == pk
    assert client.get("/sessions/new/?template=x").context["page"]["template"] is None
    assert client.get(f"/?template={pk}").context["page"]["template"] is None


def test_the_list_names_the_template_just_saved(client, alice, world):
    client.force_login(alice)
    response = client.get(f"/templates/?saved={world['alices'].pk}")
    assert response.context["done"]["name"] == "alices"
    assert "Saved template “alices”." in response.content.decode()
    # Another user's id names nothing.
    assert client.get(f"/templates/?saved={world['bobs'].pk}").context["done"] is None


def test_the_templates_page_is_in_the_navigation(client, alice):
    client.force_login(alice)
    assert 'href="/templates/"' in client.get("/").content.decode()


def test_the_list_page_costs_the_same_queries_for_one_template_or_many(
    client, alice, admin, django_assert_max_num_queries
):
    SessionTemplate.objects.create(owner=alice, name="t0", spec=UNEVEN)
    client.force_login(alice)
    with django_assert_max_num_queries(20) as one:
        client.get("/templates/")
    for i in range(1, 8):
        SessionTemplate.objects.create(owner=alice if i % 2 else admin, name=f"t{i}", spec=UNEVEN)
    SessionTemplate.objects.filter(owner=admin).update(is_shared=True)
    with django_assert_max_num_queries(len(one.captured_queries)):
        response = client.get("/templates/")
    assert len(response.context["rows"]) == 8
