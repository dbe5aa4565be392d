"""``bai folders`` against a live manager, as a terminal user would use it: create a
folder, upload a file and a directory tree, list, download a file and the folder as
a zip, and see a bad name and another user's folder refused with the API's words.

Personas: ``alice`` owns the folder; ``bob`` may not reach it.
"""

from __future__ import annotations

import io
import zipfile

import pytest

from tests.docker.test_bai_cli import bai, login, with_passwords  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_bai_folders_creates_uploads_lists_and_downloads_for_its_owner_alone(
    live_system,
    alice,
    bob,
    with_passwords,  # noqa: F811
    tmp_path,
):
    config = tmp_path / "alice.json"
    login(config, live_system.url, "alice")
    refused = bai(config, "folders", "create", "../etc", check=False)
    assert refused.returncode != 0
    assert "letters, digits" in refused.stderr
    bai(config, "folders", "create", "results")

    tree = tmp_path / "run1"
    (tree / "plots").mkdir(parents=True)
    (tree / "metrics.json").write_text('{"loss": 0.1}\n')
    (tree / "plots" / "loss.svg").write_text("<svg/>\n")
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"x" * 100_000)
    bai(config, "folders", "upload", "results", str(notes), str(tree))

    listed = bai(config, "folders", "list").stdout
    line = next(row for row in listed.splitlines() if "results" in row)
    assert "3" in line.split(), listed  # three files

    out = tmp_path / "got.txt"
    bai(config, "folders", "download", "results", "notes.txt", "-o", str(out))
    assert out.read_bytes() == notes.read_bytes()
    archive = tmp_path / "results.zip"
    bai(config, "folders", "download", "results", "-o", str(archive))
    with zipfile.ZipFile(io.BytesIO(archive.read_bytes())) as z:
        names = {n.split("/", 1)[-1] if n.startswith("results/") else n for n in z.namelist()}
        assert {"notes.txt", "run1/metrics.json", "run1/plots/loss.svg"} <= names, names
        metrics = next(n for n in z.namelist() if n.endswith("run1/metrics.json"))
        assert z.read(metrics) == b'{"loss": 0.1}\n'

    other = tmp_path / "bob.json"
    login(other, live_system.url, "bob")
    assert "results" not in bai(other, "folders", "list").stdout
    denied = bai(other, "folders", "download", "alice/results", "notes.txt", check=False)
    assert denied.returncode != 0
    assert "no" in denied.stderr.lower()
