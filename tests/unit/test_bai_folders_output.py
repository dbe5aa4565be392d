"""``bai folders list``: a folder whose owner's folders are over their byte quota says so."""

from __future__ import annotations

from bai_client import output


def _folder(**changes):
    return {
        "id": 1,
        "name": "results",
        "owner": "alice",
        "permission": "owner",
        "size_bytes": 5_000_003,
        "file_count": 1,
        "mounted_by": [],
        "over_quota": False,
        **changes,
    }


def test_a_folder_over_the_quota_is_marked_in_the_listing(capsys):
    output.folders_table([_folder(over_quota=True), _folder(id=2, name="fine", size_bytes=0)])
    lines = capsys.readouterr().out.splitlines()
    over = next(line for line in lines if "results" in line)
    fine = next(line for line in lines if "fine" in line)
    assert "(over quota)" in over and "4.8 MiB" in over
    assert "over quota" not in fine
