"""The apps proxy against the same server reached directly, in the same run.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/apps.py [--requests 1000] [--mb 100]

Starts daphne, the apps proxy (``python -m proxy_app.serve``) and a Docker agent on
loopback (bench/streams.py's stack), launches a Python-image session whose start command
serves /tmp over HTTP (GET, and PUT streamed to a file), and measures, through the proxy
and directly from the host (the container's bridge address):

1. small GETs one at a time on a kept-alive connection: latency p50 and p99
   (target: at most 3 ms added to p50);
2. small GETs from 32 concurrent clients: requests/s (target: >= 500);
3. a 100 MB download and upload: MB/s (target: >= 100);
4. in Chromium (/usr/bin/chromium, driven by Playwright), on a fresh session of the
   Python image: the time from the click on "Jupyter" in the session list to
   Jupyter's file page ready in its new tab (the notebook server starts on that
   first click), and from "New > Python 3" to the notebook's kernel idle
   (target: usable within 3 s of the click).

Not part of the test run. Prints the figures, the ratios and the conditions.
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

import streams  # noqa: E402
from streams import Stack, api, launch, pct  # noqa: E402

SERVER = """exec python3 -c '
import functools, http.server
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_PUT(self):
        left = int(self.headers["Content-Length"])
        with open("/tmp/upload.bin", "wb") as f:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                f.write(chunk)
                left -= len(chunk)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()
H.protocol_version = "HTTP/1.1"
H.disable_nagle_algorithm = True  # headers and body go in separate writes
open("/tmp/small.txt", "w").write("hello\\n")
with open("/tmp/big.bin", "wb") as f:
    f.write(bytes(1 << 20) * 100)
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), functools.partial(H, directory="/tmp")).serve_forever()
'"""


class Target:
    def __init__(self, name: str, port: int, host: str, headers: dict[str, str], addr: str):
        self.name, self.port, self.host, self.headers, self.addr = name, port, host, headers, addr

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.addr, self.port, timeout=120)

    def get(self, conn: http.client.HTTPConnection, path: str) -> bytes:
        conn.request("GET", path, headers={"Host": self.host, **self.headers})
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
        return body


def latency(target: Target, n: int) -> list[float]:
    conn = target.conn()
    for _ in range(20):
        target.get(conn, "/small.txt")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        target.get(conn, "/small.txt")
        times.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return times


def throughput(target: Target, clients: int, per_client: int) -> float:
    def run():
        conn = target.conn()
        for _ in range(per_client):
            target.get(conn, "/small.txt")
        conn.close()

    threads = [threading.Thread(target=run) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients * per_client / (time.perf_counter() - t0)


def download(target: Target) -> float:
    conn = target.conn()
    t0 = time.perf_counter()
    conn.request("GET", "/big.bin", headers={"Host": target.host, **target.headers})
    response = conn.getresponse()
    size = 0
    while chunk := response.read(1 << 20):
        size += len(chunk)
    elapsed = time.perf_counter() - t0
    conn.close()
    return size / 2**20 / elapsed


def upload(target: Target, mb: int) -> float:
    block = os.urandom(1 << 20)

    class Body:
        left = mb

        def read(self, _n: int = -1) -> bytes:
            if self.left <= 0:
                return b""
            self.left -= 1
            return block

    conn = target.conn()
    t0 = time.perf_counter()
    conn.request(
        "PUT",
        "/upload.bin",
        body=Body(),
        headers={"Host": target.host, "Content-Length": str(mb << 20), **target.headers},
    )
    response = conn.getresponse()
    response.read()
    elapsed = time.perf_counter() - t0
    assert response.status == 201, response.status
    conn.close()
    return mb / elapsed


CHROMIUM = os.environ.get("BAI_CHROMIUM", "/usr/bin/chromium")
BENCH_PASSWORD = "bench-password"  # noqa: S105  (a throwaway user of the bench database)


def jupyter_click(stack: Stack, token: str, runs: int) -> list[tuple[float, float]]:
    """(click -> Jupyter's page ready, New notebook -> kernel idle) in seconds, per run."""
    from playwright.sync_api import sync_playwright

    timings = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for _ in range(runs):
                session = launch(
                    stack,
                    token,
                    {"image": "bai-kernel/python:2", "resources": {"cpu": 1, "mem": "1g"}},
                )
                timings.append(_open_jupyter(browser, stack, session["id"]))
                _terminate(stack, token, session["id"])
        finally:
            browser.close()
    return timings


def _terminate(stack: Stack, token: str, session_id: str) -> None:
    api(stack, token, f"sessions/{session_id}/terminate/", {})


def _jupyter_ready_user() -> None:
    """The bench user logs in to the browser; the Python image declares Jupyter."""
    from django.contrib.auth.models import User

    from sessions_app import kernel_images
    from sessions_app.models import Image

    user = User.objects.get(username="bench")
    user.set_password(BENCH_PASSWORD)
    user.save()
    Image.objects.filter(reference="bai-kernel/python:2").update(
        service_ports=[kernel_images.JUPYTER_APP]
    )


def _open_jupyter(browser, stack: Stack, session_id: str) -> tuple[float, float]:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{stack.url}/login/")
        page.fill("#id_username", "bench")
        page.fill("#id_password", BENCH_PASSWORD)
        page.click("button[type=submit]")
        button = page.locator(f'tr[data-id="{session_id}"] button[data-app="jupyter"]')
        button.wait_for(timeout=30_000)
        with context.expect_page(timeout=30_000) as opened:
            clicked = time.perf_counter()
            button.click()
        tab = opened.value
        tab.locator("#new-dropdown-button").wait_for(timeout=30_000)
        tab.wait_for_load_state("load")
        ready = time.perf_counter() - clicked
        tab.locator("#new-dropdown-button").click()
        with context.expect_page(timeout=30_000) as notebook_opened:
            asked = time.perf_counter()
            tab.locator("#kernel-python3 a").click()
        notebook = notebook_opened.value
        notebook.locator("#kernel_indicator_icon.kernel_idle_icon").wait_for(
            state="attached", timeout=30_000
        )
        return ready, time.perf_counter() - asked
    finally:
        context.close()


def wait_listening(proc: subprocess.Popen, port: int, timeout: float = 60) -> None:
    """Until the apps proxy accepts connections (it takes seconds on a busy machine)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the apps proxy did not listen on {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--jupyter-runs", type=int, default=3)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.clients, args.mb, args.jupyter_runs = 20, 4, 1, 1

    apps_port = streams.apps_environment()
    ids = streams.setup_database()
    _jupyter_ready_user()
    stack = Stack(ids["agent_token"])
    proxy = streams.subprocess.Popen(
        [sys.executable, "-m", "proxy_app.serve", "-b", "127.0.0.1", "-p", str(apps_port)],
        cwd=streams.ROOT,
        # The manager's environment: its var dir holds the dev secret key links are signed with.
        env={
            **os.environ,
            "LOG_LEVEL": "WARNING",
            "BAI_VAR_DIR": str(stack.tmp / "var"),
            "BAI_CHANNEL_PREFIX": stack.prefix,
        },
        stdout=open(stack.tmp / "apps.log", "w"),  # noqa: SIM115
        stderr=streams.subprocess.STDOUT,
    )
    try:
        wait_listening(proxy, apps_port)
        token = ids["token"]
        session = launch(
            stack,
            token,
            {
                "image": "bai-kernel/python:2",
                "ports": [8080],
                "resources": {"cpu": 1, "mem": "1g"},
                "startup_command": SERVER,
            },
        )
        import docker

        container = docker.from_env().containers.get(session["kernels"][0]["container_id"])
        ip = next(
            n["IPAddress"]
            for n in container.attrs["NetworkSettings"]["Networks"].values()
            if n["IPAddress"]
        )
        opened = api(stack, token, f"sessions/{session['id']}/apps/port-8080/open/", {})
        link = urlsplit(opened["url"])
        conn = http.client.HTTPConnection("127.0.0.1", apps_port, timeout=30)
        conn.request("GET", f"{link.path}?{link.query}", headers={"Host": link.netloc})
        traded = conn.getresponse()
        body = traded.read()
        if traded.status != 302:
            raise SystemExit(f"the apps proxy refused the link: {traded.status} {body[:300]!r}")
        cookie = traded.getheader("Set-Cookie").split(";", 1)[0]
        conn.close()
        proxied = Target("proxy", apps_port, link.netloc, {"Cookie": cookie}, "127.0.0.1")
        direct = Target("direct", 8080, f"{ip}:8080", {}, ip)
        deadline = time.monotonic() + 60
        while True:  # the server writes its 100 MB file before it listens
            try:
                direct.get(direct.conn(), "/small.txt")
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

        results: dict[str, dict[str, float]] = {}
        for target in (direct, proxied):
            lat = latency(target, args.requests)
            results[target.name] = {
                "p50": pct(lat, 50),
                "p99": pct(lat, 99),
                "rps": throughput(target, args.clients, max(1, args.requests // args.clients)),
                "down": download(target),
                "up": upload(target, args.mb),
            }
        d, p = results["direct"], results["proxy"]
        print(f"apps proxy vs direct ({time.strftime('%Y-%m-%d')})")
        print(
            f"  conditions: {os.cpu_count()} cores, {platform.platform()}, Python "
            f"{platform.python_version()}; the proxy on uvicorn (proxy_app.serve), one Docker agent, "
            f"server: python http.server (threaded) in bai-kernel/python:2; "
            f"{args.requests} sequential GETs, {args.clients} concurrent clients, {args.mb} MB"
        )
        rows = [
            ("small GET p50 (ms)", "p50", False),
            ("small GET p99 (ms)", "p99", False),
            (f"requests/s ({args.clients} clients)", "rps", True),
            ("download (MB/s)", "down", True),
            ("upload (MB/s)", "up", True),
        ]
        print(f"  {'':28} {'direct':>10} {'proxy':>10} {'proxy/direct':>13}")
        for label, key, _ in rows:
            print(f"  {label:28} {d[key]:10.2f} {p[key]:10.2f} {p[key] / d[key]:13.2f}")
        print(f"  added to p50: {p['p50'] - d['p50']:.2f} ms (target <= 3 ms)")
        print(f"  requests/s through the proxy: {p['rps']:.0f} (target >= 500)")
        print(f"  bulk through the proxy: {p['down']:.0f} / {p['up']:.0f} MB/s (target >= 100)")
        if args.jupyter_runs:
            opened = jupyter_click(stack, token, args.jupyter_runs)
            clicks = sorted(o for o, _ in opened)
            kernels = sorted(k for _, k in opened)
            print(
                f"  Jupyter, {len(opened)} fresh sessions in Chromium: click -> file page ready "
                f"median {clicks[len(clicks) // 2]:.2f} s (max {clicks[-1]:.2f} s; target <= 3 s); "
                f"New notebook -> kernel idle median {kernels[len(kernels) // 2]:.2f} s"
            )
    finally:
        if proxy.poll() is None:
            proxy.terminate()
            proxy.wait(30)  # its shutdown grace (proxy_app.serve) and some
        stack.stop()


if __name__ == "__main__":
    main()
