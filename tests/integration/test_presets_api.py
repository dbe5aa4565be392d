"""GET /api/v1/presets/: the named sizes admins define, for the launch dialog.

A preset restricted to a resource group is offered only to users who may use that group.
"""

from __future__ import annotations

import pytest

from sessions_app.models import ResourceGroup, ResourcePolicy, ResourcePreset, UserResourcePolicy

URL = "/api/v1/presets/"
GIB = 2**30

pytestmark = pytest.mark.django_db


@pytest.fixture
def presets(group):
    """The defaults, plus one preset for a GPU group."""
    gpu = ResourceGroup.objects.create(name="gpu")
    ResourcePreset.objects.all().delete()
    made = {
        "small": ResourcePreset.objects.create(
            name="small", resource_slots={"cpu": "1", "mem": str(2 * GIB)}, order=10
        ),
        "large": ResourcePreset.objects.create(
            name="large", resource_slots={"cpu": "4", "mem": str(8 * GIB)}, order=30
        ),
        "gpu-1": ResourcePreset.objects.create(
            name="gpu-1",
            description="One GPU",
            resource_slots={"cpu": "4", "mem": str(16 * GIB), "cuda.device": "1"},
            resource_group=gpu,
            order=20,
        ),
    }
    return made


def test_a_user_lists_the_presets_in_the_admins_order(api, alice, presets):
    response = api(alice).get(URL)

    assert response.status_code == 200
    body = response.json()
    assert [p["name"] for p in body] == ["small", "gpu-1", "large"]
    assert body[0] == {
        "id": presets["small"].pk,
        "name": "small",
        "description": "",
        "resources": {"cpu": "1", "mem": str(2 * GIB)},
        "resource_group": None,
        "text": "1 cpu, 2 GiB mem",
    }
    assert body[1]["resource_group"] == "gpu"
    assert body[1]["text"] == "4 cpu, 16 GiB mem, 1 cuda.device"


def test_presets_of_a_group_the_users_policy_does_not_allow_are_not_offered(
    api, alice, presets, group
):
    policy = ResourcePolicy.objects.create(name="cpu-only")
    policy.allowed_resource_groups.set([group])
    UserResourcePolicy.objects.create(user=alice, policy=policy)

    names = [p["name"] for p in api(alice).get(URL).json()]

    assert names == ["small", "large"]


def test_the_presets_of_one_group_are_those_for_every_group_and_its_own(api, alice, presets):
    assert [p["name"] for p in api(alice).get(URL, {"resource_group": "gpu"}).json()] == [
        "small",
        "gpu-1",
        "large",
    ]
    assert [p["name"] for p in api(alice).get(URL, {"resource_group": "default"}).json()] == [
        "small",
        "large",
    ]


def test_an_unknown_group_is_refused_naming_the_field(api, alice, presets):
    response = api(alice).get(URL, {"resource_group": "nope"})

    assert response.status_code == 400
    assert response.json()["extra"]["fields"] == {
        "resource_group": ["unknown resource group 'nope'"]
    }


def test_the_presets_ask_for_a_login(api, presets):
    assert api().get(URL).status_code in (401, 403)


def test_listing_presets_costs_a_few_queries_however_many_there_are(
    api, alice, presets, django_assert_max_num_queries
):
    gpu = ResourceGroup.objects.get(name="gpu")
    for i in range(20):
        ResourcePreset.objects.create(
            name=f"p{i}", resource_slots={"cpu": "1", "mem": str(GIB)}, resource_group=gpu
        )
    client = api(alice)

    with django_assert_max_num_queries(5):
        response = client.get(URL)

    assert len(response.json()) == 23
