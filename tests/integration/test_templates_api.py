"""Session templates through the API: per-role specs become kernels, launch
overrides change only what they name, YAML/JSON export imports back
unchanged, and import errors name the field and the line.

Personas: ``alice`` saves and launches templates; ``admin`` shares one with
everybody; ``bob`` sees only the shared one.
"""

from __future__ import annotations

import json

import pytest
import yaml

from sessions_app.models import Image, Session, SessionTemplate

pytestmark = pytest.mark.django_db

GIB = 2**30
TEMPLATES = "/api/v1/templates/"
SESSIONS = "/api/v1/sessions/"

TRAINING = {
    "image": "bai-kernel/minimal:1",
    "type": "batch",
    "cluster_mode": "single-node",
    "resources": {"cpu": "1", "mem": "2g"},
    "env": {"MODE": "train", "SEED": "1"},
    "startup_command": "python train.py",
    "roles": {
        "main": {"image": "bai-kernel/python:3", "resources": {"cpu": "2", "mem": "4g"}},
        "sub": {"image": "bai-kernel/worker:1", "replicas": 2, "resources": {"mem": "1g"}},
    },
}


@pytest.fixture(autouse=True)
def _images(image):
    Image.objects.create(reference="bai-kernel/python:3")
    Image.objects.create(reference="bai-kernel/worker:1")


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


@pytest.fixture
def training(as_alice):
    response = as_alice.post(
        TEMPLATES, {"name": "training", "description": "nightly", "spec": TRAINING}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def launch(client, **spec):
    response = client.post(SESSIONS, spec, format="json")
    assert response.status_code == 201, response.content
    return Session.objects.get(pk=response.json()["id"])


def kernels(session):
    return {
        k.cluster_hostname: (k.image, k.requested_slots)
        for k in session.kernels.order_by("local_rank")
    }


# --- per-role specs and overrides ---------------------------------------------------------------


def test_a_template_with_per_role_images_and_resources_builds_those_kernels(
    as_alice, training, agent
):
    session = launch(as_alice, template=training, name="run-1")

    assert session.cluster_size == 3
    assert session.template_id == training
    main = ("bai-kernel/python:3", {"cpu": "2", "mem": str(4 * GIB)})
    sub = ("bai-kernel/worker:1", {"cpu": "1", "mem": str(GIB)})
    assert kernels(session) == {"main1": main, "sub1": sub, "sub2": sub}
    assert session.environ == {"MODE": "train", "SEED": "1"}
    assert session.startup_command == "python train.py"


def test_a_launch_overriding_only_memory_keeps_the_rest_of_the_template(as_alice, agent):
    spec = {**TRAINING, "roles": {}}
    pk = as_alice.post(TEMPLATES, {"name": "plain", "spec": spec}, format="json").json()["id"]

    session = launch(as_alice, template=pk, name="more-mem", resources={"mem": "3g"})

    assert session.requested_slots == {"cpu": "1", "mem": str(3 * GIB)}
    assert session.image.reference == "bai-kernel/minimal:1"
    assert session.session_type == "batch"
    assert session.environ == {"MODE": "train", "SEED": "1"}
    assert session.startup_command == "python train.py"


def test_overrides_merge_env_by_name_and_replace_role_fields(as_alice, training, agent):
    session = launch(
        as_alice,
        template=training,
        name="tuned",
        env={"SEED": "7", "EXTRA": "1"},
        roles={"sub": {"replicas": 1}, "main": {"resources": {"mem": "8g"}}},
    )
    assert session.environ == {"MODE": "train", "SEED": "7", "EXTRA": "1"}
    assert kernels(session) == {
        "main1": ("bai-kernel/python:3", {"cpu": "2", "mem": str(8 * GIB)}),
        "sub1": ("bai-kernel/worker:1", {"cpu": "1", "mem": str(GIB)}),
    }


def test_a_launch_list_replaces_the_templates_list(as_alice, alice, agent):
    for name in ("data", "models", "scratch"):
        assert as_alice.post("/api/v1/folders/", {"name": name}, format="json").status_code == 201
    spec = {"image": "bai-kernel/minimal:1", "mounts": ["data", "models"]}
    pk = as_alice.post(TEMPLATES, {"name": "m", "spec": spec}, format="json").json()["id"]

    kept = launch(as_alice, template=pk, name="kept")
    replaced = launch(as_alice, template=pk, name="replaced", mounts=["scratch"])

    assert sorted(kept.mounts.values_list("name", flat=True)) == ["data", "models"]
    assert list(replaced.mounts.values_list("name", flat=True)) == ["scratch"]


def test_a_shared_template_is_usable_by_everyone_but_changed_only_by_admins(api, admin, bob, agent):
    as_admin, as_bob = api(admin), api(bob)
    pk = as_admin.post(
        TEMPLATES,
        {"name": "starter", "spec": {"image": "bai-kernel/minimal:1"}, "is_shared": True},
        format="json",
    ).json()["id"]

    assert [t["name"] for t in as_bob.get(TEMPLATES).json()] == ["starter"]
    session = launch(as_bob, template=pk, name="bobs")
    assert session.owner == bob
    change = as_bob.put(
        f"{TEMPLATES}{pk}/", {"name": "mine", "spec": {"image": "x"}}, format="json"
    )
    assert change.status_code in (400, 403, 404)
    assert SessionTemplate.objects.get(pk=pk).name == "starter"


def test_a_role_templates_session_totals_what_its_kernels_hold_not_main1_times_the_size(
    as_alice, agent
):
    # main1 asks 512 MiB, each of the two subs 256 MiB: 1 GiB in all. Main1's
    # share times the cluster size (1.5 GiB) and the common resources times the
    # size (768 MiB) are both wrong.
    spec = {
        "image": "bai-kernel/minimal:1",
        "resources": {"cpu": "0.25", "mem": "256m"},
        "roles": {"main": {"resources": {"mem": "512m"}}, "sub": {"replicas": 2}},
    }
    pk = as_alice.post(TEMPLATES, {"name": "uneven", "spec": spec}, format="json").json()["id"]
    session = launch(as_alice, template=pk, name="uneven-1")

    detail = as_alice.get(f"{SESSIONS}{session.pk}/").json()
    assert [k["requested_slots"]["mem"] for k in detail["kernels"]] == [
        str(512 * 2**20),
        str(256 * 2**20),
        str(256 * 2**20),
    ]
    assert detail["resources"] == {"cpu": "0.25", "mem": str(512 * 2**20)}
    assert detail["total_resources"] == {"cpu": "0.75", "mem": str(GIB)}
    (listed,) = as_alice.get(SESSIONS).json()
    assert listed["total_resources"] == {"cpu": "0.75", "mem": str(GIB)}


# --- export and import ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_a_template_exported_imports_back_unchanged(as_alice, training, fmt):
    exported = as_alice.get(f"{TEMPLATES}{training}/export/?format={fmt}")
    assert exported.status_code == 200
    text = exported.content.decode()
    loaded = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    assert loaded == {"name": "training", "description": "nightly", "spec": TRAINING}

    SessionTemplate.objects.all().delete()
    imported = as_alice.post(
        f"{TEMPLATES}import/", {"format": fmt, "document": text}, format="json"
    )
    assert imported.status_code == 201, imported.content
    again = as_alice.get(f"{TEMPLATES}{imported.json()['id']}/export/?format={fmt}")
    assert again.content.decode() == text


def test_an_exported_yaml_reads_like_the_launch_dialog(as_alice, training):
    text = as_alice.get(f"{TEMPLATES}{training}/export/?format=yaml").content.decode()
    assert text.startswith("name: training\ndescription: nightly\nspec:\n  image: ")
    assert "  roles:\n    main:\n      image: bai-kernel/python:3\n" in text


def test_a_yaml_import_with_a_typo_in_a_field_name_is_refused_with_that_name_and_line(
    as_alice,
):
    document = (
        "name: training\n"
        "spec:\n"
        "  image: bai-kernel/minimal:1\n"
        "  roles:\n"
        "    sub:\n"
        "      replicas: 2\n"
        "      resoures:\n"
        "        mem: 1g\n"
    )
    response = as_alice.post(
        f"{TEMPLATES}import/", {"format": "yaml", "document": document}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["message"] == (
        "spec.roles.sub.resoures: line 7: unknown field 'resoures' (did you mean 'resources'?)"
    )
    assert list(body["extra"]["fields"]) == ["spec.roles.sub.resoures"]
    assert not SessionTemplate.objects.exists()


def test_a_json_import_error_names_the_line(as_alice):
    document = '{\n  "name": "t",\n  "spec": {\n    "image": "x",\n    "cluster_size": "3"\n  }\n}'
    response = as_alice.post(
        f"{TEMPLATES}import/", {"format": "json", "document": document}, format="json"
    )
    assert response.status_code == 400
    (message,) = response.json()["extra"]["fields"]["spec.cluster_size"]
    assert message.startswith("line 5: '3' is not a whole number")
