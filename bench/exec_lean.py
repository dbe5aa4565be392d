"""What a REST code run would cost served outside Django and DRF: a measurement for a
design question, not a path of the product.

    DATABASE_URL=postgres://…/bai_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/exec_lean.py [--runs 300]

The issue's target for a REST run is at most 5 ms added at p50 over jupyter_client.
``bench/exec.py`` shows that Django's and DRF's own request (a run refused before the
agent) already costs more than that here. This bench asks whether leaving Django and
DRF out would meet it: the stack's daphne serves ``application`` below, which answers
``POST /lean/v1/sessions/{id}/execute/`` itself and hands everything else to the
manager. The lean path keeps only what a run cannot do without: the token's check and
main1's facts in one query (in a thread: the ORM is synchronous), the body's check,
and the round trip to the agent on the event loop, as REST's does. It leaves out what
the product may not: the host check, the body limits, the security headers, the run's
history row and every error answer. So it is a lower bound for any such path.

Runs ``1+1`` by turns, 25 at a time, through jupyter_client in main1, REST, the lean
path and the websocket, and prints what each adds over jupyter_client.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

LEAN = re.compile(r"/lean/v1/sessions/([^/]+)/execute/")


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The manager's ASGI application, with the lean execute path in front."""
    from asgiref.sync import sync_to_async

    from backendai_web.asgi import application as manager
    from sessions_app import execution, tokens

    match = LEAN.fullmatch(scope["path"]) if scope["type"] == "http" else None
    if match is None:
        await manager(scope, receive, send)
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    session_id = match.group(1)
    key = dict(scope["headers"])[b"authorization"].split()[1]

    def checks() -> tuple[Any, Any]:
        facts = execution.MainFactsReader(session_id)
        user, _ = tokens.ExpiringTokenAuthentication(facts).authenticate_credentials(key)
        request, target = execution.execute_checks(
            user=user, session_id=session_id, body=json.loads(body), read=facts.read
        )
        execution._give_back_connections()
        return request, target

    request, target = await sync_to_async(checks, thread_sensitive=False)()
    command = execution.exec_command(target=target, request=request, stream=False)
    answer = await execution._ask_as(target, command)
    out = json.dumps({**execution.answer_fields(answer), "records": answer["records"]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def main() -> None:
    import exec as bexec  # bench/exec.py
    import streams
    from streams import Stack, launch, pct

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run, to see that it works (the test suite runs it so)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs = 4
    os.environ.setdefault("BAI_EXEC_FLUSH", "1.5")
    ids = streams.setup_database()
    stack = Stack(ids["agent_token"], app="exec_lean:application")
    try:
        time.sleep(2)
        token = ids["token"]
        session = launch(
            stack, token, {"image": "bai-kernel/python:2", "resources": {"cpu": 1, "mem": "1g"}}
        )
        rest = bexec.Rest(stack, token, session["id"])
        rest.run("pass")  # starts the code runner in main1
        lean = bexec.Rest(stack, token, session["id"])
        lean.path = lean.path.replace("/api/", "/lean/")
        direct = bexec.Direct(session["kernels"][0]["container_id"])
        with bexec.ws_connect(stack, token, session["id"]) as ws:
            times = bexec.round_trips(
                args.runs,
                {
                    "direct": direct.once,
                    "rest": lambda: bexec.rest_once(rest),
                    "lean": lambda: bexec.rest_once(lean),
                    "ws": lambda: bexec.ws_run(ws, "1+1") and None,
                },
            )
        direct.close()
        print(f"a REST run outside Django and DRF ({time.strftime('%Y-%m-%d %H:%M')})")
        print(
            f"  conditions: as bench/exec.py; {args.runs} runs of each path, by turns 25 at a time"
        )
        labels = {
            "direct": "jupyter_client in main1 (direct)",
            "rest": "REST POST .../execute/",
            "lean": "the lean path (this file)",
            "ws": "websocket /ws/.../execute/",
        }
        base = pct(times["direct"], 50)
        for name, label in labels.items():
            p50 = pct(times[name], 50)
            added = "" if name == "direct" else f"   added {(p50 - base) * 1000:+.2f} ms"
            print(f"  {label:34} p50 {p50 * 1000:7.2f} ms{added}")
        print("  target: at most 5 ms added at p50")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
