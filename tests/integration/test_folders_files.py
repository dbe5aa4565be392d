"""Data folders through the API: files in them, the storage quota, sharing and
launch mounts of shared folders.

Personas (tests/conftest.py):
- ``alice`` owns the folder ``data``; she may do anything with it.
- ``bob`` is another plain user: alice's folder does not exist for him (404 on
  every path) until she shares it; with a read-only share he reads and gets
  403 on every write.
- ``admin`` reaches every folder.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from scheduler_app.reconcile import create_kernels_command
from sessions_app import services
from sessions_app.models import DataFolder, FolderShare, ResourcePolicy, Session, Status

# transaction=True: the download, upload and zip views are async and reach the
# database from worker threads (loop.db), which see only committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

MiB = 2**20


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


@pytest.fixture
def as_bob(api, bob):
    return api(bob)


@pytest.fixture
def folder(alice, group) -> DataFolder:
    return services.folder_create(owner=alice, name="data")


def url(folder: DataFolder, tail: str = "") -> str:
    return f"/api/v1/folders/{folder.pk}/{tail}"


def error(response, status: int, *words: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    for word in words:
        assert word in body["message"], body
    return body["message"]


def upload(client, folder, path: str, data: bytes):
    return client.put(
        url(folder, "files/content/"),
        data=data,
        content_type="application/octet-stream",
        QUERY_STRING=f"path={path}",
    )


def body_of(response) -> bytes:
    """A streamed answer's bytes (the views stream with async iterators, as under daphne)."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def policy(**fields) -> ResourcePolicy:
    p = ResourcePolicy.objects.get(is_default=True)
    for k, v in fields.items():
        setattr(p, k, v)
    p.save()
    return p


# --- folders: list, create, quota, delete -------------------------------------------------


def test_the_list_gives_size_count_mounts_and_shares(as_alice, as_bob, bob, folder):
    (folder.host_path / "a.bin").write_bytes(b"x" * 1000)
    (folder.host_path / "sub").mkdir()
    (folder.host_path / "sub" / "b.bin").write_bytes(b"y" * 24)
    os.symlink("/etc/passwd", folder.host_path / "link")  # not counted, not followed
    FolderShare.objects.create(folder=folder, user=bob, permission="ro")

    [mine] = as_alice.get("/api/v1/folders/").json()
    assert mine["name"] == "data" and mine["owner"] == "alice" and mine["permission"] == "owner"
    assert (mine["size_bytes"], mine["file_count"]) == (1024, 2)
    assert mine["shares"] == [{"user": "bob", "permission": "ro"}]
    assert mine["mounted_by"] == []

    [shared] = as_bob.get("/api/v1/folders/").json()
    assert shared["id"] == folder.pk and shared["permission"] == "ro" and shared["owner"] == "alice"
    assert shared["shares"] == []  # only the owner sees who else has it


def test_mounted_by_lists_every_live_session_for_the_owner_and_own_ones_for_a_sharee(
    as_alice, as_bob, alice, bob, folder, image, group
):
    FolderShare.objects.create(folder=folder, user=bob, permission="rw")
    a = Session.objects.create(owner=alice, name="a-job", image=image, resource_group=group)
    b = Session.objects.create(owner=bob, name="b-job", image=image, resource_group=group)
    ended = Session.objects.create(owner=alice, name="old", image=image, resource_group=group)
    for s in (a, b, ended):
        s.mounts.set([folder])
    ended.mark_cancelled("done")

    [mine] = as_alice.get("/api/v1/folders/").json()
    assert [m["name"] for m in mine["mounted_by"]] == ["a-job", "b-job"]
    [shared] = as_bob.get("/api/v1/folders/").json()
    assert shared["mounted_by"] == [{"id": str(b.pk), "name": "b-job"}]


def test_creating_past_max_folders_is_refused_with_the_figures(as_alice, group):
    policy(max_folders=2)
    for name in ("one", "two"):
        assert as_alice.post("/api/v1/folders/", {"name": name}, format="json").status_code == 201
    message = error(
        as_alice.post("/api/v1/folders/", {"name": "three"}, format="json"),
        403,
        "You have 2 folders, the most your policy allows (2).",
    )
    assert message
    assert not DataFolder.objects.filter(name="three").exists()


def test_a_browser_session_creates_folders_under_max_folders(client, alice, group):
    # The browser's path: session login, so the request's user is a lazy wrapper.
    policy(max_folders=2)
    client.force_login(alice)
    for name in ("one", "two"):
        response = client.post("/api/v1/folders/", {"name": name}, content_type="application/json")
        assert response.status_code == 201, response.content
    error(
        client.post("/api/v1/folders/", {"name": "three"}, content_type="application/json"),
        403,
        "You have 2 folders, the most your policy allows (2).",
    )
    assert sorted(DataFolder.objects.values_list("name", flat=True)) == ["one", "two"]


def test_the_quota_endpoint_gives_counts_and_bytes(as_alice, folder):
    assert as_alice.get("/api/v1/folders/quota/").json() == {
        "folder_count": 1,
        "max_folders": None,
        "used_bytes": 0,
        "max_bytes": None,
    }
    policy(max_folders=5, max_folder_bytes=10 * MiB)
    (folder.host_path / "f").write_bytes(b"z" * 300)
    assert as_alice.get("/api/v1/folders/quota/").json() == {
        "folder_count": 1,
        "max_folders": 5,
        "used_bytes": 300,
        "max_bytes": 10 * MiB,
    }


def test_deleting_a_mounted_folder_is_refused_naming_every_live_session(
    as_alice, alice, bob, folder, image, group
):
    sessions = [
        Session.objects.create(owner=owner, name=name, image=image, resource_group=group)
        for owner, name in ((alice, "first"), (bob, "second"))
    ]
    for s in sessions:
        s.mounts.set([folder])
    error(
        as_alice.delete(url(folder)),
        409,
        "Folder 'data' is mounted by live sessions 'first', 'second'; terminate them first.",
    )
    assert folder.host_path.is_dir()
    for s in sessions:
        s.mark_cancelled("done")
    assert as_alice.delete(url(folder)).status_code == 204
    assert not folder.host_path.exists()


# --- files ------------------------------------------------------------------------------------


def test_a_file_is_uploaded_listed_downloaded_renamed_and_deleted(as_alice, folder):
    response = upload(as_alice, folder, "deep/er/hello.txt", b"hello world")
    assert response.status_code == 201, response.content
    assert response.json() == {"path": "deep/er/hello.txt", "size": 11}
    assert (folder.host_path / "deep/er/hello.txt").read_bytes() == b"hello world"
    # Overwrite: the new content replaces the old, no temporary file is left.
    assert upload(as_alice, folder, "deep/er/hello.txt", b"bye").status_code == 201
    assert os.listdir(folder.host_path / "deep/er") == ["hello.txt"]

    assert (
        as_alice.post(url(folder, "files/mkdir/"), {"path": "empty"}, format="json").status_code
        == 201
    )
    listing = as_alice.get(url(folder, "files/")).json()
    assert listing["path"] == "" and listing["truncated"] is False
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [
        ("deep", "dir"),
        ("empty", "dir"),
    ]
    inner = as_alice.get(url(folder, "files/"), {"path": "deep/er"}).json()
    [entry] = inner["entries"]
    assert entry["path"] == "deep/er/hello.txt" and entry["size"] == 3 and entry["type"] == "file"
    assert entry["modified"].endswith("+00:00")

    response = as_alice.get(url(folder, "files/content/"), {"path": "deep/er/hello.txt"})
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith('attachment; filename="hello.txt"')
    assert response["Content-Length"] == "3"
    assert body_of(response) == b"bye"

    response = as_alice.post(
        url(folder, "files/rename/"), {"path": "deep/er", "new_path": "moved"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert (folder.host_path / "moved/hello.txt").read_bytes() == b"bye"
    error(
        as_alice.post(
            url(folder, "files/rename/"), {"path": "moved", "new_path": "empty"}, format="json"
        ),
        409,
        "exists already",
    )
    assert as_alice.delete(url(folder, "files/") + "?path=moved").status_code == 204
    assert not (folder.host_path / "moved").exists()
    error(as_alice.delete(url(folder, "files/") + "?path="), 400, "names the folder itself")


def test_the_zip_holds_the_tree_streamed(as_alice, folder):
    (folder.host_path / "a").mkdir()
    (folder.host_path / "a" / "one.txt").write_bytes(b"1" * 5000)
    (folder.host_path / "top.txt").write_bytes(b"top")
    response = as_alice.get(url(folder, "archive/"))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert response.streaming
    assert 'filename="data.zip"' in response["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(body_of(response))) as z:
        assert sorted(z.namelist()) == ["a/", "a/one.txt", "top.txt"]
        assert z.read("a/one.txt") == b"1" * 5000
    sub = as_alice.get(url(folder, "archive/"), {"path": "a"})
    with zipfile.ZipFile(io.BytesIO(body_of(sub))) as z:
        assert z.namelist() == ["one.txt"]


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory outside the storage root, as /etc is: links to it are never followed."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret").write_text("not yours")
    return d


def test_a_symlink_to_etc_is_not_followed_by_listing_download_zip_or_delete(
    as_alice, folder, outside
):
    # As a container would make them, in the folder it mounts.
    os.symlink("/etc", folder.host_path / "etc")
    os.symlink("/etc/passwd", folder.host_path / "passwd")
    os.symlink(outside, folder.host_path / "out")
    (folder.host_path / "real.txt").write_text("mine")

    entries = {e["name"]: e for e in as_alice.get(url(folder, "files/")).json()["entries"]}
    assert entries["etc"]["type"] == "symlink" and entries["etc"]["size"] == 0
    assert entries["passwd"]["type"] == "symlink"

    for path in ("passwd", "etc/passwd", "out/secret"):
        response = as_alice.get(url(folder, "files/content/"), {"path": path})
        error(response, 404, "is a symbolic link; links are not followed")
    error(as_alice.get(url(folder, "files/"), {"path": "etc"}), 404, "symbolic link")
    error(as_alice.get(url(folder, "archive/"), {"path": "etc"}), 404, "symbolic link")
    error(upload(as_alice, folder, "out/new", b"x"), 404, "symbolic link")
    assert not (outside / "new").exists()

    with zipfile.ZipFile(io.BytesIO(body_of(as_alice.get(url(folder, "archive/"))))) as z:
        assert z.namelist() == ["real.txt"]

    # Deleting a link removes the link, never what it points at.
    assert as_alice.delete(url(folder, "files/") + "?path=out").status_code == 204
    assert not os.path.lexists(folder.host_path / "out")
    assert (outside / "secret").read_text() == "not yours"


@pytest.mark.parametrize(
    "path, words",
    [
        ("../other", "'..'"),
        ("a/../../x", "'..'"),
        ("/etc/passwd", "relative"),
        ("a//b", "empty part"),
        ("a/./b", "'.'"),
        ("a/", "empty part"),
        ("x" * 300, "longer than 255"),
        ("/".join(["d"] * 65), "65 levels"),
        ("a/" * 2100 + "b", "bytes long"),
    ],
)
def test_a_path_leaving_the_folder_or_past_the_bounds_is_refused_and_changes_nothing(
    as_alice, folder, path, words
):
    before = sorted(os.listdir(folder.host_path.parent))
    for response in (
        upload(as_alice, folder, path, b"x"),
        as_alice.get(url(folder, "files/content/"), {"path": path}),
        as_alice.post(url(folder, "files/mkdir/"), {"path": path}, format="json"),
        as_alice.post(url(folder, "files/rename/"), {"path": "a", "new_path": path}, format="json"),
    ):
        assert response.status_code == 400, (path, response.content)
        assert words in response.json()["message"] or response.json()["extra"]
    assert sorted(os.listdir(folder.host_path.parent)) == before
    assert os.listdir(folder.host_path) == []


def test_a_nul_in_the_path_is_refused(as_alice, folder):
    error(as_alice.get(url(folder, "files/"), {"path": "a\x00b"}), 400, "NUL")


@pytest.mark.parametrize(
    "name, words",
    [
        ("..\\..\\..\\Windows\\evil.txt", "backslash"),
        ("dir\\x", "backslash"),
        ("line\nbreak", "control characters"),
        ("tab\there", "control characters"),
        ("esc\x1b[31m", "control characters"),
        ("C:evil.txt", "drive"),
        ("c:", "drive"),
    ],
)
def test_a_name_with_a_path_trick_is_refused_at_every_entry_and_changes_nothing(
    as_alice, folder, name, words
):
    (folder.host_path / "a").write_bytes(b"a")
    for response in (
        upload(as_alice, folder, name, b"x"),
        upload(as_alice, folder, f"sub/{name}", b"x"),
        as_alice.post(url(folder, "files/mkdir/"), {"path": name}, format="json"),
        as_alice.post(url(folder, "files/rename/"), {"path": "a", "new_path": name}, format="json"),
    ):
        error(response, 400, words)
    assert os.listdir(folder.host_path) == ["a"]


def test_a_colon_inside_a_name_is_still_allowed(as_alice, folder):
    assert upload(as_alice, folder, "12:30.log", b"x").status_code == 201


def test_a_name_a_kernel_wrote_is_zipped_under_a_safe_member_name_and_can_be_removed(
    as_alice, folder
):
    # A kernel writes whatever Linux allows; the zip must still unpack inside its target.
    (folder.host_path / "..\\..\\Windows").mkdir()
    (folder.host_path / "..\\..\\Windows" / "C:evil\x07.txt").write_bytes(b"evil")
    with zipfile.ZipFile(io.BytesIO(body_of(as_alice.get(url(folder, "archive/"))))) as z:
        names = z.namelist()
    assert names == [".._.._Windows/", ".._.._Windows/C_evil_.txt"]
    for name in names:
        assert "\\" not in name and ":" not in name
        assert ".." not in name.split("/")
    response = as_alice.delete(url(folder, "files/") + "?path=..%5C..%5CWindows")
    assert response.status_code == 204, response.content
    assert os.listdir(folder.host_path) == []


# --- the byte quota ----------------------------------------------------------------------------


def test_an_upload_past_the_byte_quota_is_refused_with_the_figures(as_alice, folder, alice):
    policy(max_folder_bytes=1 * MiB)
    (folder.host_path / "old.bin").write_bytes(b"o" * (900 * 1024))
    other = services.folder_create(owner=alice, name="other")
    (other.host_path / "more.bin").write_bytes(b"m" * (24 * 1024))  # every folder counts

    message = error(
        upload(as_alice, folder, "new.bin", b"n" * (200 * 1024)),
        413,
        "Upload refused: your folders hold 924.0 KiB of your 1.0 MiB quota; "
        "this file (200.0 KiB) would take them to 1.1 MiB.",
    )
    assert message
    assert sorted(os.listdir(folder.host_path)) == ["old.bin"]
    # Replacing a file counts only the difference.
    assert upload(as_alice, folder, "old.bin", b"r" * (950 * 1024)).status_code == 201


def test_a_folder_a_kernel_wrote_past_the_quota_is_measured_shown_and_refuses_uploads(
    as_alice, alice, folder, image, group, monkeypatch
):
    from scheduler_app import sweeps

    policy(max_folder_bytes=1 * MiB)
    session = Session.objects.create(owner=alice, name="writer", image=image, resource_group=group)
    session.mounts.add(folder)
    assert upload(as_alice, folder, "small.txt", b"x").status_code == 201
    assert DataFolder.objects.get(pk=folder.pk).measured_bytes == 1  # measured after the upload
    # A kernel writes 5,000,003 bytes: nothing stops it, the sweep sees it after the fact.
    (folder.host_path / "big.bin").write_bytes(b"k" * 5_000_003)
    # A folder whose walk fails does not stop the sweep for the others.
    broken = services.folder_create(owner=alice, name="broken")
    session.mounts.add(broken)
    real_usage = sweeps.session_services.selectors.folder_usage

    def usage(*, folder, seconds=2.0):
        if folder.pk == broken.pk:
            raise OSError("the storage of this folder is gone")
        return real_usage(folder=folder, seconds=seconds)

    monkeypatch.setattr(sweeps.session_services.selectors, "folder_usage", usage)
    done = sweeps.sweep_folder_usage()
    assert done["failed"] == [broken.pk] and folder.pk in done["measured"]
    monkeypatch.undo()
    assert DataFolder.objects.get(pk=folder.pk).measured_bytes == 5_000_004

    listed = {f["name"]: f for f in as_alice.get("/api/v1/folders/").json()}
    assert listed["data"]["over_quota"] is True
    assert listed["data"]["measured_bytes"] == 5_000_004 and listed["data"]["measured_at"]
    refused = upload(as_alice, folder, "more.txt", b"y")
    message = error(refused, 413, "over your 1.0 MiB quota", "delete files first")
    assert "4.8 MiB" in message, message
    assert not (folder.host_path / "more.txt").exists()

    # Under the quota again (the user deleted the big file): uploads pass, the badge goes.
    assert as_alice.delete(url(folder, "files/") + "?path=big.bin").status_code == 204
    sweeps.sweep_folder_usage()
    assert as_alice.get(url(folder)).json()["over_quota"] is False
    assert upload(as_alice, folder, "more.txt", b"y").status_code == 201


def test_an_upload_without_a_length_is_stopped_once_it_passes_the_quota(alice, folder):
    policy(max_folder_bytes=1 * MiB)
    access = services.selectors.get_folder_for_user(user=alice, folder_id=folder.pk)
    allowance = services.folder_upload_allowance(access=access, user=alice, parts=("big",))
    sent = []

    def chunks():
        for _ in range(10):
            sent.append(1)
            yield b"b" * (256 * 1024)

    with pytest.raises(services.PayloadTooLarge) as refused:
        services.folder_file_write(
            folder=folder, parts=("big",), chunks=chunks(), allowance=allowance, length=None
        )
    assert "this file (more than 1.3 MiB)" in refused.value.message
    assert len(sent) == 5  # stopped at the first chunk past the quota, not at the end
    assert os.listdir(folder.host_path) == []  # nothing left behind


def test_two_uploads_that_each_fit_cannot_together_pass_the_quota(alice, folder):
    """Both begin while the folders are empty (another tab, another web process); the one
    that writes past the quota second is refused, naming what the other wrote."""
    policy(max_folder_bytes=1 * MiB)
    access = services.selectors.get_folder_for_user(user=alice, folder_id=folder.pk)
    first = services.folder_upload_allowance(access=access, user=alice, parts=("a",))
    second = services.folder_upload_allowance(access=access, user=alice, parts=("b",))
    assert first.limit == second.limit == 1 * MiB

    def write(parts, allowance):
        return services.folder_file_write(
            folder=folder,
            parts=parts,
            chunks=iter([b"x" * (300 * 1024)] * 2),
            allowance=allowance,
            length=None,
        )

    assert write(("a",), first) == 600 * 1024
    with pytest.raises(services.PayloadTooLarge) as refused:
        write(("b",), second)
    assert "600.0 KiB of it written by other uploads while this one ran" in refused.value.message
    assert refused.value.extra["used_bytes"] == 600 * 1024
    assert sorted(os.listdir(folder.host_path)) == ["a"]  # nothing of "b" left behind
    # Begun afterwards, an upload sees the file on disk and the room that is left.
    third = services.folder_upload_allowance(access=access, user=alice, parts=("c",))
    assert third.limit == 424 * 1024
    assert (
        services.folder_file_write(
            folder=folder, parts=("c",), chunks=iter([b"y" * 1000]), allowance=third, length=1000
        )
        == 1000
    )


def test_a_sharee_writing_counts_against_the_owners_quota(as_bob, bob, folder):
    policy(max_folder_bytes=1000)
    FolderShare.objects.create(folder=folder, user=bob, permission="rw")
    error(upload(as_bob, folder, "f", b"x" * 2000), 413, "alice's folders hold 0 B of their")
    assert upload(as_bob, folder, "f", b"x" * 500).status_code == 201


# --- who may reach a folder ----------------------------------------------------------------------


def every_endpoint(folder):
    """(method, path, kwargs) for every operation on one folder."""
    return [
        ("get", url(folder), {}),
        ("delete", url(folder), {}),
        ("get", url(folder, "files/"), {"data": {"path": ""}}),
        ("delete", url(folder, "files/") + "?path=f.txt", {}),
        ("get", url(folder, "files/content/"), {"data": {"path": "f.txt"}}),
        (
            "put",
            url(folder, "files/content/") + "?path=g.txt",
            {"data": b"x", "content_type": "application/octet-stream"},
        ),
        ("get", url(folder, "archive/"), {}),
        ("post", url(folder, "files/mkdir/"), {"data": {"path": "d"}, "format": "json"}),
        (
            "post",
            url(folder, "files/rename/"),
            {"data": {"path": "f.txt", "new_path": "h.txt"}, "format": "json"},
        ),
        ("get", url(folder, "shares/"), {}),
        (
            "post",
            url(folder, "shares/"),
            {"data": {"user": "root", "permission": "ro"}, "format": "json"},
        ),
        ("delete", url(folder, "shares/bob/"), {}),
    ]


def test_another_user_gets_404_on_every_path_of_a_folder(as_bob, folder):
    (folder.host_path / "f.txt").write_text("alice's")
    for method, path, kwargs in every_endpoint(folder):
        response = getattr(as_bob, method)(path, **kwargs)
        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["message"] == "No such folder.", (method, path)
    assert sorted(os.listdir(folder.host_path)) == ["f.txt"]
    assert DataFolder.objects.filter(pk=folder.pk).exists()
    # A folder that does not exist answers the same.
    assert as_bob.get("/api/v1/folders/999999/files/").json()["message"] == "No such folder."


def test_a_read_only_sharee_reads_and_gets_403_on_every_write(as_bob, bob, folder):
    (folder.host_path / "f.txt").write_text("alice's")
    FolderShare.objects.create(folder=folder, user=bob, permission="ro")
    for method, path, kwargs in every_endpoint(folder):
        response = getattr(as_bob, method)(path, **kwargs)
        expected = 200 if method == "get" and "shares" not in path else 403
        assert response.status_code == expected, (method, path, response.content)
    assert sorted(os.listdir(folder.host_path)) == ["f.txt"]
    assert FolderShare.objects.get(folder=folder).permission == "ro"


def test_an_admin_reaches_any_folder(api, admin, folder):
    (folder.host_path / "f.txt").write_text("alice's")
    as_admin = api(admin)
    assert as_admin.get(url(folder, "files/")).json()["entries"][0]["name"] == "f.txt"
    assert body_of(as_admin.get(url(folder, "files/content/"), {"path": "f.txt"})) == b"alice's"


# --- sharing ---------------------------------------------------------------------------------------


def test_sharing_changing_and_revoking(as_alice, as_bob, bob, folder):
    response = as_alice.post(
        url(folder, "shares/"), {"user": "bob", "permission": "ro"}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["shares"] == [{"user": "bob", "permission": "ro"}]
    assert "Revoking affects sessions started from now on" in body["detail"]
    assert [f["name"] for f in as_bob.get("/api/v1/folders/").json()] == ["data"]

    response = as_alice.post(
        url(folder, "shares/"), {"user": "bob", "permission": "rw"}, format="json"
    )
    assert response.json()["shares"] == [{"user": "bob", "permission": "rw"}]
    assert FolderShare.objects.count() == 1

    error(
        as_alice.post(
            url(folder, "shares/"), {"user": "nobody", "permission": "ro"}, format="json"
        ),
        400,
        "no user named 'nobody'",
    )
    error(
        as_alice.post(url(folder, "shares/"), {"user": "alice", "permission": "ro"}, format="json"),
        400,
        "yours already",
    )
    error(
        as_alice.post(url(folder, "shares/"), {"user": "bob", "permission": "x"}, format="json"),
        400,
    )
    assert as_alice.delete(url(folder, "shares/bob/")).status_code == 204
    assert as_bob.get("/api/v1/folders/").json() == []
    error(as_alice.delete(url(folder, "shares/bob/")), 404, "not shared with 'bob'")


# --- launch mounts -----------------------------------------------------------------------------------


def launch(owner, mounts):
    return services.session_create(
        owner=owner, spec={"image": "bai-kernel/minimal:1", "mounts": mounts}
    )


def test_a_shared_folder_is_mounted_and_a_read_only_share_is_sent_read_only(
    alice, bob, folder, image
):
    FolderShare.objects.create(folder=folder, user=bob, permission="ro")
    rw = services.folder_create(owner=alice, name="scratch")
    FolderShare.objects.create(folder=rw, user=bob, permission="rw")
    session = launch(bob, ["data", "alice/scratch"])
    assert set(session.mounts.all()) == {folder, rw}
    assert list(session.readonly_mounts.all()) == [folder]
    command = create_kernels_command(session=session, kernels=list(session.kernels.all()))
    mounts = {m["name"]: m for m in command["kernels"][0]["mounts"]}
    assert mounts["data"] == {"name": "data", "host_path": str(folder.host_path), "readonly": True}
    assert "readonly" not in mounts["scratch"]


def test_own_folder_wins_a_bare_name_and_two_mounts_on_one_target_are_refused(
    alice, bob, folder, image
):
    FolderShare.objects.create(folder=folder, user=bob, permission="ro")
    own = services.folder_create(owner=bob, name="data")
    session = launch(bob, ["data"])
    assert list(session.mounts.all()) == [own] and not session.readonly_mounts.exists()
    with pytest.raises(services.field_error("x", "y").__class__) as refused:
        launch(bob, ["data", "alice/data"])
    assert "would both be mounted at /home/work/data" in str(refused.value.fields)


def test_an_unshared_or_revoked_folder_cannot_be_mounted(alice, bob, folder, image):
    with pytest.raises(services.field_error("x", "y").__class__) as refused:
        launch(bob, ["alice/data"])
    assert "'alice' shares no data folder named 'data'" in str(refused.value.fields)
    share = FolderShare.objects.create(folder=folder, user=bob, permission="rw")
    running = launch(bob, ["alice/data"])
    share.delete()
    with pytest.raises(services.field_error("x", "y").__class__):
        launch(bob, ["data"])
    # A running session keeps the mount it got.
    assert list(Session.objects.get(pk=running.pk).mounts.all()) == [folder]
    assert Session.objects.get(pk=running.pk).status == Status.PENDING
