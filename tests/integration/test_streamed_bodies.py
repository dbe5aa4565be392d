"""A big upload and a big download pass through a live daphne without sitting in its memory.

daphne on its own queues a whole request body for the application at once, and
writes a whole response into the socket's buffer as fast as the application makes
it; Django, for its part, copies a request body to a spooled file before the view
runs. ``backendai_web.serve`` reads request bodies on demand and waits on a full
socket buffer; ``backendai_web.uploads`` hands the upload view the body as it comes.
Here 256 MiB go up and come back down (the download read slowly, so that a server
without flow control would buffer most of it), and daphne's peak resident memory
grows by far less than the file. The bytes are checked on the way.

Persona: ``alice`` with a folder of her own.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
from pathlib import Path

import pytest

from sessions_app import services

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 2**20
SIZE = 256 * MIB
BLOCK = MIB


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _block(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (BLOCK // 32)


def test_a_big_upload_and_a_slow_download_keep_daphne_memory_flat(live_system, alice, make_token):
    folder = services.folder_create(owner=alice, name="big")
    token = make_token(alice)
    headers = {"Authorization": f"Token {token}"}
    path = f"/api/v1/folders/{folder.pk}/files/content/?path=blob.bin"
    pid = live_system.server.pid
    conn = http.client.HTTPConnection("127.0.0.1", live_system.port, timeout=120)
    conn.request("GET", "/api/v1/folders/", headers=headers)
    assert conn.getresponse().read()
    before = _peak_rss(pid)

    sent = hashlib.sha256()
    conn.putrequest("PUT", path)
    for name, value in {**headers, "Content-Length": str(SIZE)}.items():
        conn.putheader(name, value)
    conn.endheaders()
    for i in range(SIZE // BLOCK):
        block = _block(i)
        sent.update(block)
        conn.send(block)
    answer = conn.getresponse()
    assert answer.status == 201, answer.read()
    assert json.loads(answer.read()) == {"path": "blob.bin", "size": SIZE}
    assert hashlib.sha256((folder.host_path / "blob.bin").read_bytes()).digest() == sent.digest()
    after_upload = _peak_rss(pid)
    assert after_upload - before < SIZE // 4, (before, after_upload)

    conn.request("GET", path, headers=headers)
    answer = conn.getresponse()
    assert answer.status == 200
    got = hashlib.sha256()
    received = 0
    while chunk := answer.read(BLOCK):
        got.update(chunk)
        received += len(chunk)
        if received <= 16 * MIB:
            time.sleep(0.05)  # a slow reader at first: the server must wait for it
    assert (received, got.digest()) == (SIZE, sent.digest())
    after_download = _peak_rss(pid)
    assert after_download - before < SIZE // 4, (before, after_upload, after_download)


def test_a_request_line_past_twisteds_16_kib_gets_the_apis_answer(live_system, alice, make_token):
    """A path of 4,096 four-byte characters (12 once percent-encoded: a 48 KiB request
    line) is answered with the API's refusal, not a dropped connection."""
    folder = services.folder_create(owner=alice, name="long")
    conn = http.client.HTTPConnection("127.0.0.1", live_system.port, timeout=30)
    path = "%F0%9F%98%80" * 4096
    conn.request(
        "DELETE",
        f"/api/v1/folders/{folder.pk}/files/?path={path}",
        headers={"Authorization": f"Token {make_token(alice)}"},
    )
    answer = conn.getresponse()
    body = answer.read()
    assert answer.status == 400, (answer.status, body[:300])
    assert "path" in json.loads(body)["message"].lower()
