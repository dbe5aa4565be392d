"""Data-folder files through the manager's HTTP API against the local disk.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/folders.py [--mb 1024] [--files 10000]

Migrates the given database (use a throwaway one), starts one daphne on loopback
(no agent: files do not need one) with a storage root of its own, and measures in
the same run, on the same disk:

1. a local copy of a ``--mb`` MiB file (read and write in 1 MiB blocks: the
   disk's own speed, the baseline);
2. its upload through ``PUT /api/v1/folders/{id}/files/content/`` (http.client,
   1 MiB blocks, Content-Length given), and its download through ``GET`` of the
   same path, each checked byte for byte by size and SHA-256;
   targets: >= 100 MB/s both ways on loopback;
3. the listing of a directory of ``--files`` files (``GET .../files/?path=``), and
   the folder list (``GET /api/v1/folders/``, which walks the folder for its size);
   target: <= 1 s.

daphne's peak resident memory (VmHWM) is printed too: it shows whether a body
was held in memory on its way.

Not part of the test run. Prints the figures and the conditions.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

from streams import ROOT, cpu_seconds, free_port  # noqa: E402

BLOCK = 1024 * 1024
MB = 1_000_000


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def make_source(path: Path, mib: int) -> str:
    digest = hashlib.sha256()
    block = os.urandom(BLOCK)
    with open(path, "wb") as out:
        for i in range(mib):
            chunk = block[:-8] + i.to_bytes(8, "big")
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(BLOCK):
            digest.update(chunk)
    return digest.hexdigest()


def local_copy(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    with open(src, "rb") as a, open(dst, "wb") as b:
        while chunk := a.read(BLOCK):
            b.write(chunk)
        b.flush()
    return time.perf_counter() - start


class Server:
    def __init__(self, storage: Path, tmp: Path) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "CELERY_TASK_ALWAYS_EAGER": "true",
            "ALLOWED_HOSTS": "127.0.0.1",
            "LOG_LEVEL": "WARNING",
            "BAI_VAR_DIR": str(tmp / "var"),
            "BAI_STORAGE_ROOT": str(storage),
        }
        self.log = tmp / "daphne.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "backendai_web.serve", "-b", "127.0.0.1", "-p", str(self.port)]
            + ["backendai_web.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=open(self.log, "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.request("GET", "/login/")
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"daphne did not start; see {self.log}")

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=600, blocksize=BLOCK)

    def request(self, method: str, path: str, token: str = "", body=None, headers=None):  # noqa: ANN001
        conn = self.connection()
        all_headers = {"Authorization": f"Token {token}"} if token else {}
        all_headers.update(headers or {})
        conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="MiB to upload and download")
    parser.add_argument("--files", type=int, default=10_000, help="files in the listed directory")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.files = 4, 50

    tmp = Path(tempfile.mkdtemp(prefix="bai-bench-folders-"))
    storage = (tmp / "storage").resolve()
    storage.mkdir()
    os.environ["BAI_STORAGE_ROOT"] = str(storage)
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from sessions_app import services
    from sessions_app.models import DataFolder, ResourcePolicy
    from sessions_app.tokens import token_create

    call_command("migrate", verbosity=0)
    ResourcePolicy.objects.get_or_create(is_default=True, defaults={"name": "default"})
    user, _ = User.objects.get_or_create(username="bench-folders")
    DataFolder.objects.filter(owner=user).delete()
    folder = services.folder_create(owner=user, name="bench")
    _, token = token_create(user=user)

    server = Server(storage, tmp)
    try:
        figures = run(server, token, folder, tmp, args)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, figures)


def run(server: Server, token: str, folder, tmp: Path, args) -> dict:  # noqa: ANN001
    size = args.mb * BLOCK
    source = tmp / "source.bin"
    digest = make_source(source, args.mb)
    figures: dict = {"size": size}

    os.sync()
    figures["local_copy"] = local_copy(source, tmp / "copy.bin")
    os.unlink(tmp / "copy.bin")
    os.sync()

    base = f"/api/v1/folders/{folder.pk}"
    query = urllib.parse.urlencode({"path": "big/source.bin"})
    cpu0 = cpu_seconds(server.proc.pid)
    start = time.perf_counter()
    with open(source, "rb") as body:
        status, data = server.request(
            "PUT",
            f"{base}/files/content/?{query}",
            token,
            body=body,
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
    figures["upload"] = time.perf_counter() - start
    figures["upload_cpu"] = cpu_seconds(server.proc.pid) - cpu0
    figures["upload_rss"] = peak_rss(server.proc.pid)
    assert status == 201, (status, data[:300])
    assert json.loads(data)["size"] == size
    assert sha256(folder.host_path / "big" / "source.bin") == digest
    os.sync()

    target = tmp / "downloaded.bin"
    cpu0 = cpu_seconds(server.proc.pid)
    start = time.perf_counter()
    conn = server.connection()
    conn.request(
        "GET", f"{base}/files/content/?{query}", headers={"Authorization": f"Token {token}"}
    )
    response = conn.getresponse()
    assert response.status == 200, response.status
    with open(target, "wb") as out:
        while chunk := response.read(BLOCK):
            out.write(chunk)
    conn.close()
    figures["download"] = time.perf_counter() - start
    figures["download_cpu"] = cpu_seconds(server.proc.pid) - cpu0
    figures["download_rss"] = peak_rss(server.proc.pid)
    assert target.stat().st_size == size and sha256(target) == digest
    os.unlink(target)
    os.unlink(folder.host_path / "big" / "source.bin")

    many = folder.host_path / "many"
    many.mkdir()
    for i in range(args.files):
        (many / f"file-{i:05d}.txt").write_bytes(b"x" * (i % 100))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        status, data = server.request("GET", f"{base}/files/?path=many", token)
        times.append(time.perf_counter() - start)
        assert status == 200 and len(json.loads(data)["entries"]) == args.files
    figures["listing"] = sorted(times)[len(times) // 2]
    start = time.perf_counter()
    status, data = server.request("GET", "/api/v1/folders/", token)
    figures["folder_list"] = time.perf_counter() - start
    assert status == 200 and json.loads(data)[0]["file_count"] == args.files
    return figures


def report(args, f: dict) -> None:  # noqa: ANN001
    from django.conf import settings

    def rate(seconds: float) -> str:
        return f"{f['size'] / MB / seconds:8.1f} MB/s  ({seconds:.2f} s)"

    up = f["size"] / MB / f["upload"]
    down = f["size"] / MB / f["download"]
    print(f"folders bench: {args.mb} MiB through the API, a directory of {args.files} files")
    print(f"  local disk copy (1 MiB blocks)    {rate(f['local_copy'])}")
    print(
        f"  upload   PUT .../files/content/   {rate(f['upload'])}  "
        f"daphne cpu {f['upload_cpu']:.2f} s, peak RSS {f['upload_rss'] / 2**20:.0f} MiB  "
        f"[target >= 100 MB/s: {'met' if up >= 100 else 'MISSED'}]"
    )
    print(
        f"  download GET .../files/content/   {rate(f['download'])}  "
        f"daphne cpu {f['download_cpu']:.2f} s, peak RSS {f['download_rss'] / 2**20:.0f} MiB  "
        f"[target >= 100 MB/s: {'met' if down >= 100 else 'MISSED'}]"
    )
    print(
        f"  listing of {args.files} files (median of 5)  {f['listing'] * 1000:8.1f} ms  "
        f"[target <= 1 s: {'met' if f['listing'] <= 1 else 'MISSED'}]"
    )
    print(f"  folder list (walks for size)      {f['folder_list'] * 1000:8.1f} ms")
    print(
        f"conditions: {platform.node()}, {platform.platform()}, python {platform.python_version()}, "
        f"{os.cpu_count()} cpus, database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
        "one daphne on loopback, the source, copies and storage on the same disk"
    )


if __name__ == "__main__":
    main()
