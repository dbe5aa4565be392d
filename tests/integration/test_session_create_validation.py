"""POST /api/v1/sessions/: every refusal names the field and the reason in
words a user understands, and writes nothing; the happy path builds the
cluster that CONCEPTS.md describes.

Personas (tests/conftest.py): ``alice`` launches; ``bob`` owns the folders
and sessions alice must not reach.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest

from sessions_app.models import (
    DataFolder,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    Session,
    SessionEvent,
    Status,
    UserResourcePolicy,
)

URL = "/api/v1/sessions/"
GIB = 2**30

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


@pytest.fixture
def launch(as_alice, image, agent):
    """POST a launch spec as alice (the image and an 8-cpu, 16 GiB agent exist)."""

    def post(**spec):
        return as_alice.post(URL, spec, format="json")

    return post


def _counts() -> tuple[int, int, int]:
    return Session.objects.count(), Kernel.objects.count(), SessionEvent.objects.count()


@pytest.fixture
def nothing_created():
    """Check, after the test's request, that no row was written."""
    before = _counts()
    yield
    assert _counts() == before, "a refused launch wrote rows"


def assert_refused(response, status: int, field: str, *words: str) -> str:
    """The response is a refusal naming ``field``; its message holds ``words``.

    Returns the message for further checks.
    """
    assert response.status_code == status, response.content
    body = response.json()
    message = body["message"]
    assert isinstance(message, str) and message
    fields = body["extra"]["fields"]
    assert field in fields, f"{field!r} not in {fields}"
    detail = " ".join(fields[field])
    assert detail
    for word in words:
        assert word in detail, f"{word!r} not in the {field} detail {detail!r}"
    return message


def _policy(alice, **limits) -> ResourcePolicy:
    policy = ResourcePolicy.objects.create(name="tight", **limits)
    UserResourcePolicy.objects.create(user=alice, policy=policy)
    return policy


# --- the happy path -------------------------------------------------------------


def test_a_multi_node_cluster_of_three_creates_main1_sub1_and_sub2(launch, image):
    response = launch(
        name="train",
        image=image.reference,
        cluster_mode="multi-node",
        cluster_size=3,
        resources={"cpu": 2, "mem": "4g"},
    )

    assert response.status_code == 201, response.content
    body = response.json()
    session = Session.objects.get(pk=body["id"])
    assert (session.name, session.status, session.cluster_size) == ("train", Status.PENDING, 3)
    assert session.cluster_mode == "multi-node"
    kernels = list(session.kernels.order_by("local_rank"))
    assert [(k.cluster_hostname, k.cluster_role, k.cluster_idx, k.local_rank) for k in kernels] == [
        ("main1", "main", 1, 0),
        ("sub1", "sub", 1, 1),
        ("sub2", "sub", 2, 2),
    ]
    assert kernels[0].pk == session.pk  # main1's kernel id is the session id
    for kernel in kernels:  # the resources asked for are per container
        assert {k: Decimal(v) for k, v in kernel.requested_slots.items()} == {
            "cpu": Decimal(2),
            "mem": Decimal(4 * GIB),
        }
        assert kernel.status == Status.PENDING
        assert kernel.image == image.reference
    [event] = session.events.all()
    assert event.to_status == Status.PENDING and event.reason
    assert [k["cluster_hostname"] for k in body["kernels"]] == ["main1", "sub1", "sub2"]
    assert body["events"][0]["reason"] == event.reason


def test_a_launch_without_resources_gets_the_defaults_for_each_container(launch, image):
    response = launch(image=image.reference, cluster_size=2, cluster_mode="multi-node")
    assert response.status_code == 201, response.content
    assert Kernel.objects.count() == 2
    for kernel in Kernel.objects.all():
        assert Decimal(kernel.requested_slots["cpu"]) > 0
        assert Decimal(kernel.requested_slots["mem"]) > 0


# --- image, group, type ------------------------------------------------------------


def test_it_refuses_an_unknown_image(launch, nothing_created):
    message = assert_refused(launch(image="no/such:1"), 400, "image", "no/such:1")
    assert "unknown image" in message


def test_it_refuses_a_launch_without_an_image(launch, nothing_created):
    assert_refused(launch(name="x"), 400, "image", "required")


def test_it_refuses_an_unknown_resource_group(launch, image, nothing_created):
    assert_refused(
        launch(image=image.reference, resource_group="nowhere"),
        400,
        "resource_group",
        "unknown resource group",
        "nowhere",
    )


def test_it_refuses_an_image_not_allowed_in_the_group(launch, image, nothing_created):
    image.allowed_groups.set([ResourceGroup.objects.create(name="gpu")])
    assert_refused(
        launch(image=image.reference), 400, "image", image.reference, "not allowed", "default"
    )


def test_it_refuses_a_session_type_the_group_does_not_allow(launch, image, group, nothing_created):
    group.allowed_session_types = ["interactive"]
    group.save()
    assert_refused(
        launch(image=image.reference, type="batch", startup_command="true"),
        400,
        "type",
        "does not allow batch",
    )


def test_it_refuses_an_unknown_session_type(launch, image, nothing_created):
    assert_refused(launch(image=image.reference, type="cron"), 400, "type", "cron")


def test_it_refuses_a_group_the_users_policy_does_not_allow(launch, image, alice, nothing_created):
    policy = _policy(alice)
    policy.allowed_resource_groups.set([ResourceGroup.objects.create(name="other")])
    assert_refused(launch(image=image.reference), 400, "resource_group", "does not allow")


# --- cluster size ---------------------------------------------------------------------


def test_it_refuses_a_cluster_of_zero(launch, image, nothing_created):
    assert_refused(launch(image=image.reference, cluster_size=0), 400, "cluster_size", "at least 1")


@pytest.mark.parametrize("size", ["3", 2.5, True, [2]])
def test_it_refuses_a_cluster_size_that_is_not_a_whole_number(launch, image, size, nothing_created):
    response = launch(image=image.reference, cluster_size=size)
    assert_refused(response, 400, "cluster_size", "not a whole number")


def test_it_refuses_a_cluster_larger_than_the_quota(launch, image, alice, nothing_created):
    _policy(alice, max_containers_per_session=4)
    message = assert_refused(
        launch(image=image.reference, cluster_size=6, cluster_mode="multi-node"),
        403,
        "cluster_size",
        "at most 4 containers",
        "2 over",
    )
    assert "quota" in message


# --- resources -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"gpu": 1}, ["gpu", "unknown resource slot"]),
        ({"cpu": -1}, ["cpu", "negative"]),
        ({"cpu": "lots"}, ["cpu", "not a number"]),
        ({"cpu": "NaN"}, ["cpu", "not a finite number"]),
        ({"cpu": None}, ["cpu", "not a number"]),
        ({"mem": "a lot"}, ["mem", "not a size"]),
        ({"mem": -5}, ["mem", "negative"]),
        ({"cpu": 0}, ["cpu", "more than 0"]),
        ("4 cpus", ["must be an object"]),
        ([1, 2], ["must be an object"]),
    ],
    ids=[
        "unknown",
        "negative",
        "text",
        "nan",
        "null",
        "mem-text",
        "mem-negative",
        "zero",
        "str",
        "list",
    ],
)
def test_it_refuses_bad_resource_slots(launch, image, resources, words, nothing_created):
    assert_refused(launch(image=image.reference, resources=resources), 400, "resources", *words)


def test_it_refuses_less_than_the_image_needs(launch, image, nothing_created):
    image.min_slots = {"mem": str(2 * GIB)}
    image.save()
    assert_refused(
        launch(image=image.reference, resources={"mem": "1g"}), 400, "resources", "at least 2"
    )


def test_it_refuses_a_container_no_agent_in_the_group_could_ever_hold(
    launch, image, nothing_created
):
    assert_refused(
        launch(image=image.reference, resources={"cpu": 16, "mem": "4g"}),
        400,
        "resources",
        "no agent",
        "needs 16 cpu",
        "largest agent has 8 cpu",
    )


def test_it_refuses_a_slot_no_agent_has_at_all(launch, image, nothing_created):
    assert_refused(
        launch(image=image.reference, resources={"cuda.device": 1}),
        400,
        "resources",
        "needs 1 cuda.device",
        "has 0 cuda.device",
    )


def test_it_lets_a_launch_wait_when_the_group_has_no_agent_yet(as_alice, image):
    response = as_alice.post(
        URL, {"image": image.reference, "resources": {"cpu": 64}}, format="json"
    )
    assert response.status_code == 201, response.content


def test_it_refuses_a_single_node_cluster_larger_than_the_largest_agent(
    launch, image, make_agent, nothing_created
):
    make_agent("agent-2", cpu="8")
    message = assert_refused(
        launch(image=image.reference, cluster_size=3, resources={"cpu": 4}),
        400,
        "cluster_size",
        "single-node",
        "needs 12 cpu",
        "largest agent has 8 cpu",
    )
    assert "multi-node" in message  # it says what to do instead


def test_the_same_cluster_is_accepted_in_multi_node_mode(launch, image, make_agent):
    make_agent("agent-2", cpu="8")
    response = launch(
        image=image.reference, cluster_size=3, cluster_mode="multi-node", resources={"cpu": 4}
    )
    assert response.status_code == 201, response.content


def test_it_refuses_a_multi_node_cluster_the_whole_group_could_never_hold(
    launch, image, nothing_created
):
    # One 8-cpu agent: three kernels of 4 cpu each fit nowhere, whatever the mode.
    assert_refused(
        launch(
            image=image.reference, cluster_size=3, cluster_mode="multi-node", resources={"cpu": 4}
        ),
        400,
        "cluster_size",
        "12 cpu",
    )


# --- environment -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "PATH=x", "ÄÖ"])
def test_it_refuses_env_names_that_are_not_identifiers(launch, image, name, nothing_created):
    assert_refused(
        launch(image=image.reference, env={name: "v"}), 400, "env", "not a valid variable name"
    )


@pytest.mark.parametrize("name", ["BACKENDAI_SESSION_ID", "BACKENDAI_CLUSTER_HOST", "BACKENDAI_X"])
def test_it_refuses_env_names_the_system_sets(launch, image, name, nothing_created):
    assert_refused(
        launch(image=image.reference, env={name: "v"}), 400, "env", name, "set by the system"
    )


def test_it_refuses_env_values_that_are_not_strings(launch, image, nothing_created):
    assert_refused(launch(image=image.reference, env={"N": 3}), 400, "env", "must be a string")


# --- mounts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mount", "words"),
    [
        ("bobs-data", ["no data folder named 'bobs-data'"]),
        ("missing", ["no data folder named 'missing'"]),
        ("../etc", ["'../etc' is not a folder name"]),
        ("/etc/passwd", ["'/etc/passwd' is not a folder name"]),
        ("a/../../b", ["not a folder name"]),
        (7, ["not a folder name"]),
    ],
)
def test_it_mounts_nothing_but_the_users_own_folders(
    launch, image, alice, bob, mount, words, nothing_created
):
    DataFolder.objects.create(owner=bob, name="bobs-data")
    DataFolder.objects.create(owner=alice, name="mine")
    assert_refused(launch(image=image.reference, mounts=["mine", mount]), 400, "mounts", *words)


def test_it_mounts_the_users_own_folder(launch, image, alice):
    DataFolder.objects.create(owner=alice, name="mine")
    response = launch(image=image.reference, mounts=["mine"])
    assert response.status_code == 201, response.content
    assert response.json()["mounts"] == ["mine"]


# --- body size -----------------------------------------------------------------------------------


def test_it_refuses_a_body_over_the_size_limit(as_alice, image, agent, settings, nothing_created):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = json.dumps({"image": image.reference, "startup_command": "x" * 5000})
    response = as_alice.post(URL, body, content_type="application/json")
    assert response.status_code == 413
    data = response.json()
    assert "limit is 4096 bytes" in data["message"]
    assert data["extra"]["limit"] == 4096


def test_it_refuses_a_body_that_is_not_an_object(as_alice, nothing_created):
    response = as_alice.post(URL, "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert "JSON object" in response.json()["message"]


def test_it_refuses_an_unknown_field_naming_it(launch, image, nothing_created):
    assert_refused(launch(image=image.reference, imgae="typo"), 400, "imgae", "unknown field")


# --- quotas ------------------------------------------------------------------------------------------


def test_it_refuses_a_session_over_the_total_slot_quota(launch, image, alice, nothing_created):
    _policy(alice, total_resource_slots={"cpu": "4"})
    message = assert_refused(
        launch(
            image=image.reference, cluster_size=3, cluster_mode="multi-node", resources={"cpu": 2}
        ),
        403,
        "resources",
        "total cpu would be 6 of 4 allowed",
        "(2 over)",
    )
    assert message.startswith("quota")


def test_it_refuses_a_session_over_the_pending_sessions_quota(launch, image, alice):
    _policy(alice, max_pending_sessions=1)
    assert launch(image=image.reference, name="first").status_code == 201
    before = _counts()

    response = launch(image=image.reference, name="second")

    assert_refused(response, 403, "non_field_errors", "at most 1 pending", "1 over")
    assert _counts() == before


# --- batch, names, dependencies ------------------------------------------------------------------


def test_it_refuses_a_batch_session_without_a_start_command(launch, image, nothing_created):
    assert_refused(
        launch(image=image.reference, type="batch", startup_command="  "),
        400,
        "startup_command",
        "needs a start command",
    )


def test_it_refuses_a_second_active_session_with_the_same_name(launch, image):
    assert launch(image=image.reference, name="dup").status_code == 201
    before = _counts()

    response = launch(image=image.reference, name="dup")

    assert_refused(response, 409, "name", "already used")
    assert "'dup'" in response.json()["message"]
    assert _counts() == before


def test_a_name_is_free_again_once_its_session_ended(launch, image):
    first = Session.objects.get(pk=launch(image=image.reference, name="again").json()["id"])
    first.mark_cancelled("done")
    assert launch(image=image.reference, name="again").status_code == 201


@pytest.mark.parametrize("name", ["-x", "a b", "x" * 65, "../x", 12])
def test_it_refuses_a_bad_session_name(launch, image, name, nothing_created):
    assert_refused(launch(image=image.reference, name=name), 400, "name", "up to 64")


def test_it_refuses_a_dependency_on_an_unknown_session(launch, image, nothing_created):
    unknown = str(uuid.uuid4())
    assert_refused(launch(image=image.reference, depends_on=[unknown]), 400, "depends_on", unknown)


def test_it_refuses_a_dependency_that_is_not_an_id(launch, image, nothing_created):
    assert_refused(
        launch(image=image.reference, depends_on=["not-a-uuid"]), 400, "depends_on", "not-a-uuid"
    )


def test_it_refuses_a_dependency_on_another_users_session(launch, image, group, bob):
    bobs = Session.objects.create(owner=bob, name="b", image=image, resource_group=group)
    before = _counts()
    assert_refused(
        launch(image=image.reference, depends_on=[str(bobs.pk)]),
        400,
        "depends_on",
        "no session of yours",
        str(bobs.pk),
    )
    assert _counts() == before


def test_it_accepts_a_dependency_on_the_users_own_session(launch, image):
    first = launch(image=image.reference, name="first").json()["id"]
    response = launch(image=image.reference, name="second", depends_on=[first])
    assert response.status_code == 201, response.content
    assert response.json()["depends_on"] == [first]


# --- malformed shapes are refused, never a server error ---------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"roles": "sub"}, "roles"),
        ({"roles": {"sub": "x"}}, "roles.sub"),
        ({"roles": {"sub": {"replicas": "many"}}}, "roles.sub.replicas"),
        ({"roles": {"sub": {"resources": [1]}}}, "roles.sub.resources"),
        ({"roles": {"gpu": {}}}, "roles"),
        ({"starts_at": "2024-13-45T00:00:00"}, "starts_at"),
        ({"starts_at": "tomorrow"}, "starts_at"),
        ({"batch_timeout": 1e300}, "batch_timeout"),
        ({"batch_timeout": -1}, "batch_timeout"),
        ({"env": ["A=1"]}, "env"),
        ({"mounts": "mine"}, "mounts"),
        ({"depends_on": "x"}, "depends_on"),
        ({"cluster_mode": "ring"}, "cluster_mode"),
        ({"template": "nope"}, "template"),
    ],
)
def test_a_malformed_field_is_refused_naming_it(launch, image, spec, field, nothing_created):
    response = launch(image=image.reference, **spec)
    assert_refused(response, 400, field)


def test_an_image_that_was_deactivated_is_unknown(launch, nothing_created):
    Image.objects.create(reference="old/image:1", is_active=False)
    assert_refused(launch(image="old/image:1"), 400, "image", "unknown image")


# --- per-role images and resources ------------------------------------------------------------------


def test_sub_kernels_take_their_role_resources_over_the_common_ones(launch, image):
    response = launch(
        image=image.reference,
        cluster_mode="multi-node",
        resources={"cpu": 2, "mem": "2g"},
        roles={"sub": {"replicas": 2, "resources": {"cpu": 1}}},
    )
    assert response.status_code == 201, response.content
    slots = {k["cluster_hostname"]: k["requested_slots"] for k in response.json()["kernels"]}
    assert slots == {
        "main1": {"cpu": "2", "mem": str(2 * GIB)},
        "sub1": {"cpu": "1", "mem": str(2 * GIB)},
        "sub2": {"cpu": "1", "mem": str(2 * GIB)},
    }


def test_the_main_role_may_have_its_own_image_and_resources(launch, image):
    Image.objects.create(reference="bai-kernel/driver:1")
    response = launch(
        image=image.reference,
        cluster_size=2,
        cluster_mode="multi-node",
        resources={"cpu": 1},
        roles={"main": {"image": "bai-kernel/driver:1", "resources": {"cpu": 3}}},
    )
    assert response.status_code == 201, response.content
    kernels = {k["cluster_hostname"]: k for k in response.json()["kernels"]}
    assert (kernels["main1"]["image"], kernels["main1"]["requested_slots"]["cpu"]) == (
        "bai-kernel/driver:1",
        "3",
    )
    assert (kernels["sub1"]["image"], kernels["sub1"]["requested_slots"]["cpu"]) == (
        image.reference,
        "1",
    )


def test_it_refuses_a_role_image_not_allowed_in_the_group(launch, image, nothing_created):
    elsewhere = Image.objects.create(reference="bai-kernel/gpu:1")
    elsewhere.allowed_groups.set([ResourceGroup.objects.create(name="gpu")])
    assert_refused(
        launch(
            image=image.reference, cluster_size=2, roles={"sub": {"image": elsewhere.reference}}
        ),
        400,
        "roles.sub.image",
        "not allowed",
    )


def test_it_refuses_less_than_a_role_image_needs(launch, image, nothing_created):
    Image.objects.create(reference="bai-kernel/big:1", min_slots={"cpu": "4"})
    assert_refused(
        launch(
            image=image.reference,
            cluster_size=2,
            resources={"cpu": 1},
            roles={"sub": {"image": "bai-kernel/big:1"}},
        ),
        400,
        "roles.sub.image",
        "at least 4 cpu",
    )


def test_it_refuses_more_than_one_main_kernel(launch, image, nothing_created):
    assert_refused(
        launch(image=image.reference, roles={"main": {"replicas": 2}}),
        400,
        "roles.main.replicas",
        "exactly one main kernel",
    )


# --- issue 10: inputs that once stopped every pass of their group ------------------


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"starts_at": "9999-12-31T23:59:59-14:00"}, "starts_at", ["within 366 days of now"]),
        ({"starts_at": "0001-01-01T00:00:00+14:00"}, "starts_at", ["days of now"]),
        ({"resources": {"cpu": "0.0000000000000000001"}}, "resources", ["cpu"]),
        ({"batch_timeout": 8e13}, "batch_timeout", ["366 days"]),
    ],
    ids=["starts-after-year-9999", "starts-before-year-1", "cpu-1e-19", "batch-timeout-8e13"],
)
def test_an_input_that_once_stopped_every_pass_is_refused_and_writes_nothing(
    launch, image, spec, field, words
):
    before = _counts()
    batch = {"type": "batch", "startup_command": "true"}
    response = launch(image=image.reference, **batch, **spec)
    assert_refused(response, 400, field, *words)
    assert _counts() == before
