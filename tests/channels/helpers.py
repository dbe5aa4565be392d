"""What the websocket tests share: a browser's socket on the real router, and a
running session with a fake agent at the gateway standing in for the node daemon."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import Client

from agent import protocol
from backendai_web.asgi import application
from scheduler_app import reconcile
from sessions_app import services
from sessions_app.models import Kernel, Session, Status

# A page of the site itself: the Origin names the host (and port) the socket is opened on.
ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")


async def http(method: str, path: str, token: str, body: bytes = b"") -> dict:
    """One API request through the ASGI application, as a token's client sends it:
    the ASGI response (``status``, ``headers``, ``body``)."""
    comm = HttpCommunicator(
        application,
        method,
        path,
        body=body,
        headers=[
            HOST,
            (b"authorization", f"Token {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    )
    response = await comm.get_response(timeout=30)
    await comm.wait(timeout=30)  # done: what the request does after its answer is done too
    return response


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def browser(path: str, user=None, *, token: str | None = None, origin=ORIGIN):
    headers = [HOST, origin] if origin else [HOST]
    if user is not None:
        headers.append((b"cookie", await sync_to_async(cookie_for)(user)))
    if token is not None:
        headers.append((b"authorization", f"Token {token}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def refused(comm: WebsocketCommunicator, code: int) -> str:
    """The socket is accepted, says why in JSON, then closes with ``code``."""
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_json_from(timeout=5)
    assert message["type"] == "error"
    assert message["code"] == code
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": code}
    return message["message"]


async def frame_of(comm: WebsocketCommunicator, kind: str, timeout: float = 5) -> dict:
    """The next frame of type ``kind`` (the agent also gets reconciliation chatter)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        frame = await comm.receive_json_from(timeout=max(0.05, deadline - loop.time()))
        if frame.get("type") == kind:
            return frame


async def no_frame_of(comm: WebsocketCommunicator, kind: str, timeout: float = 0.5) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await comm.receive_nothing(timeout=deadline - loop.time()):
            return
        frame = await comm.receive_json_from()
        assert frame.get("type") != kind, f"unexpected {kind}: {frame}"


def running_session(owner, image, size: int = 2) -> Session:
    session = services.session_create(
        owner=owner,
        spec={"image": image.reference, "cluster_size": size, "cluster_mode": "multi-node"},
    )
    for kernel in Kernel.objects.filter(session=session):
        reconcile.kernel_apply_report(
            kernel=kernel,
            report={"status": protocol.KR_RUNNING, "container_id": f"c-{kernel.cluster_hostname}"},
        )
    session.refresh_from_db()
    assert session.status == Status.RUNNING
    return session


def register_message(kernels=None, **changes) -> dict:
    """An agent's ``register`` frame, reporting ``kernels``."""
    return {
        "type": protocol.REGISTER,
        "protocol": protocol.PROTOCOL_VERSION,
        "hostname": "node-a",
        "backend": "docker",
        "slots": {"cpu": "8", "mem": str(16 * 2**30)},
        "labels": {},
        "version": "test",
        "kernels": kernels or [],
        **changes,
    }


async def registered_agent(token: str, kernels=None) -> WebsocketCommunicator:
    """An agent's gateway connection, registered and reporting ``kernels``."""
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Token {token}".encode())]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to(register_message(kernels))
    assert (await comm.receive_json_from(timeout=5))["type"] == protocol.REGISTERED
    return comm


async def active_since(session, since, timeout: float = 3) -> bool:
    """Whether the session's last activity moves past ``since`` within ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        fresh = await sync_to_async(Session.objects.get)(pk=session.pk)
        if fresh.last_activity_at > since:
            return True
        await asyncio.sleep(0.05)
    return False
