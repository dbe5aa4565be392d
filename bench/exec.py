"""Code execution through the manager against jupyter_client on the same kernel.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/exec.py [--runs 500] [--mb 64]

Starts daphne and a Docker agent on loopback (bench/streams.py's stack; a throwaway
database: it is migrated), launches a bai-kernel/python:2 session and measures, in the
same run and on the same ipykernel (the code runner's, in main1):

1. the round trip of ``1+1``, one run at a time: through REST (``POST .../execute/``,
   one kept-alive connection), through the websocket (``/ws/.../execute/``), and
   through jupyter_client itself: a python3 started by ``docker exec`` in main1 that
   connects to the runner's kernel with its connection file (execute_request until
   the reply and the kernel's idle status). Target: at most 5 ms added at p50.
2. streamed output: a run printing ``--mb`` MiB as fast as it can, read through the
   websocket and through REST ``continue`` requests (MB/s of record data, from the
   request to the final result). Target: >= 10 MB/s through the websocket.

Not part of the test run. Prints the figures and the conditions.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

import streams  # noqa: E402
from streams import Stack, launch, pct  # noqa: E402

# Runs in main1 as the kernel user: jupyter_client on the runner's kernel, timed there.
DIRECT = """
import glob, json, os, sys, time
from jupyter_client import BlockingKernelClient
path = max(glob.glob("/tmp/bai-runner-*/kernel-*.json"), key=os.path.getmtime)
client = BlockingKernelClient()
client.load_connection_file(path)
client.start_channels()
client.wait_for_ready(timeout=30)

def once():
    msg_id = client.execute("1+1")
    replied = idle = False
    while not (replied and idle):
        if not replied:
            reply = client.get_shell_msg(timeout=10)
            replied = reply["parent_header"].get("msg_id") == msg_id
        while not idle:
            msg = client.get_iopub_msg(timeout=10)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True

for _ in range(20):
    once()
times = []
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    once()
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""
FLOOD = (
    "import sys\nline = 'x' * 1023 + '\\n'\nblock = line * 64\n"
    "for _ in range({blocks}):\n    sys.stdout.write(block)\nsys.stdout.flush()"
)


class Rest:
    def __init__(self, stack: Stack, token: str, session_id: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=120)
        self.path = f"/api/v1/sessions/{session_id}/execute/"
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

    def ask(self, **body: object) -> dict:
        self.conn.request("POST", self.path, body=json.dumps(body), headers=self.headers)
        response = self.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise SystemExit(f"execute answered {response.status}: {answer}")
        return answer

    def run(self, code: str) -> list[dict]:
        answers = [self.ask(mode="query", code=code)]
        while answers[-1]["status"] == "continued":
            answers.append(self.ask(mode="continue", run_id=answers[-1]["run_id"]))
        return answers


def rest_round_trips(rest: Rest, runs: int) -> list[float]:
    for _ in range(20):
        rest.run("1+1")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        answer = rest.run("1+1")[-1]
        times.append(time.perf_counter() - start)
        assert answer["records"][0]["data"] == "2", answer
    return times


def rest_baseline(rest: Rest, session_id: str, runs: int) -> list[float]:
    """A plain authenticated GET of the session (no agent): Django's own per-request cost."""
    path = f"/api/v1/sessions/{session_id}/"
    times = []
    for i in range(runs + 20):
        start = time.perf_counter()
        rest.conn.request("GET", path, headers=rest.headers)
        response = rest.conn.getresponse()
        response.read()
        if i >= 20:
            times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    return times


def ws_connect(stack: Stack, token: str, session_id: str):  # noqa: ANN201
    from websockets.sync.client import connect

    return connect(
        f"ws://127.0.0.1:{stack.port}/ws/sessions/{session_id}/execute/",
        additional_headers={"Authorization": f"Token {token}"},
        max_size=None,
        compression=None,
    )


def ws_run(ws, code: str) -> tuple[int, dict]:  # noqa: ANN001
    """Run code over the websocket: bytes of record data received, and the result."""
    ws.send(json.dumps({"type": "run", "mode": "query", "code": code}))
    size = 0
    while True:
        message = json.loads(ws.recv(timeout=120))
        if message["type"] == "records":
            size += sum(len(r["data"]) for r in message["records"])
        elif message["type"] == "result":
            return size, message
        else:
            raise SystemExit(f"the websocket answered {message}")


def ws_round_trips(ws, runs: int) -> list[float]:  # noqa: ANN001
    for _ in range(20):
        ws_run(ws, "1+1")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        ws_run(ws, "1+1")
        times.append(time.perf_counter() - start)
    return times


def direct_round_trips(container_id: str, runs: int) -> list[float]:
    out = subprocess.run(
        ["docker", "exec", "-i", "-u", "1000", container_id, "python3", "-", str(runs)],
        input=DIRECT,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout)


def throughput(mb: int, read) -> float:  # noqa: ANN001
    """MB/s of a run that prints ``mb`` MiB, read by ``read(code) -> bytes received``."""
    code = FLOOD.format(blocks=mb * 16)
    start = time.perf_counter()
    size = read(code)
    elapsed = time.perf_counter() - start
    if size < mb << 20:
        raise SystemExit(f"only {size} of {mb << 20} bytes came back (the output limit?)")
    return size / 1e6 / elapsed


def row(label: str, times: list[float]) -> str:
    ms = [t * 1000 for t in times]
    return f"  {label:34} p50 {pct(ms, 50):7.2f} ms   p99 {pct(ms, 99):7.2f} ms   (n={len(ms)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--mb", type=int, default=64)
    args = parser.parse_args()
    # Room for the flood: the output limit applies per run (agents learn it at registration).
    os.environ["BAI_EXEC_OUTPUT_LIMIT"] = str(max(8, 2 * args.mb) << 20)
    os.environ.setdefault("BAI_EXEC_FLUSH", "1.5")
    ids = streams.setup_database()
    stack = Stack(ids["agent_token"])
    try:
        time.sleep(2)
        token = ids["token"]
        session = launch(
            stack, token, {"image": "bai-kernel/python:2", "resources": {"cpu": 1, "mem": "1g"}}
        )
        rest = Rest(stack, token, session["id"])
        rest.run("pass")  # starts the code runner (an ipykernel) in main1
        via_rest = rest_round_trips(rest, args.runs)
        baseline = rest_baseline(rest, session["id"], args.runs)
        with ws_connect(stack, token, session["id"]) as ws:
            via_ws = ws_round_trips(ws, args.runs)
            ws_mbs = throughput(args.mb, lambda code: ws_run(ws, code)[0])

        def rest_read(code: str) -> int:
            answers = rest.run(code)
            return sum(len(r["data"]) for a in answers for r in a["records"])

        rest_mbs = throughput(args.mb, rest_read)
        direct = direct_round_trips(session["kernels"][0]["container_id"], args.runs)
        report(args, direct, via_rest, via_ws, ws_mbs, rest_mbs)
        print(row("REST GET .../sessions/{id}/ (no agent)", baseline))
    finally:
        stack.stop()


def report(args, direct, via_rest, via_ws, ws_mbs, rest_mbs) -> None:  # noqa: ANN001
    from django.conf import settings

    print(f"code execution: 1+1 round trips and streamed output ({time.strftime('%Y-%m-%d')})")
    print(
        f"  conditions: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}; one daphne, one Docker agent, Redis "
        f"{settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}, PostgreSQL, "
        f"all on loopback; bai-kernel/python:2 (bookworm's ipykernel), 1 CPU, 1 GiB; "
        f"{args.runs} runs one at a time after 20 to warm up; flood {args.mb} MiB "
        f"in 1 KiB lines"
    )
    print(row("jupyter_client in main1 (direct)", direct))
    print(row("REST POST .../execute/", via_rest))
    print(row("websocket /ws/.../execute/", via_ws))
    for label, times in (("REST", via_rest), ("websocket", via_ws)):
        added = (pct(times, 50) - pct(direct, 50)) * 1000
        print(f"  added at p50 by {label}: {added:.2f} ms (target <= 5 ms)")
    print(f"  streamed output, websocket: {ws_mbs:.1f} MB/s (target >= 10 MB/s)")
    print(f"  streamed output, REST continue: {rest_mbs:.1f} MB/s")


if __name__ == "__main__":
    main()
