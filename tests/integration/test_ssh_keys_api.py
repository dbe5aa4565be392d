"""SSH keys (profile) and the SFTP session API's refusals: clear 400s, nothing changed."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from sessions_app.kernel_images import SFTP_IMAGE
from sessions_app.models import DataFolder, Image, ResourceGroup, Session, SSHKey

pytestmark = pytest.mark.django_db


def _cut(line: str) -> str:
    """The key's data with its last 4 bytes gone (valid base64, not a key)."""
    return base64.b64encode(base64.b64decode(line.split()[1])[:-4]).decode()


def _key(tmp_path: Path, kind: str = "ed25519", bits: int | None = None) -> tuple[str, str]:
    """A fresh public key line and the fingerprint ssh-keygen prints for it."""
    path = tmp_path / f"k-{kind}-{bits}"
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)]
    if bits:
        args += ["-b", str(bits)]
    subprocess.run(args, check=True, capture_output=True)
    printed = subprocess.run(
        ["ssh-keygen", "-lf", f"{path}.pub"], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    return Path(f"{path}.pub").read_text().strip(), printed


@pytest.mark.parametrize(("kind", "bits"), [("ed25519", None), ("ecdsa", 384), ("rsa", 3072)])
def test_a_key_is_registered_with_the_fingerprint_openssh_prints(api, alice, tmp_path, kind, bits):
    line, printed = _key(tmp_path, kind, bits)
    answer = api(alice).post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": line})
    assert answer.status_code == 201, answer.json()
    assert answer.json()["fingerprint"] == printed
    listed = api(alice).get("/api/v1/ssh-keys/").json()
    assert [(k["name"], k["fingerprint"]) for k in listed] == [("laptop", printed)]


def test_bad_keys_are_refused_with_the_reason_and_nothing_is_stored(api, alice, tmp_path):
    line, _ = _key(tmp_path)
    rsa_small = subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", str(tmp_path / "small")],
        capture_output=True,
    )
    cases = {
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP": "unsupported key type",
        "ssh-ed25519 not-base64!!": "not valid base64",
        "ssh-ed25519 " + _cut(line): "not a valid ssh-ed25519 key",
        "ssh-rsa " + line.split()[1]: "does not hold a ssh-rsa key",
        "-----BEGIN OPENSSH PRIVATE KEY-----": "private key",
        line + "\n" + line: "one key on one line",
        "": "",
    }
    if rsa_small.returncode == 0:
        cases[(tmp_path / "small.pub").read_text().strip()] = "too weak"
    for text, words in cases.items():
        answer = api(alice).post(
            "/api/v1/ssh-keys/", {"name": "k", "public_key": text}, format="json"
        )
        assert answer.status_code == 400, (text, answer.json())
        assert words in answer.json()["message"], (text, answer.json())
    for body in (
        {"name": "", "public_key": line},
        {"public_key": line},
        {"name": "x", "public_key": line, "extra": 1},
    ):
        assert api(alice).post("/api/v1/ssh-keys/", body, format="json").status_code == 400
    assert not SSHKey.objects.exists()
    # The same key or name twice: refused, the first one stays.
    assert (
        api(alice).post("/api/v1/ssh-keys/", {"name": "a", "public_key": line}).status_code == 201
    )
    again = api(alice).post("/api/v1/ssh-keys/", {"name": "b", "public_key": line})
    assert again.status_code == 400 and "registered already" in again.json()["message"]
    other, _ = _key(tmp_path, "ecdsa", 256)
    same_name = api(alice).post("/api/v1/ssh-keys/", {"name": "a", "public_key": other})
    assert (
        same_name.status_code == 400 and "already have a key named" in same_name.json()["message"]
    )
    assert SSHKey.objects.count() == 1


def test_keys_are_their_owners_alone(api, alice, bob, tmp_path):
    line, _ = _key(tmp_path)
    key_id = api(alice).post("/api/v1/ssh-keys/", {"name": "a", "public_key": line}).json()["id"]
    assert api(bob).get("/api/v1/ssh-keys/").json() == []
    assert api(bob).delete(f"/api/v1/ssh-keys/{key_id}/").status_code == 404
    assert SSHKey.objects.filter(pk=key_id).exists()
    # Bob may register the same public key for himself (it is his to prove he holds).
    assert api(bob).post("/api/v1/ssh-keys/", {"name": "a", "public_key": line}).status_code == 201
    assert api(alice).delete(f"/api/v1/ssh-keys/{key_id}/").status_code == 204
    assert api(alice).get("/api/v1/ssh-keys/").json() == []
    assert api().get("/api/v1/ssh-keys/").status_code in (401, 403)


def test_an_sftp_session_is_refused_with_the_reason_when_a_check_fails(api, alice, bob, group):
    mine = DataFolder.objects.create(owner=alice, name="data")
    theirs = DataFolder.objects.create(owner=bob, name="secret")
    Image.objects.create(reference=SFTP_IMAGE)
    cases = [
        ({"folders": []}, "folders"),
        ({"folders": [theirs.pk]}, f"no folder with id {theirs.pk}"),
        ({"folders": [mine.pk, mine.pk]}, "listed twice"),
        ({"folders": ["data"]}, "folders"),
        ({"folders": [mine.pk], "resource_group": "nope"}, "unknown resource group"),
        ({"folders": [mine.pk], "other": 1}, "unknown field"),
    ]
    for body, words in cases:
        answer = api(alice).post("/api/v1/folders/sftp/", body, format="json")
        assert answer.status_code == 400, (body, answer.json())
        assert words in answer.json()["message"], (body, answer.json())
    group.allowed_session_types = ["interactive", "batch"]
    group.save()
    ResourceGroup.objects.create(name="files", allowed_session_types=["system"])
    answer = api(alice).post(
        "/api/v1/folders/sftp/", {"folders": [mine.pk], "resource_group": "default"}, format="json"
    )
    assert answer.status_code == 400
    assert (
        "does not allow system (SFTP) sessions; groups that do: files" in answer.json()["message"]
    )
    assert not Session.objects.exists()
    # Bob sees nothing of a session of alice's.
    created = api(alice).post("/api/v1/folders/sftp/", {"folders": [mine.pk]}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["resource_group"] == "files"
    sid = created.json()["id"]
    assert api(bob).get(f"/api/v1/sessions/{sid}/sftp/").status_code == 404
    assert api(bob).get(f"/api/v1/sessions/{sid}/sftp/key/").status_code == 404
    info = api(alice).get(f"/api/v1/sessions/{sid}/sftp/").json()
    assert info["host"] is None and info["port"] is None and info["folders"] == ["data"]
    key = api(alice).get(f"/api/v1/sessions/{sid}/sftp/key/")
    assert key.status_code == 200 and b"OPENSSH PRIVATE KEY" in key.content
