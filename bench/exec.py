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
   the reply and the kernel's idle status), timed in main1. Beside them, REST's floor:
   the same request refused (400, no mode) once its token and session are read,
   before the agent. A REST run is that plus the way to the kernel and back, so it
   cannot add less than the floor over jupyter_client. And under the floor, daphne
   itself: the same POST to a second daphne (``backendai_web.serve``) whose
   application answers at once (``bare_asgi.py``). The five take turns, 25 runs
   each, so they meet the machine as it is in the same minutes (its speed swings by
   up to 1.5x over minutes). Target: at most 5 ms added at p50.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

import streams  # noqa: E402
from streams import Stack, launch, pct  # noqa: E402

# Runs in main1 as the kernel user: jupyter_client on the runner's kernel. It times one
# round trip per line it reads (so the bench can take turns with the other paths), and
# prints each time.
DIRECT = """
import glob, os, sys, time
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

def drain():
    # The kernel sends every client what the other paths' runs printed: read it
    # before the clock starts.
    while True:
        try:
            client.get_iopub_msg(timeout=0.001)
        except Exception:
            return

print("ready", flush=True)
for line in sys.stdin:
    drain()
    start = time.perf_counter()
    once()
    print(time.perf_counter() - start, flush=True)
"""


class Direct:
    """jupyter_client in main1 (``DIRECT``), one round trip per ``once()``."""

    def __init__(self, container_id: str) -> None:
        self.proc = subprocess.Popen(
            ["docker", "exec", "-i", "-u", "1000", container_id, "python3", "-c", DIRECT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("jupyter_client did not reach the runner's kernel")

    def once(self) -> float:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


FLOOD = (
    "import sys\nline = 'x' * 1023 + '\\n'\nblock = line * 64\n"
    "for _ in range({blocks}):\n    sys.stdout.write(block)\nsys.stdout.flush()"
)


JSON = {"Content-Type": "application/json"}


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

    def refused(self) -> None:
        """A run the API refuses once the token and the session are read, before the
        agent: everything a REST run costs but the way to the kernel and back."""
        self.conn.request("POST", self.path, body=b'{"mode": "none"}', headers=self.headers)
        response = self.conn.getresponse()
        answer = response.read()
        if response.status != 400:
            raise SystemExit(f"a run of no mode answered {response.status}: {answer!r}")

    def run(self, code: str) -> list[dict]:
        answers = [self.ask(mode="query", code=code)]
        while answers[-1]["status"] == "continued":
            answers.append(self.ask(mode="continue", run_id=answers[-1]["run_id"]))
        return answers


def round_trips(runs: int, paths: dict, block: int = 25) -> dict[str, list[float]]:
    """``1+1`` through each path in turn, ``block`` runs at a time (the order turning
    each round), so every path meets the machine as it is in the same minutes; in
    blocks, so that a path's runs do not meet the others' output at the kernel on
    every run. Seconds per round trip, by path. A path is a callable that runs once
    and returns its own time (or None: timed here)."""
    names = list(paths)
    for _ in range(20):
        for name in names:
            paths[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(0, runs, block):
        turn = (i // block) % len(names)
        for name in names[turn:] + names[:turn]:
            for _ in range(min(block, runs - i)):
                start = time.perf_counter()
                own = paths[name]()
                times[name].append(own if own is not None else time.perf_counter() - start)
    return times


class Bare:
    """daphne as the manager runs it (``backendai_web.serve``, its access log to a file)
    serving ``bare_asgi``, which answers at once: the same POST, with nothing behind it."""

    def __init__(self, stack: Stack) -> None:
        port = streams.free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "backendai_web.serve", "-b", "127.0.0.1", "-p", str(port)]
            + ["bare_asgi:application"],
            cwd=HERE.parent,
            env=env,
            stdout=open(stack.tmp / "bare.log", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.once()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the bare daphne did not start") from None
                self.conn.close()
                time.sleep(0.1)

    def once(self) -> None:
        self.conn.request("POST", "/", body=b'{"mode": "none"}', headers=JSON)
        self.conn.getresponse().read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def rest_once(rest: Rest) -> None:
    answer = rest.run("1+1")[-1]
    assert answer["records"][-1]["data"] == "2", answer  # after IPython's warnings, if any


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
        elif message["type"] in ("history", "activity"):
            continue  # earlier runs' rows, or the session's activity, are written
        else:
            raise SystemExit(f"the websocket answered {message}")


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
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.mb = 5, 1
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
        direct = Direct(session["kernels"][0]["container_id"])
        bare = Bare(stack)
        cpu_before = stack.cpu()
        with ws_connect(stack, token, session["id"]) as ws:
            times = round_trips(
                args.runs,
                {
                    "direct": direct.once,
                    "rest": lambda: rest_once(rest),
                    "ws": lambda: ws_run(ws, "1+1") and None,
                    "floor": rest.refused,
                    "bare": bare.once,
                },
            )
            cpu_after = stack.cpu()
            ws_mbs = throughput(args.mb, lambda code: ws_run(ws, code)[0])
        direct.close()
        bare.close()
        baseline = rest_baseline(rest, session["id"], args.runs)

        def rest_read(code: str) -> int:
            answers = rest.run(code)
            return sum(len(r["data"]) for a in answers for r in a["records"])

        rest_mbs = throughput(args.mb, rest_read)
        report(args, times, ws_mbs, rest_mbs)
        print(row("REST GET .../sessions/{id}/ (no agent)", baseline))
        # The manager's daphne serves REST runs, websocket runs and refused runs (the
        # agent only the first two); the direct runs and daphne alone cost neither.
        served = {"daphne": 3 * (args.runs + 20), "agent": 2 * (args.runs + 20)}
        for part, what in (
            ("daphne", "REST, websocket or refused"),
            ("agent", "REST or websocket"),
        ):
            used = (cpu_after[part] - cpu_before[part]) / served[part] * 1000
            print(f"  {part} CPU per {what} run: {used:.2f} ms")
    finally:
        stack.stop()


def report(args, times, ws_mbs, rest_mbs) -> None:  # noqa: ANN001
    from django.conf import settings

    print(f"code execution: 1+1 round trips and streamed output ({time.strftime('%Y-%m-%d')})")
    print(
        f"  conditions: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}; one daphne, one Docker agent, Redis "
        f"{settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}, PostgreSQL, "
        f"all on loopback; bai-kernel/python:2 (bookworm's ipykernel), 1 CPU, 1 GiB; "
        f"{args.runs} runs of each path one at a time, the paths taking turns 25 runs "
        f"at a time, after 20 "
        f"to warm up; flood {args.mb} MiB "
        f"in 1 KiB lines"
    )
    direct, via_rest, via_ws, floor = (times[k] for k in ("direct", "rest", "ws", "floor"))
    print(row("jupyter_client in main1 (direct)", direct))
    print(row("REST POST .../execute/", via_rest))
    print(row("websocket /ws/.../execute/", via_ws))
    print(row("REST POST .../execute/ refused (400)", floor))
    print(row("daphne alone (bench/bare_asgi.py)", times["bare"]))
    for label, path in (("REST", via_rest), ("websocket", via_ws)):
        added = (pct(path, 50) - pct(direct, 50)) * 1000
        print(f"  added at p50 by {label}: {added:.2f} ms (target <= 5 ms)")
    # A REST run is a refused one plus the way to the kernel and back, which the
    # direct client's own round trip is part of: REST cannot add less than the floor.
    print(
        f"  REST's floor: a request refused before the agent (token, session, Django, DRF, "
        f"daphne) takes {pct(floor, 50) * 1000:.2f} ms at p50; the way to the kernel and "
        f"back adds {(pct(via_rest, 50) - pct(floor, 50) - pct(direct, 50)) * 1000:.2f} ms "
        f"over jupyter_client; daphne alone answers a POST in {pct(times['bare'], 50) * 1000:.2f} ms"
    )
    print(f"  streamed output, websocket: {ws_mbs:.1f} MB/s (target >= 10 MB/s)")
    print(f"  streamed output, REST continue: {rest_mbs:.1f} MB/s")


if __name__ == "__main__":
    main()
