"""The apps proxy's server (``python -m proxy_app.serve``, uvicorn with httptools) bounds a
request's head before any of it reaches the application: a target over 64 KiB, a head over
80 KiB or more than 500 headers are answered 431 with the reason, and the connection is
closed; a head within the bounds is served as usual.

No persona: nothing here is anyone's; the requests name no app.
"""

from __future__ import annotations

import socket

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
