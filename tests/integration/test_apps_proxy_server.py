"""The apps proxy's server (``python -m proxy_app.serve``, uvicorn with httptools) bounds a
request's head before any of it reaches the application: a target over 64 KiB, a head over
80 KiB or more than 500 headers are answered 431 with the reason, and the connection is
closed; a head within the bounds is served as usual. A head must also be whole within
``HEAD_TIMEOUT_S`` (a slowloris caller is answered 408 and closed), and a request with two
``Host`` headers is answered 400.

No persona: nothing here is anyone's; the requests name no app.
"""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from proxy_app import serve

pytestmark = pytest.mark.django_db(transaction=True)


def _exchange(port: int, head: bytes) -> tuple[bytes, bool]:
    """The proxy's whole answer to ``head``, and whether it then closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                return answer, True
            answer += chunk
        head_part, _, body = answer.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head_part.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += sock.recv(65536)
        sock.settimeout(5)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        return head_part + b"\r\n\r\n" + body, closed


def _request(target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [b"GET " + target + b" HTTP/1.1", b"Host: apps.localhost"]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def test_a_request_head_past_the_bounds_is_refused_with_431_and_one_within_is_served(
    live_system,
):
    port = live_system.start_apps().apps_port

    within = _request(
        b"/" + b"a" * (serve.TARGET_LIMIT - 200),
        [(b"x-pad-%d" % i, b"v" * 20) for i in range(serve.MAX_HEADERS - 2)],
    )
    answer, closed = _exchange(port, within)
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert b"No app is served at this address." in answer
    assert not closed  # kept alive, as any answer

    refused = {
        "request target over 64 KiB": _request(b"/" + b"a" * serve.TARGET_LIMIT, []),
        "more than 500 headers": _request(
            b"/", [(b"x-pad-%d" % i, b"v") for i in range(serve.MAX_HEADERS + 1)]
        ),
        "request head over 80 KiB": _request(
            b"/", [(b"x-pad-%d" % i, b"v" * 8000) for i in range(11)]
        ),
    }
    for why, head in refused.items():
        answer, closed = _exchange(port, head)
        assert answer.startswith(b"HTTP/1.1 431 "), (why, answer[:200])
        assert answer.endswith(f"Request refused: {why}.".encode()), (why, answer[-120:])
        assert closed, why


def test_a_request_with_two_host_headers_is_refused_with_400_and_a_reason(live_system):
    port = live_system.start_apps().apps_port
    for hosts in (
        [b"apps.localhost", b"apps.localhost"],
        [b"0123456789abcdef0123456789abcdef-jupyter.apps.localhost", b"localhost"],
    ):
        head = b"GET /serve/x/ HTTP/1.1\r\n" + b"".join(b"Host: " + h + b"\r\n" for h in hosts)
        answer, _ = _exchange(port, head + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert b"The request has more than one Host header." in answer, answer


def test_a_request_head_that_never_ends_is_answered_408_and_closed_in_time(live_system):
    """A slowloris caller (a byte of its head now and then, never its end) is answered 408,
    also on a kept-alive connection after a first request, and one that connects and says
    nothing is closed; each once its head had ``HEAD_TIMEOUT_S``."""
    port = live_system.start_apps().apps_port
    started = time.monotonic()
    silent, slow, kept = (socket.create_connection(("127.0.0.1", port), timeout=5) for _ in "abc")
    kept.sendall(b"GET / HTTP/1.1\r\nHost: apps.localhost\r\n\r\n")
    head = b"GET / HTTP/1.1\r\nHost: apps.localhost\r\nX-Pad: " + b"a" * 200
    answers = {silent: b"", slow: b"", kept: b""}
    closed_after: dict[socket.socket, float] = {}
    sent = 0
    with silent, slow, kept:
        for sock in answers:
            sock.setblocking(False)
        while len(closed_after) < 3 and time.monotonic() - started < serve.HEAD_TIMEOUT_S + 10:
            if sent < len(head):  # a byte of the same head on both, every half second
                for sock in (slow, kept):
                    with contextlib.suppress(OSError):
                        sock.send(head[sent : sent + 1])
                sent += 1
            for sock in set(answers) - set(closed_after):
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    answers[sock] += chunk
                else:
                    closed_after[sock] = time.monotonic() - started
            time.sleep(0.5)
    assert set(closed_after) == set(answers), "a connection stayed open"
    for sock in answers:
        assert serve.HEAD_TIMEOUT_S - 1 < closed_after[sock] < serve.HEAD_TIMEOUT_S + 5
    assert answers[silent] == b""  # an idle connection is closed as such, with no answer
    assert answers[kept].startswith(b"HTTP/1.1 404 "), answers[kept][:200]
    for sock in (slow, kept):
        refused = answers[sock][answers[sock].index(b"HTTP/1.1 408 ") :]
        assert refused.endswith(b"Request refused: its head took over 20 s."), refused
