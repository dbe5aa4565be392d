"""``ssh sub1`` needs an SSH server in the sub kernels' image and a client in main1's
(``Image.supports_ssh``). A template or a launch whose cluster lacks one is valid,
but says so: ``warnings`` in the template API and in the launch preview.

Personas: ``alice``. Images: ``bai-kernel/minimal:1`` (no SSH) and ``ssh:1`` (SSH).
"""

from __future__ import annotations

import pytest

from sessions_app.models import Image

pytestmark = pytest.mark.django_db
TEMPLATES = "/api/v1/templates/"
PREVIEW = "/api/v1/sessions/preview/"
NO_SERVER = (
    "`ssh sub1` will not work: the sub kernels' image bai-kernel/minimal:1 has no SSH server; "
    "choose an image with SSH for them if main1 must reach them"
)
NO_CLIENT = (
    "`ssh sub1` will not work: main1's image bai-kernel/minimal:1 has no SSH client; "
    "choose an image with SSH for main1 if it must reach the sub kernels"
)


@pytest.fixture
def with_ssh(image):
    return Image.objects.create(reference="ssh:1", supports_ssh=True)


def _template(client, spec):
    response = client.post(TEMPLATES, {"name": "t", "spec": spec}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.mark.parametrize(
    ("spec", "warnings"),
    [
        (
            {"image": "ssh:1", "roles": {"sub": {"image": "bai-kernel/minimal:1", "replicas": 1}}},
            [NO_SERVER],
        ),
        ({"image": "bai-kernel/minimal:1", "cluster_size": 3}, [NO_SERVER]),
        (
            {"image": "bai-kernel/minimal:1", "roles": {"sub": {"image": "ssh:1", "replicas": 1}}},
            [NO_CLIENT],
        ),
        ({"image": "ssh:1", "cluster_size": 2}, []),
        ({"image": "bai-kernel/minimal:1"}, []),  # no sub kernels: nothing to reach
        ({"cluster_size": 2}, []),  # the image is chosen at launch: the preview says it
    ],
)
def test_a_template_says_when_ssh_sub1_will_not_work_and_is_saved_all_the_same(
    api, alice, with_ssh, spec, warnings
):
    client = api(alice)
    made = _template(client, spec)
    assert made["warnings"] == warnings
    assert client.get(f"{TEMPLATES}{made['id']}/").json()["warnings"] == warnings
    assert [t["warnings"] for t in client.get(TEMPLATES).json()] == [warnings]


def test_the_launch_preview_says_when_ssh_sub1_will_not_work(api, alice, with_ssh, agent):
    client = api(alice)

    def preview(**spec):
        response = client.post(
            PREVIEW, {"resources": {"cpu": "0.5", "mem": "256m"}, **spec}, format="json"
        )
        assert response.status_code == 200, response.content
        return response.json()

    answer = preview(image="bai-kernel/minimal:1", cluster_size=2)
    assert answer["warnings"] == [NO_SERVER]
    assert answer["verdict"] == "start_now"  # a warning, never a refusal
    assert preview(image="ssh:1", cluster_size=2)["warnings"] == []
    assert preview(image="bai-kernel/minimal:1")["warnings"] == []
    template = _template(
        client, {"image": "ssh:1", "roles": {"sub": {"image": "bai-kernel/minimal:1"}}}
    )
    assert preview(template=template["id"], cluster_size=2)["warnings"] == [NO_SERVER]
